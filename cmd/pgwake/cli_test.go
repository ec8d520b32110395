package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/config"
)

// cliResult is what one in-process CLI run produced.
type cliResult struct {
	stdout, stderr string
	err            error
	code           int // exitCode(err) with no signal
}

// cliEnv returns an environment whose state directory (and so admin socket)
// is a fresh, short, empty directory no daemon serves, and whose config file
// is empty, so nothing on the machine leaks into the test. Its Docker host
// does not exist, so a regression that lets `up` get as far as starting a
// daemon fails at once instead of running one.
func cliEnv(t *testing.T, extra ...string) []string {
	t.Helper()
	dir, env := stateEnv(t)
	env = append(env, "PGWAKE_DOCKER_HOST=unix://"+filepath.Join(dir, "no-docker.sock"))
	return append(env, extra...)
}

// stateEnv makes a fresh state directory and an empty pgwake.yaml, and
// returns the directory and the environment that points pgwake at both.
func stateEnv(t *testing.T) (dir string, env []string) {
	t.Helper()
	// Not t.TempDir: the admin socket path must stay short.
	dir, err := os.MkdirTemp("", "pgw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := filepath.Join(dir, "empty.yaml")
	if err := os.WriteFile(cfg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, []string{"PGWAKE_STATE_DIR=" + dir, "PGWAKE_CONFIG=" + cfg}
}

// runCLI runs the root command in process, as main does, with environ as the
// environment.
func runCLI(t *testing.T, environ []string, args ...string) cliResult {
	t.Helper()
	var stdout, stderr bytes.Buffer
	root := newRootCommand(&deps{stdout: &stdout, stderr: &stderr, environ: environ})
	root.SetArgs(args)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := root.ExecuteContext(ctx)
	return cliResult{stdout: stdout.String(), stderr: stderr.String(), err: err, code: exitCode(err, make(chan os.Signal, 1))}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	r := runCLI(t, cliEnv(t), "version")
	if r.err != nil {
		t.Fatalf("version: %v", r.err)
	}
	if !strings.HasPrefix(r.stdout, "pgwake dev (commit ") || strings.Count(r.stdout, "\n") != 1 {
		t.Errorf("version printed %q, want one line starting %q", r.stdout, "pgwake dev (commit ")
	}
	if r.stderr != "" {
		t.Errorf("version wrote to stderr: %q", r.stderr)
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want []string
	}{
		{args: []string{"--help"}, want: []string{"pgwake up -d --wait", "create", "--state-dir", "PGWAKE_STATE_DIR"}},
		{args: []string{"up", "--help"}, want: []string{"--detach", "--wait", "--listen", "--sleep-after", "PGWAKE_SLEEP_AFTER", "--state-dir"}},
		{args: []string{"rm", "--help"}, want: []string{"--volumes"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, cliEnv(t), tt.args...)
			if r.err != nil {
				t.Fatalf("%q: %v", tt.args, r.err)
			}
			for _, s := range tt.want {
				if !strings.Contains(r.stdout, s) {
					t.Errorf("%q output lacks %q:\n%s", tt.args, s, r.stdout)
				}
			}
		})
	}
}

// TestNeedsDaemon runs every command that talks to the daemon with none
// running: each must fail with admin.ErrNotRunning, exit 1, and say how to
// start pgwake.
func TestNeedsDaemon(t *testing.T) {
	t.Parallel()
	tests := [][]string{
		{"ls"},
		{"ls", "--json"},
		{"list"},
		{"url", "x"},
		{"wake", "x"},
		{"sleep", "x"},
		{"create", "x"},
		{"create", "x", "--sleep-after", "1m", "--sleep-mode", "pause"},
		{"rm", "x"},
		{"rm", "--volumes", "x"},
		{"logs", "x"},
		{"logs", "-f", "x"},
		{"psql", "x"},
		{"psql", "x", "--", "-c", "select 1"},
	}
	for _, args := range tests {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			env := cliEnv(t)
			r := runCLI(t, env, args...)
			if !errors.Is(r.err, admin.ErrNotRunning) {
				t.Fatalf("%q: error %v, want admin.ErrNotRunning", args, r.err)
			}
			for _, s := range []string{"pgwake is not running", "pgwake up"} {
				if !strings.Contains(r.err.Error(), s) {
					t.Errorf("%q: error %q does not contain %q", args, r.err, s)
				}
			}
			if r.code != 1 {
				t.Errorf("%q: exit code %d, want 1", args, r.code)
			}
			if r.stdout != "" || r.stderr != "" {
				t.Errorf("%q: printed stdout %q stderr %q; only main prints errors", args, r.stdout, r.stderr)
			}
		})
	}
}

