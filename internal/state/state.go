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
	Name     string `json:"name"`
	Image    string `json:"image"`
	User     string `json:"user"`
	Password string `json:"password"`
	// PendingPassword is set while `pgwake passwd` rotates the password:
	// the server may already have it. pgwake's own login to the server
	// falls back to it, so a rotation cut short (pgwake killed between
	// the server's change and this file's) still logs in.
	PendingPassword string        `json:"pending_password,omitempty"`
	Database        string        `json:"database"`
	SleepAfter      time.Duration `json:"sleep_after"`
	SleepMode       string        `json:"sleep_mode"`
	// StopAfter is, for sleep mode tiered, how long the server stays
	// paused before it is stopped.
	StopAfter time.Duration `json:"stop_after,omitempty"`
	Pinned    bool          `json:"pinned,omitempty"`
	// Ephemeral projects are removed, data and all, when pgwake goes down.
	Ephemeral bool `json:"ephemeral,omitempty"`
	// Port is the project's own listen port (port routing): every
	// database of its server is reachable there. Zero only in state files
	// written before every project had one, until the daemon assigns one,
	// or with NoPort: the project is reached on the shared port alone.
	Port   int  `json:"port,omitempty"`
	NoPort bool `json:"no_port,omitempty"`
	// Backend is the runtime the project's server and data live on
	// ("docker", "local"). It never changes: a project is served from
	// there or not at all. Empty only in state files written before it
	// was stored, until the daemon assigns it (see AssignBackends).
	Backend   string    `json:"backend"`
	CreatedAt time.Time `json:"created_at"`
	// Adopted names the object the project was adopted from
	// ("statefulset/db"): its runtime's owner made it, pgwake only sleeps
	// and wakes it, and removing the project only forgets it.
	Adopted string `json:"adopted,omitempty"`
	// Parent is the project this one was branched from, and BranchedAt
	// when its data was copied (the copy's consistent point is then or
	// within the copy's few seconds).
	Parent     string    `json:"parent,omitempty"`
	BranchedAt time.Time `json:"branched_at,omitzero"`
	// Pending is set while a create that copies data (a branch) has not
	// finished: a pgwake that finds it at start-up was killed meanwhile,
	// and removes the half-made project rather than serve it.
	Pending bool `json:"pending,omitempty"`
	// Settings are server settings (lower-case GUC name -> value) applied
	// at every start of its server.
	Settings map[string]string `json:"settings,omitempty"`
	// Init are the project's init scripts, in order: absolute paths of
	// pgwake's own copies, taken at create (the originals may change or
	// go), that run once at the first start of new data.
	Init []string `json:"init,omitempty"`
	// InitError is the recorded failure of the init scripts at the first
	// start (the data is not served; see backend.InitError).
	InitError string `json:"init_error,omitempty"`
	// SnapshotBytes are the sizes of the project's snapshots (by label)
	// as measured when each was taken: a snapshot never changes, and a
	// runtime cannot always say it later (Docker's disk usage report is
	// slow and refused while another one runs).
	SnapshotBytes map[string]int64 `json:"snapshot_bytes,omitempty"`
}

type file struct {
	// Instance scopes container and volume names to this state directory.
	Instance string     `json:"instance"`
	Projects []*Project `json:"projects"`
	// Kept holds the credentials of projects removed without their data,
	// so creating one again under the same name can reach that data.
	Kept map[string]Credentials `json:"kept,omitempty"`
}

// Credentials are what a kept data directory was initialised with, and
// the backend that keeps it.
type Credentials struct {
	User     string `json:"user"`
	Password string `json:"password"`
	Database string `json:"database"`
	Backend  string `json:"backend,omitempty"`
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

// Add stores a new project, generating its password if empty. When the
// data of a project of the same name was kept (Remove with keepData) on
// the same backend, the new project takes its credentials so it can reach
// that data, and reused reports it: that data existed before this project.
func (s *Store) Add(p Project) (_ Project, reused bool, err error) {
	if err := ValidateName(p.Name); err != nil {
		return Project{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.f.Projects {
		if q.Name == p.Name {
			return Project{}, false, fmt.Errorf("%w: %q", ErrExists, p.Name)
		}
	}
	kept, hadKept := s.f.Kept[p.Name]
	// Data kept on another backend stays kept: this project cannot reach
	// it, and a later project on that backend still can.
	hadKept = hadKept && (kept.Backend == "" || kept.Backend == p.Backend)
	if hadKept && p.Password == "" {
		p.User, p.Password, p.Database = kept.User, kept.Password, kept.Database
		reused = true
	}
	if p.Password == "" && p.Adopted == "" {
		// An adopted project's password is its owner's: without one
		// pgwake passes authentication through.
		p.Password = randomHex(16)
	}
	if p.CreatedAt.IsZero() {
		p.CreatedAt = time.Now().UTC().Truncate(time.Second)
	}
	s.f.Projects = append(s.f.Projects, &p)
	if hadKept {
		delete(s.f.Kept, p.Name)
	}
	if err := s.saveLocked(); err != nil {
		if hadKept {
			s.f.Kept[p.Name] = kept
		}
		s.f.Projects = s.f.Projects[:len(s.f.Projects)-1]
		return Project{}, false, err
	}
	return p, reused, nil
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
				s.f.Kept[name] = Credentials{User: p.User, Password: p.Password, Database: p.Database, Backend: p.Backend}
			} else {
				delete(s.f.Kept, name)
			}
			return s.saveLocked()
		}
	}
	return fmt.Errorf("%w: %q", ErrNotFound, name)
}

// Kept returns a copy of the credentials of projects removed without
// their data, by project name.
func (s *Store) Kept() map[string]Credentials {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Credentials, len(s.f.Kept))
	for name, c := range s.f.Kept {
		out[name] = c
	}
	return out
}

// ForgetKept drops the kept credentials of data on backendName (after
// that backend removed everything of this instance).
func (s *Store) ForgetKept(backendName string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	for name, c := range s.f.Kept {
		if c.Backend == backendName {
			delete(s.f.Kept, name)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return s.saveLocked()
}

// AssignBackends gives every project and kept data without a backend (a
// state file written before backends were stored) the one decide names
// for it, and saves once if anything changed.
func (s *Store) AssignBackends(decide func(project string) string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	for _, p := range s.f.Projects {
		if p.Backend == "" {
			p.Backend = decide(p.Name)
			changed = true
		}
	}
	for name, c := range s.f.Kept {
		if c.Backend == "" {
			c.Backend = decide(name)
			s.f.Kept[name] = c
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return s.saveLocked()
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

// NewPassword is a fresh random password, as projects are created with.
func NewPassword() string { return randomHex(16) }

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return hex.EncodeToString(b)
}
