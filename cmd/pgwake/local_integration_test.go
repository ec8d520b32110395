package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgwake/pgwake/internal/testenv"
)

// localHarness is a CLI harness whose daemon runs the local backend with no
// Docker engine reachable.
func localHarness(t *testing.T) *cliHarness {
	h := newHarness(t)
	env := h.env[:0:0]
	for _, kv := range h.env {
		if !strings.HasPrefix(kv, "PGWAKE_BACKEND=") && !strings.HasPrefix(kv, "DOCKER_HOST=") {
			env = append(env, kv)
		}
	}
	h.env = append(env, "PGWAKE_BACKEND=auto", "DOCKER_HOST=unix:///nonexistent/docker.sock")
	t.Cleanup(func() { stopLocalServers(h) })
	return h
}

// stopLocalServers stops any server a failed test left behind and removes
// the backend's data root (the state dir's local/, or /var/lib/pgwake/<id>
// when the tests run as root).
func stopLocalServers(h *cliHarness) {
	if inst := h.instanceOrEmpty(); inst != "" {
		testenv.StopLocalServers(filepath.Join("/var/lib/pgwake", inst))
	}
	testenv.StopLocalServers(filepath.Join(h.dir, "local"))
}

// TestIntegrationLocalBackendLifecycle: on a machine without Docker, auto
// picks the local backend; data survives sleep/wake and down/up; an
// ephemeral project is gone after down, a normal one is not.
func TestIntegrationLocalBackendLifecycle(t *testing.T) {
	t.Parallel()
	h := localHarness(t)
	_, r := h.up(t)
	if !strings.Contains(r.stderr, "backend local") {
		t.Errorf("up did not say it chose the local backend: %q", r.stderr)
	}
	log, _ := os.ReadFile(filepath.Join(h.dir, "pgwake.log"))
	if !strings.Contains(string(log), "no Docker engine answered") {
		t.Errorf("the log does not say why local was chosen:\n%s", log)
	}

	h.ok(t, "create", "keep")
	h.ok(t, "create", "temp", "--ephemeral")
	// Local servers cannot be frozen: tiered, which pauses first, is
	// refused in one line, as pause is.
	for _, mode := range []string{"pause", "tiered"} {
		if r := h.fail(t, "create", "frozen", "--sleep-mode", mode); !strings.Contains(r.stderr, "cannot pause") {
			t.Errorf("create --sleep-mode %s: %q", mode, r.stderr)
		}
	}
	h.writeNote(t, "keep", "before sleep")
	h.writeNote(t, "temp", "scratch")

	h.ok(t, "sleep", "keep")
	if p := h.mustProject(t, "keep"); p.State != "sleeping" || p.Backend != "local" {
		t.Fatalf("after sleep: %+v", p)
	}
	h.wantNotes(t, "keep", "before sleep") // wakes it
	h.writeNote(t, "keep", "before down")

	// pgwake env, parsed back by a real shell.
	sh := exec.Command("bash", "-c", `eval "$(`+h.bin+` env keep)" && psql -v ON_ERROR_STOP=1 -Atc "select current_database() || ' ' || count(*) from notes"`)
	sh.Env, sh.Dir = h.env, h.dir
	out, err := sh.CombinedOutput()
	if err != nil {
		t.Fatalf("eval pgwake env + psql: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "keep 2" {
		t.Fatalf("psql through eval'd env printed %q, want %q", got, "keep 2")
	}
	var vars map[string]string
	if err := json.Unmarshal([]byte(h.ok(t, "env", "keep", "--format", "json")), &vars); err != nil {
		t.Fatal(err)
	}
	gh := h.ok(t, "env", "keep", "--format", "github")
	for _, k := range []string{"DATABASE_URL", "PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE"} {
		if vars[k] == "" || !strings.Contains(gh, k+"="+vars[k]+"\n") {
			t.Errorf("%s: json %q, github output:\n%s", k, vars[k], gh)
		}
	}

	h.ok(t, "down")
	h.waitLockFree(t)
	h.up(t)
	h.wantNotes(t, "keep", "before sleep", "before down")
	if _, ok := h.project(t, "temp"); ok {
		t.Fatal("the ephemeral project survived down")
	}
	h.ok(t, "down", "--volumes")
	h.waitLockFree(t)
	h.up(t)
	if ps := h.projects(t); len(ps) != 0 {
		t.Fatalf("projects after down --volumes: %+v", ps)
	}
	h.ok(t, "down")
}

// waitLockFree waits until no daemon holds the state dir (down returns
// only then, so this is a check, not a wait in practice).
func (h *cliHarness) waitLockFree(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if err := h.admin().Healthy(t.Context()); err != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("daemon still answers after down")
}