// TestSocketFromFlags checks that the persistent config flags reach the
// commands: the error names the socket the flag chose, not the env one.
func TestSocketFromFlags(t *testing.T) {
	t.Parallel()
	other, err := os.MkdirTemp("", "pgw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	tests := []struct {
		args []string
		want string
	}{
		{args: []string{"ls", "--state-dir", other}, want: filepath.Join(other, "pgwake.sock")},
		{args: []string{"--state-dir=" + other, "url", "x"}, want: filepath.Join(other, "pgwake.sock")},
		{args: []string{"ls", "--admin-socket", filepath.Join(other, "a.sock")}, want: filepath.Join(other, "a.sock")},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, cliEnv(t), tt.args...)
			if !errors.Is(r.err, admin.ErrNotRunning) || !strings.Contains(r.err.Error(), tt.want) {
				t.Errorf("%q: error %v, want pgwake is not running on %s", tt.args, r.err, tt.want)
			}
		})
	}
}

func TestDownNotRunning(t *testing.T) {
	t.Parallel()
	r := runCLI(t, cliEnv(t), "down")
	if r.err != nil || r.code != 0 {
		t.Fatalf("down: error %v, exit code %d; want success when nothing runs", r.err, r.code)
	}
	if !strings.Contains(r.stderr, "pgwake is not running") {
		t.Errorf("down stderr %q, want it to say pgwake is not running", r.stderr)
	}
	if r.stdout != "" {
		t.Errorf("down stdout %q, want nothing", r.stdout)
	}
}

