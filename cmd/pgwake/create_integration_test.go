package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgwake/pgwake/internal/admin"
)

// withEnv is h for commands run with extra environment variables (later
// ones override h's), as a user exporting them for one command would.
// Start daemons with h itself: this copy records none.
func (h *cliHarness) withEnv(kv ...string) *cliHarness {
	c := *h
	c.env = append(slices.Clip(h.env), kv...)
	return &c
}

// watchProjects reads the daemon's event stream until fn returns true for a
// project snapshot (it returns true) or d has passed (false). fn sees every
// snapshot, the first ones included: the stream starts with the state of
// every project.
func watchProjects(t *testing.T, events <-chan admin.StreamEvent, d time.Duration, fn func(admin.Project) bool) bool {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("the daemon's event stream ended")
			}
			if ev.Type == "project" && fn(ev.Project) {
				return true
			}
		case <-timer.C:
			return false
		}
	}
}

// TestIntegrationPin: a pinned project stays awake past its sleep_after
// while an unpinned one with the same settings, woken after it, is put to
// sleep by the idle sweep; unpinned, it sleeps too.
func TestIntegrationPin(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// No grace period: sleep_after alone decides when an idle project sleeps.
	h.env = append(h.env, "PGWAKE_GRACE_PERIOD=0s")
	h.up(t)
	const sleepAfter = 2 * time.Second
	h.ok(t, "create", "pinned", "--sleep-after", sleepAfter.String())
	h.ok(t, "create", "control", "--sleep-after", sleepAfter.String())

	r := h.run(t, "pin", "pinned")
	if r.code != 0 || r.stdout != "" || r.stderr != "pinned is pinned: it does not sleep on idle until pgwake unpin pinned (now sleeping)\n" {
		t.Errorf("pin pinned: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	if p := h.mustProject(t, "pinned"); !p.Pinned {
		t.Errorf("ls --json after pin: pinned %v, want true", p.Pinned)
	}
	if p := h.mustProject(t, "control"); p.Pinned {
		t.Error("ls --json: control is pinned too")
	}
	if r := h.fail(t, "pin", "nope"); r.code != 1 || !strings.Contains(r.stderr, `"nope"`) {
		t.Errorf("pin nope: exit %d stderr %q, want 1 naming the project", r.code, r.stderr)
	}
	if r := h.fail(t, "unpin"); r.code != 2 {
		t.Errorf("unpin without a name: exit %d, want 2", r.code)
	}

	// Wake pinned first: whenever the sweep finds control idle for
	// sleep_after, pinned has been idle for longer.
	h.ok(t, "wake", "pinned")
	h.ok(t, "wake", "control")
	if p := h.mustProject(t, "pinned"); !p.Pinned || p.SleepsInMS != 0 {
		t.Errorf("pinned running: pinned %v, sleeps in %d ms; want pinned and no countdown", p.Pinned, p.SleepsInMS)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events, err := h.admin().Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Every snapshot of pinned from here on must be running: the first
	// one (the stream starts with the current state) included.
	pinnedRuns := func(p admin.Project) {
		if p.Name == "pinned" && p.State != "running" {
			t.Errorf("pinned is %s while pinned (after %v idle); want running", p.State, time.Duration(p.IdleMS)*time.Millisecond)
		}
	}
	if !watchProjects(t, events, time.Minute, func(p admin.Project) bool {
		pinnedRuns(p)
		return p.Name == "control" && p.State == "sleeping"
	}) {
		t.Fatalf("control did not sleep within a minute of its sleep_after %v; the sweep does not run?", sleepAfter)
	}
	// The sweep that put control to sleep looked at pinned in the same
	// pass; give it two more passes (one a second) to do anything wrong.
	watchProjects(t, events, 2*time.Second+500*time.Millisecond, func(p admin.Project) bool {
		pinnedRuns(p)
		return false
	})
	p := h.mustProject(t, "pinned")
	if p.State != "running" || !p.Pinned || p.IdleMS < sleepAfter.Milliseconds() {
		t.Errorf("pinned after control slept: %s, pinned %v, idle %d ms; want running, pinned, idle past %v", p.State, p.Pinned, p.IdleMS, sleepAfter)
	}
	if c := h.mustContainer(t, "pinned"); !c.State.Running {
		t.Errorf("pinned's container is %s, want running", c.State.Status)
	}

	r = h.run(t, "unpin", "pinned")
	if r.code != 0 || r.stdout != "" || r.stderr != "pinned is unpinned: it sleeps after 2s idle (now running)\n" {
		t.Errorf("unpin pinned: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	if !watchProjects(t, events, time.Minute, func(p admin.Project) bool {
		return p.Name == "pinned" && p.State == "sleeping" && !p.Pinned
	}) {
		t.Fatalf("unpinned, pinned did not sleep within a minute; ls: %+v", h.mustProject(t, "pinned"))
	}
	if c := h.mustContainer(t, "pinned"); c.State.Running {
		t.Errorf("pinned's container is %s after it slept, want stopped", c.State.Status)
	}
	h.ok(t, "down")
}

// TestIntegrationCreateImagePullFails: with an image the engine lacks and
// cannot pull, create fails with one line that names the ways out, and
// leaves nothing behind; an image given only in the environment of the
// create command is the one it uses, and --image wins over it.
func TestIntegrationCreateImagePullFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.up(t)
	// .invalid never resolves (RFC 2606), registry or not.
	const ref = "registry.invalid/pgwake/postgres:none"
	for _, tt := range []struct {
		name string
		h    *cliHarness
		args []string
	}{
		{name: "--image", h: h, args: []string{"create", "x", "--image", ref}},
		{name: "PGWAKE_IMAGE for create only", h: h.withEnv("PGWAKE_IMAGE=" + ref), args: []string{"create", "x"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.h.fail(t, tt.args...)
			if r.code != 1 || r.stdout != "" {
				t.Errorf("exit %d stdout %q, want 1 and nothing", r.code, r.stdout)
			}
			for _, s := range []string{`image "` + ref + `" is not on this Docker engine and cannot be pulled`, "no such host",
				"--image", "PGWAKE_IMAGE", "--backend local", "testdata/postgres-image/build.sh"} {
				if !strings.Contains(r.stderr, s) {
					t.Errorf("error lacks %q: %s", s, r.stderr)
				}
			}
			if _, ok := h.project(t, "x"); ok {
				t.Error("the failed create left project x")
			}
			if cs, vs := h.instanceObjects(t); cs != 0 || vs != 0 {
				t.Errorf("the failed create left %d containers and %d volumes of this instance", cs, vs)
			}
		})
	}
	// The failures left nothing in the way; the create flag wins over the
	// variable.
	h.withEnv("PGWAKE_IMAGE="+ref).ok(t, "create", "x", "--image", h.image)
	if p := h.mustProject(t, "x"); p.Image != h.image {
		t.Errorf("x has image %q, want %q", p.Image, h.image)
	}
	h.ok(t, "down", "--volumes")
}

// TestIntegrationCreateConfig: the settings a user gives create in its
// environment or ./pgwake.yaml apply, though the daemon started with
// others; create prints the URL without its password unless asked; env
// --format github >> "$GITHUB_ENV" under GitHub Actions leaves a file the
// runner accepts and the masks on stderr.
func TestIntegrationCreateConfig(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.up(t)

	r := h.withEnv("PGWAKE_SLEEP_AFTER=7m", "PGWAKE_SLEEP_MODE=pause", "PGWAKE_EPHEMERAL=true").run(t, "create", "envd")
	if r.code != 0 {
		t.Fatalf("create envd: exit %d stderr %q", r.code, r.stderr)
	}
	if p := h.mustProject(t, "envd"); p.SleepAfterMS != (7*time.Minute).Milliseconds() || p.SleepMode != "pause" || !p.Ephemeral {
		t.Errorf("envd: sleep_after %d ms, mode %s, ephemeral %v; want 7m, pause, ephemeral (from its environment)", p.SleepAfterMS, p.SleepMode, p.Ephemeral)
	}
	if !strings.Contains(r.stderr, "created ephemeral project envd") || !strings.Contains(r.stderr, "initdb") {
		t.Errorf("create stderr: %q", r.stderr)
	}

	// ./pgwake.yaml where create runs (the harness runs pgwake in its
	// state dir); the daemon did not have it at start-up.
	if err := os.WriteFile(filepath.Join(h.dir, "pgwake.yaml"), []byte("sleep_after: 3m\nsleep_mode: pause\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	created := h.ok(t, "create", "filed")
	if p := h.mustProject(t, "filed"); p.SleepAfterMS != (3*time.Minute).Milliseconds() || p.SleepMode != "pause" || p.Ephemeral {
		t.Errorf("filed: sleep_after %d ms, mode %s, ephemeral %v; want 3m, pause (from ./pgwake.yaml), not ephemeral", p.SleepAfterMS, p.SleepMode, p.Ephemeral)
	}
	if err := os.Remove(filepath.Join(h.dir, "pgwake.yaml")); err != nil {
		t.Fatal(err)
	}

	// The URL create prints has no password; with it, it connects.
	full := strings.TrimSpace(h.ok(t, "url", "filed"))
	vars := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(h.ok(t, "env", "filed", "--format", "dotenv")), "\n") {
		k, v, _ := strings.Cut(line, "=")
		vars[k] = strings.Trim(v, `"`)
	}
	pw := vars["PGPASSWORD"]
	if pw == "" || !strings.Contains(full, ":"+pw+"@") {
		t.Fatalf("url %q, PGPASSWORD %q: want the password in the URL", full, pw)
	}
	if want := strings.Replace(full, ":"+pw+"@", "@", 1) + "\n"; created != want {
		t.Errorf("create printed %q, want %q", created, want)
	}
	shown := h.ok(t, "create", "shown", "--show-password")
	if url := h.ok(t, "url", "shown"); shown != url {
		t.Errorf("create --show-password printed %q, want what url prints: %q", shown, url)
	}
	ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, strings.TrimSpace(shown))
	if err != nil {
		t.Fatalf("connect with create --show-password's URL: %v", err)
	}
	conn.Close(ctx)

	// As a GitHub Actions step runs it.
	ghEnv := filepath.Join(t.TempDir(), "github_env")
	var stdout, stderr strings.Builder
	sh := exec.Command("bash", "-c", h.bin+` env filed --format github >> "$GITHUB_ENV"`)
	sh.Env, sh.Dir = append(slices.Clip(h.env), "GITHUB_ACTIONS=true", "GITHUB_ENV="+ghEnv), h.dir
	sh.Stdout, sh.Stderr = &stdout, &stderr
	if err := sh.Run(); err != nil || stdout.Len() != 0 {
		t.Fatalf("env --format github >> $GITHUB_ENV: %v, stdout %q\n%s", err, stdout.String(), stderr.String())
	}
	data, err := os.ReadFile(ghEnv)
	if err != nil {
		t.Fatal(err)
	}
	// The runner takes NAME=value or NAME<<DELIMITER lines and fails the
	// step on any other.
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if eq := strings.Index(line, "="); eq <= 0 || strings.Contains(line[:eq], "<<") {
			t.Errorf("$GITHUB_ENV line %q is not NAME=value", line)
		}
	}
	if !strings.Contains(string(data), "PGPASSWORD="+pw+"\n") || !strings.Contains(string(data), "DATABASE_URL="+full+"\n") {
		t.Errorf("$GITHUB_ENV lacks the variables:\n%s", data)
	}
	// stderr holds the masks (the runner consumes them) and nothing else.
	var masks []string
	for _, line := range strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n") {
		if m, ok := strings.CutPrefix(line, "::add-mask::"); ok {
			masks = append(masks, unescapeCommandData(m))
		} else if line != "" {
			t.Errorf("stderr line %q: want only masks", line)
		}
	}
	if !slices.Contains(masks, pw) {
		t.Errorf("masks %q do not include the password", masks)
	}
	h.ok(t, "down", "--volumes")
}
