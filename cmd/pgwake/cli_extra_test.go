package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgwake/pgwake/internal/admin"
)

// This file tests pin/unpin, create's request and output, and env's GitHub
// masking in process, against a scripted daemon served on the admin socket
// (serveAdmin); the integration tests in create_integration_test.go run the
// same commands against a real one.

// testPassword has characters a URL percent-encodes and a workflow command
// escapes, so both spellings of it are exercised.
const testPassword = "pa/ss%word"

// scriptedDaemon records what the CLI asks of it. Calls it does not script
// panic through the nil embedded interface, which fails the test loudly.
type scriptedDaemon struct {
	admin.Service
	info admin.Info

	mu       sync.Mutex
	projects map[string]admin.Project
	creates  []admin.CreateRequest
	pins     []string // "pin NAME" or "unpin NAME", in order
}

func newScriptedDaemon(projects ...string) *scriptedDaemon {
	s := &scriptedDaemon{
		info:     admin.Info{Listen: "127.0.0.1:6432", Backend: "docker"},
		projects: map[string]admin.Project{},
	}
	for _, name := range projects {
		s.projects[name] = s.project(admin.CreateRequest{Name: name})
	}
	return s
}

func (s *scriptedDaemon) project(req admin.CreateRequest) admin.Project {
	u := url.URL{
		Scheme: "postgres", User: url.UserPassword("postgres", testPassword),
		Host: "127.0.0.1:6432", Path: "/" + req.Name, RawQuery: "sslmode=disable",
	}
	p := admin.Project{
		Name: req.Name, State: "sleeping", Image: req.Image, SleepMode: req.SleepMode,
		SleepAfterMS: 600000, URL: u.String(), User: "postgres", Database: req.Name,
	}
	if p.Image == "" {
		p.Image = "postgres:17"
	}
	if p.SleepMode == "" {
		p.SleepMode = "stop"
	}
	if req.Ephemeral != nil {
		p.Ephemeral = *req.Ephemeral
	}
	return p
}

func (s *scriptedDaemon) Info() admin.Info { return s.info }

func (s *scriptedDaemon) Project(name string) (admin.Project, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.projects[name]
	if !ok {
		return admin.Project{}, admin.NotFound(fmt.Errorf("no such project: %q", name))
	}
	return p, nil
}

func (s *scriptedDaemon) Create(_ context.Context, req admin.CreateRequest) (admin.Project, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.creates = append(s.creates, req)
	p := s.project(req)
	s.projects[req.Name] = p
	return p, nil
}

func (s *scriptedDaemon) Pin(name string, pinned bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.projects[name]
	if !ok {
		return admin.NotFound(fmt.Errorf("no such project: %q", name))
	}
	p.Pinned = pinned
	s.projects[name] = p
	verb := "unpin"
	if pinned {
		verb = "pin"
	}
	s.pins = append(s.pins, verb+" "+name)
	return nil
}

func (s *scriptedDaemon) recorded() ([]admin.CreateRequest, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]admin.CreateRequest(nil), s.creates...), append([]string(nil), s.pins...)
}

// writeConfig writes a config file in a fresh directory and returns its
// path.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pgwake.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestPinUnpin(t *testing.T) {
	t.Parallel()
	svc := newScriptedDaemon("app")
	env := serveAdmin(t, svc)

	r := runCLI(t, env, "pin", "app")
	if r.err != nil || r.stdout != "" || !strings.HasPrefix(r.stderr, "app is pinned: ") {
		t.Errorf("pin app: error %v, stdout %q, stderr %q", r.err, r.stdout, r.stderr)
	}
	if p, _ := svc.Project("app"); !p.Pinned {
		t.Error("pin app did not pin it")
	}
	r = runCLI(t, env, "unpin", "app")
	if r.err != nil || r.stdout != "" || r.stderr != "app is unpinned: it sleeps after 10m0s idle (now sleeping)\n" {
		t.Errorf("unpin app: error %v, stdout %q, stderr %q", r.err, r.stdout, r.stderr)
	}
	if _, pins := svc.recorded(); strings.Join(pins, ",") != "pin app,unpin app" {
		t.Errorf("daemon saw %q, want pin app then unpin app", pins)
	}

	for _, verb := range []string{"pin", "unpin"} {
		r := runCLI(t, env, verb, "nope")
		if r.code != 1 || r.err == nil || r.err.Error() != `no such project: "nope"` || r.stderr != "" {
			t.Errorf("%s nope: exit %d, error %v, stderr %q; want exit 1 and one error naming nope", verb, r.code, r.err, r.stderr)
		}
		for _, args := range [][]string{{verb}, {verb, "a", "b"}} {
			r := runCLI(t, env, args...)
			if r.code != 2 || r.err == nil || !strings.Contains(r.err.Error(), "expects a project name") {
				t.Errorf("%q: exit %d, error %v; want 2 and a usage error", args, r.code, r.err)
			}
		}
		r = runCLI(t, cliEnv(t), verb, "app")
		if !errors.Is(r.err, admin.ErrNotRunning) || r.code != 1 {
			t.Errorf("%s without a daemon: exit %d, error %v; want 1 and not running", verb, r.code, r.err)
		}
	}
	if _, pins := svc.recorded(); len(pins) != 2 {
		t.Errorf("failed invocations reached the daemon: %q", pins)
	}
}

