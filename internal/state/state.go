// Package state keeps pgwake's durable state: the projects and their
// generated passwords, in one JSON file (mode 0600) in the state directory.
package state

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"time"
)

// Project is a project as the user created it.
type Project struct {
	Name       string        `json:"name"`
	Image      string        `json:"image"`
	User       string        `json:"user"`
	Password   string        `json:"password"`
	Database   string        `json:"database"`
	SleepAfter time.Duration `json:"sleep_after"`
	SleepMode  string        `json:"sleep_mode"`
	Pinned     bool          `json:"pinned,omitempty"`
	// Ephemeral projects are removed, data and all, when pgwake goes down.
	Ephemeral bool `json:"ephemeral,omitempty"`
	// Port, if set, is a listen port of the project's own (port routing).
	Port      int       `json:"port,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

type file struct {
	// Instance scopes container and volume names to this state directory.
	Instance string     `json:"instance"`
	Projects []*Project `json:"projects"`
	// Kept holds the credentials of projects removed without their data,
	// so creating one again under the same name can reach that data.
	Kept map[string]Credentials `json:"kept,omitempty"`
}

// Credentials are what a kept data directory was initialised with.
type Credentials struct {
	User     string `json:"user"`
	Password string `json:"password"`
	Database string `json:"database"`
}

// Store is the state file. It is safe for concurrent use.
type Store struct {
	path string
	mu   sync.Mutex
	f    file
}

// Errors callers branch on.
var (
	ErrExists   = errors.New("project already exists")
	ErrNotFound = errors.New("no such project")
)

var validName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,39}$`)

// ValidateName checks a project name: it becomes a database name in
// connection strings and part of container names, so it is kept simple.
func ValidateName(name string) error {
	if !validName.MatchString(name) {
		return fmt.Errorf("invalid project name %q: use 1-40 lowercase letters, digits, - or _, starting with a letter", name)
	}
	return nil
}

// Open reads dir/state.json, creating dir (0700) and the file if missing.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	s := &Store{path: filepath.Join(dir, "state.json")}
	data, err := os.ReadFile(s.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		s.f.Instance = randomHex(4)
		if err := s.saveLocked(); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, fmt.Errorf("read state: %w", err)
	default:
		if err := json.Unmarshal(data, &s.f); err != nil {
			return nil, fmt.Errorf("state file %s is corrupt: %w", s.path, err)
		}
		if s.f.Instance == "" {
			return nil, fmt.Errorf("state file %s has no instance id", s.path)
		}
	}
	return s, nil
}

// Instance is this state directory's id.
func (s *Store) Instance() string { return s.f.Instance }

// Projects returns copies of all projects, sorted by name.
func (s *Store) Projects() []Project {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Project, 0, len(s.f.Projects))
	for _, p := range s.f.Projects {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Get returns one project.
func (s *Store) Get(name string) (Project, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.f.Projects {
		if p.Name == name {
			return *p, nil
		}
	}
	return Project{}, fmt.Errorf("%w: %q", ErrNotFound, name)
}

// Add stores a new project, generating its password if empty.
func (s *Store) Add(p Project) (Project, error) {
	if err := ValidateName(p.Name); err != nil {
		return Project{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.f.Projects {
		if q.Name == p.Name {
			return Project{}, fmt.Errorf("%w: %q", ErrExists, p.Name)
		}
	}
	if kept, ok := s.f.Kept[p.Name]; ok && p.Password == "" {
		p.User, p.Password, p.Database = kept.User, kept.Password, kept.Database
	}
	if p.Password == "" {
		p.Password = randomHex(16)
	}
	if p.CreatedAt.IsZero() {
		p.CreatedAt = time.Now().UTC().Truncate(time.Second)
	}
	s.f.Projects = append(s.f.Projects, &p)
	kept, hadKept := s.f.Kept[p.Name]
	delete(s.f.Kept, p.Name)
	if err := s.saveLocked(); err != nil {
		if hadKept {
			s.f.Kept[p.Name] = kept
		}
		s.f.Projects = s.f.Projects[:len(s.f.Projects)-1]
		return Project{}, err
	}
	return p, nil
}

// Update applies fn to a stored project and saves.
func (s *Store) Update(name string, fn func(*Project)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.f.Projects {
		if p.Name == name {
			fn(p)
			return s.saveLocked()
		}
	}
	return fmt.Errorf("%w: %q", ErrNotFound, name)
}

// Remove deletes a project. With keepData its credentials are kept for a
// project created again under the same name; otherwise any kept ones go.
func (s *Store) Remove(name string, keepData bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range s.f.Projects {
		if p.Name == name {
			s.f.Projects = append(s.f.Projects[:i], s.f.Projects[i+1:]...)
			if keepData {
				if s.f.Kept == nil {
					s.f.Kept = map[string]Credentials{}
				}
				s.f.Kept[name] = Credentials{User: p.User, Password: p.Password, Database: p.Database}
			} else {
				delete(s.f.Kept, name)
			}
			return s.saveLocked()
		}
	}
	return fmt.Errorf("%w: %q", ErrNotFound, name)
}

// saveLocked writes the file atomically (temp file + rename), mode 0600:
// it holds passwords.
func (s *Store) saveLocked() error {
	data, err := json.MarshalIndent(&s.f, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.path), ".state-*.json")
	if err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("write state: %w", err)
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("write state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return hex.EncodeToString(b)
}