// TestUsageErrors checks that bad invocations and bad configuration exit 2
// before anything talks to a daemon, without cobra's usage dump.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  []string
		args []string
		want string // in the error
	}{
		{name: "unknown env var", env: []string{"PGWAKE_BOGUS=1"}, args: []string{"ls"}, want: "unknown environment variable PGWAKE_BOGUS"},
		{name: "unknown env var for a local command", env: []string{"PGWAKE_LISTN=127.0.0.1:0"}, args: []string{"down"}, want: "PGWAKE_LISTN"},
		{name: "bad env value", env: []string{"PGWAKE_LOG_LEVEL=loud"}, args: []string{"ls"}, want: "log_level"},
		{name: "bad env duration", env: []string{"PGWAKE_SLEEP_AFTER=10"}, args: []string{"ls"}, want: "PGWAKE_SLEEP_AFTER"},
		{name: "bad flag value", args: []string{"ls", "--log-format=xml"}, want: "log_format"},
		{name: "bad up flag", args: []string{"up", "--listen=6432"}, want: "not host:port"},
		{name: "bad up duration flag", args: []string{"up", "--sleep-after=soon"}, want: "--sleep-after"},
		{name: "missing --config file", args: []string{"--config=/nonexistent/pgwake.yaml", "ls"}, want: "/nonexistent/pgwake.yaml"},
		{name: "unknown flag", args: []string{"ls", "--bogus"}, want: "unknown flag: --bogus"},
		{name: "bad bool flag", args: []string{"ls", "--json=maybe"}, want: "--json"},
		{name: "bad down timeout", args: []string{"down", "--timeout=soon"}, want: "--timeout"},
		{name: "url without name", args: []string{"url"}, want: "pgwake url expects a project name"},
		{name: "url with two names", args: []string{"url", "a", "b"}, want: "expects a project name"},
		{name: "create without name", args: []string{"create"}, want: "pgwake create expects a project name"},
		{name: "wake without name", args: []string{"wake"}, want: "expects a project name"},
		{name: "sleep with two names", args: []string{"sleep", "a", "b"}, want: "expects a project name"},
		{name: "rm without name", args: []string{"rm"}, want: "expects a project name"},
		{name: "logs without name", args: []string{"logs"}, want: "expects a project name"},
		{name: "psql without name", args: []string{"psql"}, want: "psql expects a project name"},
		{name: "ls with an argument", args: []string{"ls", "x"}, want: "expects no arguments"},
		{name: "down with an argument", args: []string{"down", "x"}, want: "expects no arguments"},
		{name: "version with an argument", args: []string{"version", "x"}, want: "expects no arguments"},
		{name: "up with an argument", args: []string{"up", "x"}, want: "expects no arguments"},
		{name: "up --wait without -d", args: []string{"up", "--wait"}, want: "--wait goes with -d"},
		{name: "up --wait=true without -d", args: []string{"up", "--wait=true", "--listen=127.0.0.1:0"}, want: "--wait goes with -d"},
		{
			name: "unknown command", args: []string{"bogus"}, want: `unknown command "bogus"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, cliEnv(t, tt.env...), tt.args...)
			if r.err == nil {
				t.Fatalf("%q succeeded, want a usage error; stdout %q stderr %q", tt.args, r.stdout, r.stderr)
			}
			if !strings.Contains(r.err.Error(), tt.want) {
				t.Errorf("%q: error %q does not contain %q", tt.args, r.err, tt.want)
			}
			if errors.Is(r.err, admin.ErrNotRunning) {
				t.Errorf("%q: went on to contact the daemon: %v", tt.args, r.err)
			}
			if r.code != 2 {
				t.Errorf("%q: exit code %d, want 2 (error %q)", tt.args, r.code, r.err)
			}
			var ee *exitError
			if !errors.As(r.err, &ee) {
				t.Errorf("%q: error %T is not an *exitError", tt.args, r.err)
			}
			if strings.Contains(r.stdout+r.stderr, "Usage:") {
				t.Errorf("%q printed usage; SilenceUsage should be set:\n%s%s", tt.args, r.stdout, r.stderr)
			}
			if strings.Contains(r.stderr, tt.want) {
				t.Errorf("%q: the command printed its own error to stderr %q; only main prints errors", tt.args, r.stderr)
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	tests := []struct {
		name string
		err  error
		sig  os.Signal // pending on the channel; nil for none
		want int
	}{
		{name: "success", want: 0},
		{name: "failure", err: boom, want: 1},
		{name: "usage", err: usageError(boom), want: 2},
		{name: "wrapped usage", err: fmt.Errorf("ctx: %w", usageError(boom)), want: 2},
		{name: "psql status", err: &exitError{code: 3, err: boom}, want: 3},
		{name: "the daemon finds the request invalid", err: fmt.Errorf("create: %w", &admin.APIError{Status: 400, Msg: "invalid project name"}), want: 2},
		{name: "the daemon fails", err: &admin.APIError{Status: 500, Msg: "engine down"}, want: 1},
		{name: "conflict", err: &admin.APIError{Status: 409, Msg: "exists"}, want: 1},
		{name: "interrupt", err: boom, sig: os.Interrupt, want: 130},
		{name: "interrupt without error", sig: os.Interrupt, want: 130},
		{name: "terminate", err: usageError(boom), sig: syscall.SIGTERM, want: 143},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sig := make(chan os.Signal, 1)
			if tt.sig != nil {
				sig <- tt.sig
			}
			if got := exitCode(tt.err, sig); got != tt.want {
				t.Errorf("exitCode(%v, %v) = %d, want %d", tt.err, tt.sig, got, tt.want)
			}
		})
	}
	if err := usageError(boom); !errors.Is(err, boom) || err.Error() != "boom" {
		t.Errorf("usageError(boom) = %q, does not wrap boom transparently", err)
	}
}

func TestDaemonProcs(t *testing.T) {
	t.Parallel()
	for available, want := range map[int]int{1: 1, 2: 1, 4: 1, 7: 1, 8: 2, 16: 4, 64: 16} {
		for _, env := range []string{"", "0", "-2", "two"} { // the runtime ignores these
			if got := daemonProcs(env, available); got != want {
				t.Errorf("daemonProcs(%q, %d) = %d, want %d", env, available, got, want)
			}
		}
		if got := daemonProcs("3", available); got != 0 {
			t.Errorf("daemonProcs(\"3\", %d) = %d, want 0 (the environment decides)", available, got)
		}
	}
}

// TestBrokenConfigFile: a broken pgwake.yaml stops the commands that use
// it (up, create: exit 2, naming the file and line), while the commands
// that only talk to the daemon warn once and go on without it.
func TestBrokenConfigFile(t *testing.T) {
	t.Parallel()
	dir, env := stateEnv(t)
	broken := filepath.Join(dir, "pgwake.yaml")
	if err := os.WriteFile(broken, []byte("image: x\nsleep_after: soon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env = append(env, "PGWAKE_CONFIG="+broken) // the last value wins
	for _, args := range [][]string{{"up"}, {"create", "app"}} {
		r := runCLI(t, env, args...)
		if r.code != 2 || !strings.Contains(r.err.Error(), broken+": line 2") {
			t.Errorf("%v: exit %d, err %v; want 2 naming %s line 2", args, r.code, r.err, broken)
		}
	}
	for _, args := range [][]string{{"ls"}, {"url", "app"}, {"env", "app"}, {"down"}} {
		r := runCLI(t, env, args...)
		if n := strings.Count(r.stderr, "warning: ignoring the config file"); n != 1 || !strings.Contains(r.stderr, "line 2") {
			t.Errorf("%v: stderr %q, want one warning naming line 2", args, r.stderr)
		}
		// It went on to ask the daemon (none runs here).
		if args[0] != "down" && !errors.Is(r.err, admin.ErrNotRunning) {
			t.Errorf("%v: err %v, want the daemon asked (not running)", args, r.err)
		}
	}
}

// TestBrokenConfigFileKeepsWherePgwakeRuns: the commands that go on
// without a broken file still take the state dir it names (else `rm` or
// `down --volumes` would act on another pgwake), and refuse when the file
// is too broken to tell.
func TestBrokenConfigFileKeepsWherePgwakeRuns(t *testing.T) {
	t.Parallel()
	dir, _ := stateEnv(t)
	other := filepath.Join(dir, "other")
	file := filepath.Join(dir, "pgwake.yaml")
	env := []string{"PGWAKE_CONFIG=" + file} // the state dir comes from the file alone
	for _, tt := range []struct {
		name, body string
		code       int
		want       string
	}{
		{"bad value", "state_dir: " + other + "\nsleep_after: banana\n", 1, filepath.Join(other, "pgwake.sock")},
		{"bad declared name", "state_dir: " + other + "\nprojects:\n  - name: Bad_Name\n", 1, filepath.Join(other, "pgwake.sock")},
		{"not YAML, naming the state dir", "state_dir: " + other + "\n  : [\n", 2, "config file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.WriteFile(file, []byte(tt.body), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"ls"}, {"tls", "ca"}, {"rm", "app", "--volumes"}} {
				r := runCLI(t, env, args...)
				if args[0] == "tls" { // it asks the daemon: only the config's verdict counts
					if (r.code == 2) != (tt.code == 2) {
						t.Errorf("%v: exit %d, err %v; want the config taken as for ls", args, r.code, r.err)
					}
					continue
				}
				if r.code != tt.code || !strings.Contains(r.err.Error(), tt.want) {
					t.Errorf("%v: exit %d, err %v; want %d and %q", args, r.code, r.err, tt.code, tt.want)
				}
			}
		})
	}
}

func TestConfigDiff(t *testing.T) {
	t.Parallel()
	running := config.Default()
	running.AdminToken = "old-secret"
	theirs := running.Effective()
	_, env := stateEnv(t)
	cfg, err := config.Load(config.Sources{Environ: append(env,
		"PGWAKE_MAX_CONNECTIONS=7", "PGWAKE_IMAGE=other:1", "PGWAKE_LOG_LEVEL=debug", "PGWAKE_ADMIN_TOKEN=new-secret")})
	if err != nil {
		t.Fatal(err)
	}
	theirs["state_dir"] = cfg.StateDir // the same daemon
	diffs, notes := configDiff(&cfg, theirs)
	want := []string{"admin_token differs (PGWAKE_ADMIN_TOKEN)", `max_connections is "1000" there, "7" here (PGWAKE_MAX_CONNECTIONS)`} // in key order
	if !slices.Equal(diffs, want) {
		t.Errorf("diffs %q, want %q", diffs, want)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "log_level") {
		t.Errorf("notes %q, want log_level only", notes)
	}
	for _, d := range append(diffs, notes...) {
		if strings.Contains(d, "secret") && !strings.Contains(d, "admin_token differs") || strings.Contains(d, "image") {
			t.Errorf("%q: a secret's value or a per-project default", d)
		}
	}
}