// TestCreateRequest checks what create asks the daemon for: its flags
// first, then the project's entry in the config file, then the image,
// sleep_after, sleep_mode and ephemeral keys this command's own
// configuration sets (variable over file), and nothing else, so that the
// daemon's defaults apply only to what nobody set.
func TestCreateRequest(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	file := writeConfig(t, "image: file/img:1\nsleep_after: 3m\nsleep_mode: pause\nephemeral: true\n")
	declared := writeConfig(t, "image: file/img:1\nprojects:\n  - name: app\n    image: decl/img:2\n    sleep_after: 0s\n  - name: other\n    sleep_mode: pause\n")
	tiered := writeConfig(t, "stop_after: 2h\nprojects:\n  - name: app\n    sleep_mode: tiered\n    stop_after: 45m\n")
	tests := []struct {
		name string
		env  []string
		args []string
		want admin.CreateRequest
	}{
		{name: "nothing set", want: admin.CreateRequest{}},
		{name: "PGWAKE_IMAGE", env: []string{"PGWAKE_IMAGE=env/img:1"}, want: admin.CreateRequest{Image: "env/img:1"}},
		{
			name: "a variable set to the default value is still sent",
			env:  []string{"PGWAKE_IMAGE=postgres:17", "PGWAKE_SLEEP_AFTER=10m", "PGWAKE_SLEEP_MODE=stop", "PGWAKE_EPHEMERAL=false"},
			want: admin.CreateRequest{Image: "postgres:17", SleepAfter: "10m0s", SleepMode: "stop", Ephemeral: &no},
		},
		{
			name: "every variable",
			env:  []string{"PGWAKE_IMAGE=env/img:1", "PGWAKE_SLEEP_AFTER=7m", "PGWAKE_SLEEP_MODE=pause", "PGWAKE_EPHEMERAL=true"},
			want: admin.CreateRequest{Image: "env/img:1", SleepAfter: "7m0s", SleepMode: "pause", Ephemeral: &yes},
		},
		{name: "sleep_after 0 is never", env: []string{"PGWAKE_SLEEP_AFTER=0"}, want: admin.CreateRequest{SleepAfter: "0s"}},
		{
			name: "tiered with PGWAKE_STOP_AFTER",
			env:  []string{"PGWAKE_SLEEP_MODE=tiered", "PGWAKE_STOP_AFTER=1h"},
			want: admin.CreateRequest{SleepMode: "tiered", StopAfter: "1h0m0s"},
		},
		{
			name: "--stop-after over PGWAKE_STOP_AFTER",
			env:  []string{"PGWAKE_STOP_AFTER=1h"},
			args: []string{"--sleep-mode", "tiered", "--stop-after", "5m"},
			want: admin.CreateRequest{SleepMode: "tiered", StopAfter: "5m"},
		},
		{
			name: "the declared entry's stop_after over the top-level key",
			env:  []string{"PGWAKE_CONFIG=" + tiered},
			want: admin.CreateRequest{SleepMode: "tiered", StopAfter: "45m0s"},
		},
		{
			name: "flags win over variables",
			env:  []string{"PGWAKE_IMAGE=env/img:1", "PGWAKE_SLEEP_AFTER=7m", "PGWAKE_SLEEP_MODE=pause", "PGWAKE_EPHEMERAL=true"},
			args: []string{"--image", "flag/img:1", "--sleep-after", "1h", "--sleep-mode", "stop", "--ephemeral=false"},
			want: admin.CreateRequest{Image: "flag/img:1", SleepAfter: "1h", SleepMode: "stop", Ephemeral: &no},
		},
		{
			name: "config file keys",
			args: []string{"--config", file},
			want: admin.CreateRequest{Image: "file/img:1", SleepAfter: "3m0s", SleepMode: "pause", Ephemeral: &yes},
		},
		{
			name: "PGWAKE_CONFIG file keys, variables over them",
			env:  []string{"PGWAKE_CONFIG=" + file, "PGWAKE_IMAGE=env/img:1", "PGWAKE_EPHEMERAL=false"},
			want: admin.CreateRequest{Image: "env/img:1", SleepAfter: "3m0s", SleepMode: "pause", Ephemeral: &no},
		},
		{
			name: "the project's declared entry over variables and top-level keys",
			env:  []string{"PGWAKE_CONFIG=" + declared, "PGWAKE_IMAGE=env/img:1", "PGWAKE_SLEEP_MODE=stop"},
			want: admin.CreateRequest{Image: "decl/img:2", SleepAfter: "0s", SleepMode: "stop"},
		},
		{
			name: "flags over the declared entry",
			env:  []string{"PGWAKE_CONFIG=" + declared},
			args: []string{"--image", "flag/img:1"},
			want: admin.CreateRequest{Image: "flag/img:1", SleepAfter: "0s"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			svc := newScriptedDaemon()
			r := runCLI(t, append(serveAdmin(t, svc), tt.env...), append([]string{"create", "app"}, tt.args...)...)
			if r.err != nil {
				t.Fatalf("create: %v", r.err)
			}
			creates, _ := svc.recorded()
			if len(creates) != 1 {
				t.Fatalf("daemon got %d creates, want 1", len(creates))
			}
			want := tt.want
			want.Name = "app"
			if got := creates[0]; fmt.Sprint(describeRequest(got)) != fmt.Sprint(describeRequest(want)) {
				t.Errorf("create request %s, want %s", describeRequest(got), describeRequest(want))
			}
		})
	}
}

