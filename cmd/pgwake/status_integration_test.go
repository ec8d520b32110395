package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgwake/pgwake/internal/admin"
)

// This file tests `pgwake status`. TestIntegrationStatusTmux runs the
// dashboard in a real terminal (a detached tmux session) against a real
// daemon and Docker. The two short tests before it need neither: they serve
// the admin API from a scripted admin.Service on a unix socket, to check
// what status prints when stdout is not a terminal.

// statusService is a scripted daemon: it lists ps. Any other call panics
// (through the nil embedded interface), which fails the test loudly.
type statusService struct {
	admin.Service
	ps []admin.Project
}

func (s statusService) Projects() []admin.Project { return s.ps }

// serveAdmin serves svc's admin API where the CLI will look for it, and
// returns the environment that points the CLI there.
func serveAdmin(t *testing.T, svc admin.Service) []string {
	t.Helper()
	dir, env := stateEnv(t)
	if svc == nil {
		return env
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "pgwake.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: admin.Handler(svc), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return env
}

// runStatusCLI runs the CLI in process (stdout a buffer, not a terminal)
// and returns its stdout, logging any stderr.
func runStatusCLI(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	r := runCLI(t, env, args...)
	if r.stderr != "" {
		t.Logf("pgwake %s: stderr: %s", strings.Join(args, " "), r.stderr)
	}
	return r.stdout, r.err
}

func TestStatusPlainOutput(t *testing.T) {
	t.Parallel()
	app := admin.Project{
		Name: "app", State: "running", Active: 2, Queued: 1, Pinned: true, Wakes: 3,
		LastWakeMS: 812.5, P95WakeMS: 1420, SleepAfterMS: 600_000, Image: "postgres:17", Backend: "docker",
		RecentWakesMS: []float64{1420, 812.5}, URL: "postgres://postgres:pw@127.0.0.1:6500/app", Port: 6500,
	}
	idle := admin.Project{Name: "idle", State: "running", SleepAfterMS: 600_000, SleepsInMS: 61_500, Image: "postgres:17", Backend: "local",
		Port: 6501, PortError: "port 6501 is in use by another program"}
	broken := admin.Project{Name: "broken", State: "error", LastError: "no such image", RetryAt: time.Now().Add(time.Minute), Image: "nope:1"}
	fresh := admin.Project{Name: "fresh", State: "running", Active: 1, Wakes: 1, FirstStartMS: 13105, Image: "postgres:17", Backend: "docker", Port: 6502}
	ps := []admin.Project{app, broken, fresh, idle}
	env := serveAdmin(t, statusService{ps: ps})

	ls, err := runStatusCLI(t, env, "ls")
	if err != nil {
		t.Fatalf("ls: %v", err)
	}
	want := strings.Join([]string{
		"NAME    STATE                PORT         CONNS  QUEUED  WAKES  LAST WAKE              P95 WAKE  SLEEPS IN  BACKEND  IMAGE",
		"app     running (pinned)     6500         2      1       3      813ms                  1.42s     -          docker   postgres:17",
		"broken  error (backing off)  -            0      0       0      -                      -         -          -        nope:1",
		"fresh   running              6502         1      0       1      13.105s (first start)  -         -          docker   postgres:17",
		"idle    running              6501 (busy)  0      0       0      -                      -         1m2s       local    postgres:17",
		"",
	}, "\n")
	if ls != want {
		t.Errorf("ls printed:\n%s\nwant:\n%s", ls, want)
	}
	// status prints the very same table with --once, and when stdout is
	// not a terminal (here a buffer) without it.
	for _, args := range [][]string{{"status", "--once"}, {"status"}} {
		out, err := runStatusCLI(t, env, args...)
		if err != nil || out != ls {
			t.Errorf("pgwake %s: err %v, printed:\n%s\nwant what ls printed:\n%s", strings.Join(args, " "), err, out, ls)
		}
	}

	lsJSON, err := runStatusCLI(t, env, "ls", "--json")
	if err != nil {
		t.Fatalf("ls --json: %v", err)
	}
	stJSON, err := runStatusCLI(t, env, "status", "--json")
	if err != nil || stJSON != lsJSON {
		t.Errorf("status --json: err %v, printed:\n%s\nwant what ls --json printed:\n%s", err, stJSON, lsJSON)
	}
	var got []admin.Project
	if err := json.Unmarshal([]byte(stJSON), &got); err != nil {
		t.Fatalf("status --json: %v\n%s", err, stJSON)
	}
	if len(got) != len(ps) || got[0].Name != "app" || got[0].Queued != 1 || !slices.Equal(got[0].RecentWakesMS, app.RecentWakesMS) {
		t.Errorf("status --json decoded to %+v", got)
	}
}

func TestStatusNotRunning(t *testing.T) {
	t.Parallel()
	env := serveAdmin(t, nil)
	for _, args := range [][]string{{"status"}, {"status", "--once"}, {"status", "--json"}} {
		out, err := runStatusCLI(t, env, args...)
		if !errors.Is(err, admin.ErrNotRunning) || out != "" {
			t.Errorf("pgwake %s with no daemon: err %v, stdout %q; want ErrNotRunning and nothing printed",
				strings.Join(args, " "), err, out)
		}
	}
}

// statusTmux is one run of the dashboard in tmux against a real daemon; the
// daemon, its containers and the state dir belong to the CLI harness.
type statusTmux struct {
	*cliHarness
	socket string // tmux -S: a tmux server of our own, its socket in the state dir
}

// TestIntegrationStatusTmux drives `pgwake status` as a user would: in a
// terminal, with keys, reading the screen, against a real daemon.
func TestIntegrationStatusTmux(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("tmux"); err != nil && !testing.Short() {
		t.Fatal("tmux is not installed (scripts/setup installs it)")
	}
	h := newHarness(t) // skips under -short
	st := &statusTmux{cliHarness: h, socket: filepath.Join(h.dir, "tmux.sock")}
	// $TMUX would point tmux at the user's own server.
	h.env = slices.DeleteFunc(h.env, func(kv string) bool { return strings.HasPrefix(kv, "TMUX") })
	h.env = append(h.env, "TERM=xterm-256color")
	// Registered after the harness's, so it runs first: the tmux server
	// goes before the daemon.
	t.Cleanup(st.cleanup)

	h.up(t)
	h.ok(t, "create", "app")

	// The shell line reports how status exited and keeps the pane open.
	cmd := fmt.Sprintf("%s status 2>%s; echo \"[pgwake status exited $?]\"; exec sleep 3600",
		shellQuote(h.bin), shellQuote(filepath.Join(h.dir, "status.err")))
	st.tmux("new-session", "-d", "-s", "status", "-x", "100", "-y", "30", cmd)

	appRow := func(state string) func(string) bool {
		re := regexp.MustCompile(`(?m)^ app +\S+ ` + state + ` `)
		return func(s string) bool { return re.MatchString(s) }
	}
	st.waitScreen("app sleeping", 30*time.Second, appRow("sleeping"))
	st.tmux("send-keys", "-t", "status", "w")
	// A first wake runs initdb.
	s := st.waitScreen("app running after w", cmdTimeout, appRow("running"))
	if !strings.Contains(s, "awake in") && !strings.Contains(s, "first start (initdb) in") {
		t.Errorf("the detail pane does not show the wake event:\n%s", s)
	}

	// The daemon goes away: the dashboard says so and keeps running.
	h.ok(t, "down", "--volumes")
	st.waitScreen("the not-running banner", time.Minute, func(s string) bool {
		return strings.Contains(s, "pgwake is not running — reconnecting…")
	})

	st.tmux("send-keys", "-t", "status", "q")
	st.waitScreen("status to exit", 30*time.Second, func(s string) bool {
		return strings.Contains(s, "[pgwake status exited 0]")
	})
}

// tmux runs a tmux command on our own tmux server and requires success.
func (st *statusTmux) tmux(args ...string) string {
	st.t.Helper()
	out, err := st.tmuxRun(args...)
	if err != nil {
		st.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (st *statusTmux) tmuxRun(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "tmux", append([]string{"-S", st.socket, "-f", "/dev/null"}, args...)...)
	cmd.Env, cmd.Dir = st.env, st.dir
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// screen is what the status pane shows now.
func (st *statusTmux) screen() string {
	st.t.Helper()
	return st.tmux("capture-pane", "-p", "-t", "status")
}

// waitScreen polls the pane until cond holds, and returns the screen.
func (st *statusTmux) waitScreen(what string, timeout time.Duration, cond func(string) bool) string {
	st.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := st.screen()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			st.t.Fatalf("waited %v for %s; the screen is:\n%s", timeout, what, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cleanup shows the dashboard's stderr on failure and ends the tmux server;
// the harness's own cleanup then stops the daemon and removes its data.
func (st *statusTmux) cleanup() {
	if st.t.Failed() {
		if data, err := os.ReadFile(filepath.Join(st.dir, "status.err")); err == nil {
			st.t.Logf("status stderr:\n%s", data)
		}
	}
	if out, err := st.tmuxRun("kill-server"); err != nil && !strings.Contains(out, "no server running") {
		st.t.Logf("tmux kill-server: %v: %s", err, out)
	}
}
