package state

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestLegacyFileGetsBackends: a state file written before backends were
// stored loads with empty backends; AssignBackends fills them (projects
// and kept data) and the next Open reads them back.
func TestLegacyFileGetsBackends(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	legacy := `{
  "instance": "abcd1234",
  "projects": [
    {"name": "app", "image": "postgres:17", "user": "postgres", "password": "pw1", "database": "app", "sleep_after": 0, "sleep_mode": "stop", "created_at": "2026-01-01T00:00:00Z"},
    {"name": "web", "image": "postgres:17", "user": "postgres", "password": "pw2", "database": "web", "sleep_after": 0, "sleep_mode": "stop", "created_at": "2026-01-01T00:00:00Z"}
  ],
  "kept": {"old": {"user": "postgres", "password": "pw3", "database": "old"}}
}
`
	if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte(legacy), 0o600); err != nil {
		t.Fatal(err)
	}
	s := open(t, dir)
	for _, p := range s.Projects() {
		if p.Backend != "" {
			t.Fatalf("legacy project %s has backend %q", p.Name, p.Backend)
		}
	}
	decide := map[string]string{"app": "docker", "web": "local", "old": "local"}
	if err := s.AssignBackends(func(name string) string { return decide[name] }); err != nil {
		t.Fatal(err)
	}
	// Already assigned: never decided again.
	if err := s.AssignBackends(func(name string) string { t.Errorf("decided %s twice", name); return "x" }); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	for _, p := range s.Projects() {
		if p.Backend != decide[p.Name] {
			t.Errorf("%s: backend %q after reopening, want %q", p.Name, p.Backend, decide[p.Name])
		}
	}
	if k := s.Kept()["old"]; k.Backend != "local" || k.Password != "pw3" {
		t.Errorf("kept old: %+v, want backend local, password pw3", k)
	}
}

// TestKeptDataIsReusedOnItsBackendOnly: a project created again takes the
// credentials of its kept data, and says so, only on the backend that keeps
// that data.
func TestKeptDataIsReusedOnItsBackendOnly(t *testing.T) {
	t.Parallel()
	s := open(t, t.TempDir())
	p, reused, err := s.Add(Project{Name: "app", User: "postgres", Database: "app", Backend: "docker"})
	if err != nil || reused {
		t.Fatalf("first add: reused %v, %v", reused, err)
	}
	if err := s.Remove("app", true); err != nil {
		t.Fatal(err)
	}
	if k := s.Kept()["app"]; k.Backend != "docker" || k.Password != p.Password {
		t.Fatalf("kept after rm: %+v", k)
	}

	q, reused, err := s.Add(Project{Name: "app", User: "postgres", Database: "app", Backend: "local"})
	if err != nil || reused || q.Password == p.Password {
		t.Fatalf("add on another backend: reused %v, same password %v, %v; want fresh credentials", reused, q.Password == p.Password, err)
	}
	if _, ok := s.Kept()["app"]; !ok {
		t.Fatal("the docker data's credentials were dropped by a create on local")
	}
	if err := s.Remove("app", false); err != nil {
		t.Fatal(err)
	}
	// Remove without keeping data forgets kept credentials of that name.
	if _, ok := s.Kept()["app"]; ok {
		t.Fatal("rm --volumes kept credentials")
	}
}

func TestAddReusesKeptCredentials(t *testing.T) {
	t.Parallel()
	s := open(t, t.TempDir())
	p, _, err := s.Add(Project{Name: "app", User: "postgres", Database: "app", Backend: "docker"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("app", true); err != nil {
		t.Fatal(err)
	}
	q, reused, err := s.Add(Project{Name: "app", User: "postgres", Database: "app", Backend: "docker"})
	if err != nil || !reused || q.Password != p.Password {
		t.Fatalf("re-add: reused %v, same password %v, %v", reused, q.Password == p.Password, err)
	}
	if _, ok := s.Kept()["app"]; ok {
		t.Error("kept credentials still listed once reused")
	}
	if _, _, err := s.Add(Project{Name: "app", Backend: "docker"}); !errors.Is(err, ErrExists) {
		t.Errorf("add twice: %v, want ErrExists", err)
	}
}

func TestForgetKept(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	for name, be := range map[string]string{"a": "docker", "b": "local", "c": "docker"} {
		if _, _, err := s.Add(Project{Name: name, Backend: be}); err != nil {
			t.Fatal(err)
		}
		if err := s.Remove(name, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.ForgetKept("docker"); err != nil {
		t.Fatal(err)
	}
	kept := open(t, dir).Kept()
	if len(kept) != 1 || kept["b"].Backend != "local" {
		t.Errorf("kept after forgetting docker's: %+v, want b on local alone", kept)
	}
}