func describeRequest(r admin.CreateRequest) string {
	eph := "unset"
	if r.Ephemeral != nil {
		eph = fmt.Sprint(*r.Ephemeral)
	}
	return fmt.Sprintf("{name %q image %q sleep_after %q sleep_mode %q stop_after %q ephemeral %s port %d}",
		r.Name, r.Image, r.SleepAfter, r.SleepMode, r.StopAfter, eph, r.Port)
}

// TestCreateDaemonKeys: a backend this command's configuration sets, other
// than the running daemon's, is refused before anything is created; a
// listen address that differs gets a one-line warning.
func TestCreateDaemonKeys(t *testing.T) {
	t.Parallel()
	file := writeConfig(t, "backend: local\n")
	tests := []struct {
		name    string
		env     []string
		refused string // in the error; "" means created
		warning string // the whole of stderr's warning line, if any
	}{
		{name: "backend differs", env: []string{"PGWAKE_BACKEND=local"},
			refused: "backend local (PGWAKE_BACKEND) applies to pgwake up: the running pgwake creates new projects on docker"},
		{name: "backend from the file differs", env: []string{"PGWAKE_CONFIG=" + file}, refused: "backend local (" + file + " line 1)"},
		{name: "same backend", env: []string{"PGWAKE_BACKEND=docker"}},
		{name: "backend auto", env: []string{"PGWAKE_BACKEND=auto"}},
		{name: "listen differs", env: []string{"PGWAKE_LISTEN=127.0.0.1:7777"},
			warning: "pgwake: warning: listen 127.0.0.1:7777 (PGWAKE_LISTEN) applies to pgwake up only; the running pgwake listens on 127.0.0.1:6432\n"},
		{name: "listen on any port", env: []string{"PGWAKE_LISTEN=127.0.0.1:0"}},
		{name: "listen the same", env: []string{"PGWAKE_LISTEN=localhost:6432"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			svc := newScriptedDaemon()
			r := runCLI(t, append(serveAdmin(t, svc), tt.env...), "create", "app")
			creates, _ := svc.recorded()
			if tt.refused != "" {
				if r.code != 2 || r.err == nil || !strings.Contains(r.err.Error(), tt.refused) || len(creates) != 0 {
					t.Errorf("exit %d, error %v, %d creates; want exit 2, an error with %q, no create", r.code, r.err, len(creates), tt.refused)
				}
				return
			}
			if r.err != nil || len(creates) != 1 {
				t.Fatalf("error %v, %d creates; want one create", r.err, len(creates))
			}
			warning := ""
			if first, _, _ := strings.Cut(r.stderr, "\n"); strings.HasPrefix(first, "pgwake: warning:") {
				warning = first + "\n"
			}
			if warning != tt.warning {
				t.Errorf("warning %q, want %q (stderr %q)", warning, tt.warning, r.stderr)
			}
		})
	}
}

func TestSameListen(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		want, got string
		same      bool
	}{
		{"127.0.0.1:6432", "127.0.0.1:6432", true},
		{"127.0.0.1:0", "127.0.0.1:41234", true},
		{"localhost:6432", "127.0.0.1:6432", true},
		{":6432", "[::]:6432", true},
		{"0.0.0.0:6432", "[::]:6432", true},
		{"127.0.0.1:6433", "127.0.0.1:6432", false},
		{"10.0.0.1:6432", "127.0.0.1:6432", false},
		{"0.0.0.0:6432", "127.0.0.1:6432", false},
		{"127.0.0.1:6432", "[::]:6432", false},
	} {
		if got := sameListen(tt.want, tt.got); got != tt.same {
			t.Errorf("sameListen(%q, %q) = %v, want %v", tt.want, tt.got, got, tt.same)
		}
	}
}

// TestCreateOutput: stdout gets the URL without its password unless
// --show-password; stderr says how to get it and that the first connect
// runs initdb.
func TestCreateOutput(t *testing.T) {
	t.Parallel()
	full := newScriptedDaemon().project(admin.CreateRequest{Name: "app"}).URL
	encoded := url.UserPassword("", testPassword).String()[1:]
	bare := "postgres://postgres@127.0.0.1:6432/app?sslmode=disable\n"

	r := runCLI(t, serveAdmin(t, newScriptedDaemon()), "create", "app")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.stdout != bare {
		t.Errorf("create printed %q, want %q", r.stdout, bare)
	}
	for _, s := range []string{"pgwake url app", `eval "$(pgwake env app)"`, "initdb"} {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("create stderr lacks %q:\n%s", s, r.stderr)
		}
	}
	if strings.Contains(r.stdout+r.stderr, testPassword) || strings.Contains(r.stdout+r.stderr, encoded) {
		t.Errorf("create printed the password:\nstdout %q\nstderr %q", r.stdout, r.stderr)
	}

	r = runCLI(t, serveAdmin(t, newScriptedDaemon()), "create", "app", "--show-password")
	if r.err != nil || r.stdout != full+"\n" {
		t.Errorf("create --show-password: error %v, stdout %q, want %q", r.err, r.stdout, full+"\n")
	}
	if strings.Contains(r.stderr, "no password") || strings.Contains(r.stderr, "add-mask") {
		t.Errorf("create --show-password outside GitHub Actions, stderr:\n%s", r.stderr)
	}
}

// outputLog records the writes to stdout and stderr in the order they
// happen, as a terminal or a CI log would see them.
type outputLog struct {
	mu     sync.Mutex
	writes []output
}

type output struct{ stream, text string }

type streamWriter struct {
	log    *outputLog
	stream string
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.log.mu.Lock()
	defer w.log.mu.Unlock()
	w.log.writes = append(w.log.writes, output{w.stream, string(p)})
	return len(p), nil
}

// lines returns the lines of stream, and of both (each prefixed with its
// stream) in order.
func (l *outputLog) lines(stream string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, w := range l.writes {
		if stream != "" && w.stream != stream {
			continue
		}
		for _, line := range strings.SplitAfter(w.text, "\n") {
			if line == "" {
				continue
			}
			if stream == "" {
				line = w.stream + ": " + line
			}
			out = append(out, line)
		}
	}
	return out
}

// runOrdered runs the CLI in process with stdout and stderr recorded in
// one log.
func runOrdered(t *testing.T, environ []string, args ...string) (*outputLog, error) {
	t.Helper()
	log := &outputLog{}
	root := newRootCommand(&deps{stdout: streamWriter{log, "stdout"}, stderr: streamWriter{log, "stderr"}, environ: environ})
	root.SetArgs(args)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	return log, root.ExecuteContext(ctx)
}

// unescapeCommandData undoes a workflow command value's escapes the way
// actions/runner's ActionCommand.UnescapeData does (each mapping in turn).
func unescapeCommandData(s string) string {
	for _, m := range [][2]string{{"%0D", "\r"}, {"%0A", "\n"}, {"%25", "%"}} {
		s = strings.ReplaceAll(s, m[0], m[1])
	}
	return s
}

// TestEnvGitHubMasks: under GitHub Actions, env --format github writes
// ::add-mask:: commands for the password, as typed and as DATABASE_URL
// spells it, to stderr before any value reaches stdout; stdout keeps only
// NAME=value lines, which $GITHUB_ENV takes. Elsewhere nothing changes.
func TestEnvGitHubMasks(t *testing.T) {
	t.Parallel()
	encoded := url.UserPassword("", testPassword).String()[1:]
	if encoded == testPassword {
		t.Fatalf("test password %q needs characters a URL encodes", testPassword)
	}
	env := append(serveAdmin(t, newScriptedDaemon("app")), "GITHUB_ACTIONS=true")

	log, err := runOrdered(t, env, "env", "app", "--format", "github")
	if err != nil {
		t.Fatal(err)
	}
	all := log.lines("")
	if len(all) != 8 {
		t.Fatalf("got %d lines, want 2 masks and 6 variables:\n%s", len(all), strings.Join(all, ""))
	}
	var masks []string
	for _, line := range all[:2] {
		data, ok := strings.CutPrefix(line, "stderr: ::add-mask::")
		if !ok {
			t.Fatalf("line %q: want the masks first, on stderr:\n%s", line, strings.Join(all, ""))
		}
		masks = append(masks, unescapeCommandData(strings.TrimSuffix(data, "\n")))
	}
	if masks[0] != testPassword || masks[1] != encoded {
		t.Errorf("masks %q, want %q and %q", masks, testPassword, encoded)
	}
	for _, line := range log.lines("stdout") {
		name, _, ok := strings.Cut(line, "=")
		if !ok || strings.Contains(name, "<<") || strings.HasPrefix(line, "::") {
			t.Errorf("stdout line %q is not NAME=value", line)
		}
	}
	if !strings.Contains(strings.Join(log.lines("stdout"), ""), "PGPASSWORD="+testPassword+"\n") {
		t.Errorf("stdout lacks PGPASSWORD:\n%s", strings.Join(log.lines("stdout"), ""))
	}

	// Not under GitHub Actions, or another format: no masks.
	for _, tt := range []struct {
		env  []string
		args []string
	}{
		{env: env[:len(env)-1], args: []string{"env", "app", "--format", "github"}},
		{env: append(env[:len(env)-1:len(env)-1], "GITHUB_ACTIONS=false"), args: []string{"env", "app", "--format", "github"}},
		{env: env, args: []string{"env", "app"}},
		{env: env, args: []string{"env", "app", "--format", "dotenv"}},
	} {
		log, err := runOrdered(t, tt.env, tt.args...)
		if err != nil || len(log.lines("stderr")) != 0 {
			t.Errorf("%q with %q: error %v, stderr %q; want nothing on stderr", tt.args, tt.env[len(tt.env)-1], err, log.lines("stderr"))
		}
	}

	// create --show-password masks the same way, before printing the URL.
	log, err = runOrdered(t, append(serveAdmin(t, newScriptedDaemon()), "GITHUB_ACTIONS=true"), "create", "app", "--show-password")
	if err != nil {
		t.Fatal(err)
	}
	all = log.lines("")
	if len(all) < 3 || all[0] != "stderr: ::add-mask::"+escapeCommandData(testPassword)+"\n" ||
		all[1] != "stderr: ::add-mask::"+escapeCommandData(encoded)+"\n" || !strings.HasPrefix(all[len(all)-1], "stdout: postgres://") {
		t.Errorf("create --show-password under GitHub Actions wrote:\n%s", strings.Join(all, ""))
	}
}
