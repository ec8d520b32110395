package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/jackc/pgx/v5"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/dockerbackend"
	"github.com/pgwake/pgwake/internal/testenv"
	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

// The integration tests drive a real pgwake binary against a real Docker
// engine, as a user would: through its command line, its proxy (with pgx and
// psql) and docker inspect.

const (
	// cmdTimeout bounds one CLI invocation or client connect. It exceeds
	// what pgwake itself may take (a first start, initdb, is bounded by
	// first_start_timeout, 5 min), so a test sees pgwake's answer rather
	// than its own timeout: with the machine loaded (two suites and busy
	// loops on two cores) a first start took up to 3m56s here.
	cmdTimeout = 6 * time.Minute
)

var (
	buildOnce sync.Once
	buildDir  string // holds the binary; removed by TestMain
	buildBin  string
	buildErr  error
)

func TestMain(m *testing.M) {
	// `pgwake up -d` re-executes os.Executable(), which under go test is
	// this test binary: never let a regression in a unit test turn that
	// into a second run of every test.
	if len(os.Args) > 1 && os.Args[1] == "up" {
		fmt.Fprintln(os.Stderr, "pgwake.test: re-executed as a detached daemon; refusing")
		os.Exit(3)
	}
	code := m.Run()
	kubeenv.StopShared()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// pgwakeBinary builds the pgwake command once per test binary.
func pgwakeBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "pgwake-bin")
		if buildErr != nil {
			return
		}
		bin := filepath.Join(buildDir, "pgwake")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		buildBin = bin
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBin
}

// cliHarness is one pgwake installation: a state directory, the environment
// that points the binary at it, and the Docker objects it creates.
type cliHarness struct {
	t      *testing.T
	bin    string
	dir    string // state dir: short, for the admin socket
	env    []string
	image  string
	docker *client.Client
	pids   []int // daemons seen, killed in cleanup if still alive
}

func newHarness(t *testing.T) *cliHarness {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test needs Docker; skipped with -short")
	}
	image := testenv.PostgresImage(t)
	docker := testenv.DockerClient(t)
	bin := pgwakeBinary(t)
	dir, err := os.MkdirTemp("", "pgw")
	if err != nil {
		t.Fatal(err)
	}
	// The user's PGWAKE_* variables (and the tests' own PGWAKETEST_IMAGE)
	// would be unknown keys or change the configuration under test.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PGWAKE_") && !strings.HasPrefix(kv, "PSQLRC=") {
			env = append(env, kv)
		}
	}
	env = append(env, "PGWAKE_STATE_DIR="+dir, "PGWAKE_IMAGE="+image, "PGWAKE_LOG_LEVEL=debug", "PSQLRC=/dev/null",
		"PGWAKE_PORT_RANGE="+testenv.PortRange(t))
	// These tests inspect Docker containers: where pgwake can choose its
	// backend, make sure it does not pick another one.
	for _, k := range config.Keys() {
		if k.Name == "backend" {
			env = append(env, k.Env+"=docker")
		}
	}
	h := &cliHarness{t: t, bin: bin, dir: dir, env: env, image: image, docker: docker}
	// Registered after testenv's client cleanup, so it runs before it.
	t.Cleanup(h.cleanup)
	return h
}

// cleanup kills the daemons, removes every container and volume of this
// instance by label, and deletes the state directory.
func (h *cliHarness) cleanup() {
	t := h.t
	if t.Failed() {
		if log, err := os.ReadFile(filepath.Join(h.dir, "pgwake.log")); err == nil {
			const max = 8 << 10
			if len(log) > max {
				log = log[len(log)-max:]
			}
			t.Logf("tail of pgwake.log:\n%s", log)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if info, err := h.admin().Info(ctx); err == nil {
		h.pids = append(h.pids, info.PID)
	}
	for _, pid := range h.pids {
		h.kill(t, pid)
	}
	if inst := h.instanceOrEmpty(); inst != "" {
		testenv.RemoveInstance(t, h.docker, inst)
	}
	if err := os.RemoveAll(h.dir); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// kill sends SIGKILL to pid if it is still one of our daemons, and waits
// until it is gone.
func (h *cliHarness) kill(t *testing.T, pid int) {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	args := strings.Split(string(cmdline), "\x00")
	if err != nil || len(args) < 2 || filepath.Base(args[0]) != "pgwake" || args[1] != "up" {
		return // gone, a zombie, or the pid was reused
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill %d: %v", pid, err)
		return
	}
	h.waitGone(t, pid)
}

// waitGone waits until pid has exited. The daemon is not our child (up -d
// detaches it), so a zombie awaiting its reaper counts as gone, but only
// once its other threads are gone too: a killed thread-group leader turns
// zombie first while the rest still hold its descriptors (the admin socket
// then still accepts connections, and resets them).
func (h *cliHarness) waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		// The state follows the parenthesised command name.
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			if tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); err != nil || len(tasks) <= 1 {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("pid %d still alive 30s after SIGKILL", pid)
}

type runResult struct {
	stdout, stderr string
	code           int
}

// run runs pgwake with args in the state directory, as a user would.
func (h *cliHarness) run(t *testing.T, args ...string) runResult {
	t.Helper()
	return h.runTimeout(t, cmdTimeout, args...)
}

func (h *cliHarness) runTimeout(t *testing.T, timeout time.Duration, args ...string) runResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, h.bin, args...)
	cmd.Env, cmd.Dir = h.env, h.dir
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	r := runResult{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ctx.Err() == nil:
		r.code = ee.ExitCode()
	default:
		t.Fatalf("pgwake %s: %v (after %v)\nstdout: %s\nstderr: %s", strings.Join(args, " "), err,
			time.Since(start).Round(time.Millisecond), r.stdout, r.stderr)
	}
	t.Logf("$ pgwake %s  # exit %d in %v\n%s", strings.Join(args, " "), r.code,
		time.Since(start).Round(time.Millisecond), strings.TrimRight(r.stderr, "\n"))
	return r
}

// ok runs pgwake, requires success and returns its stdout.
func (h *cliHarness) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := h.run(t, args...)
	if r.code != 0 {
		t.Fatalf("pgwake %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// fail runs pgwake, requires a failure and checks main's one-line error.
func (h *cliHarness) fail(t *testing.T, args ...string) runResult {
	t.Helper()
	r := h.run(t, args...)
	if r.code == 0 {
		t.Fatalf("pgwake %s succeeded, want a failure\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.stdout, r.stderr)
	}
	if !strings.HasPrefix(r.stderr, "pgwake: ") || strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Errorf("pgwake %s: stderr %q, want one line starting \"pgwake: \"", strings.Join(args, " "), r.stderr)
	}
	return r
}

// up starts the daemon in the background on a free port and records its
// pid. It returns what the admin API says of it and the run of `up`.
func (h *cliHarness) up(t *testing.T) (admin.Info, runResult) {
	t.Helper()
	r := h.run(t, "up", "-d", "--wait", "--listen", "127.0.0.1:0")
	if r.code != 0 {
		t.Fatalf("up -d --wait: exit %d\nstderr: %s", r.code, r.stderr)
	}
	info, err := h.admin().Info(t.Context())
	if err != nil {
		t.Fatalf("admin info after up: %v", err)
	}
	h.pids = append(h.pids, info.PID)
	if r.stdout != "" {
		t.Errorf("up -d wrote to stdout: %q", r.stdout)
	}
	return info, r
}

func (h *cliHarness) admin() *admin.Client {
	return admin.NewClient(filepath.Join(h.dir, "pgwake.sock"))
}

func (h *cliHarness) instanceOrEmpty() string {
	data, err := os.ReadFile(filepath.Join(h.dir, "state.json"))
	if err != nil {
		return ""
	}
	var st struct {
		Instance string `json:"instance"`
	}
	if json.Unmarshal(data, &st) != nil {
		return ""
	}
	return st.Instance
}

// projects is `pgwake ls --json`.
func (h *cliHarness) projects(t *testing.T) []admin.Project {
	t.Helper()
	out := h.ok(t, "ls", "--json")
	var ps []admin.Project
	if err := json.Unmarshal([]byte(out), &ps); err != nil {
		t.Fatalf("ls --json: %v\n%s", err, out)
	}
	return ps
}

// project is name's entry in `pgwake ls --json`; ok is false if absent.
func (h *cliHarness) project(t *testing.T, name string) (p admin.Project, ok bool) {
	t.Helper()
	for _, p := range h.projects(t) {
		if p.Name == name {
			return p, true
		}
	}
	return admin.Project{}, false
}

func (h *cliHarness) mustProject(t *testing.T, name string) admin.Project {
	t.Helper()
	p, ok := h.project(t, name)
	if !ok {
		t.Fatalf("ls --json does not list %q", name)
	}
	return p
}

func (h *cliHarness) projectFilter(t *testing.T, project string) client.Filters {
	t.Helper()
	inst := h.instanceOrEmpty()
	if inst == "" {
		t.Fatal("no instance id in state.json")
	}
	return make(client.Filters).Add("label", dockerbackend.LabelInstance+"="+inst, dockerbackend.LabelProject+"="+project)
}

// container inspects project's container; ok is false if there is none.
func (h *cliHarness) container(t *testing.T, project string) (c container.InspectResponse, ok bool) {
	t.Helper()
	ctx := t.Context()
	cs, err := h.docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: h.projectFilter(t, project)})
	if err != nil {
		t.Fatalf("list containers: %v", err)
	}
	switch len(cs.Items) {
	case 0:
		return container.InspectResponse{}, false
	case 1:
	default:
		t.Fatalf("%d containers for project %q, want 1", len(cs.Items), project)
	}
	res, err := h.docker.ContainerInspect(ctx, cs.Items[0].ID, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatalf("inspect container: %v", err)
	}
	if res.Container.State == nil {
		t.Fatalf("container %s has no state", res.Container.Name)
	}
	return res.Container, true
}

func (h *cliHarness) mustContainer(t *testing.T, project string) container.InspectResponse {
	t.Helper()
	c, ok := h.container(t, project)
	if !ok {
		t.Fatalf("project %q has no container", project)
	}
	return c
}

// volume returns the name of project's data volume, "" if there is none.
func (h *cliHarness) volume(t *testing.T, project string) string {
	t.Helper()
	vs, err := h.docker.VolumeList(t.Context(), client.VolumeListOptions{Filters: h.projectFilter(t, project)})
	if err != nil {
		t.Fatalf("list volumes: %v", err)
	}
	switch len(vs.Items) {
	case 0:
		return ""
	case 1:
		return vs.Items[0].Name
	}
	t.Fatalf("%d volumes for project %q, want 1", len(vs.Items), project)
	return ""
}

// connect opens a pgx connection to project through the proxy, using the
// URL `pgwake url` prints.
func (h *cliHarness) connect(t *testing.T, project string) *pgx.Conn {
	t.Helper()
	url := strings.TrimSpace(h.ok(t, "url", project))
	ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect to %s: %v", project, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func (h *cliHarness) exec(t *testing.T, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// notes returns the rows of the notes table, in insertion order.
func (h *cliHarness) notes(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(t.Context(), "select body from notes order by id")
	if err != nil {
		t.Fatalf("select notes: %v", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("select notes: %v", err)
	}
	return got
}

func (h *cliHarness) writeNote(t *testing.T, project, body string) {
	t.Helper()
	conn := h.connect(t, project)
	h.exec(t, conn, "create table if not exists notes (id serial primary key, body text not null)")
	h.exec(t, conn, "insert into notes (body) values ($1)", body)
	conn.Close(t.Context())
}

func (h *cliHarness) wantNotes(t *testing.T, project string, want ...string) {
	t.Helper()
	conn := h.connect(t, project)
	got := h.notes(t, conn)
	conn.Close(t.Context())
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("notes in %s = %q, want %q", project, got, want)
	}
}

// TestIntegrationRestart: data written through the proxy survives pgwake
// down (which stops the container cleanly) and up.
func TestIntegrationRestart(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	info, _ := h.up(t)
	if info.Listen == "" || strings.HasSuffix(info.Listen, ":0") {
		t.Errorf("daemon listens on %q, want the real port", info.Listen)
	}

	created := h.ok(t, "create", "app")
	url := h.ok(t, "url", "app")
	if !strings.HasPrefix(url, "postgres://") || strings.Count(url, "\n") != 1 {
		t.Errorf("url %q, want a one-line postgres:// URL", url)
	}
	// create prints the same URL without its password (CI logs).
	pw := h.mustProject(t, "app")
	if bare := strings.Replace(url, ":"+passwordOf(t, pw.URL)+"@", "@", 1); created != bare {
		t.Errorf("create printed %q, want %q", created, bare)
	}
	_, port, _ := net.SplitHostPort(info.Listen)
	if _, err := strconv.Atoi(port); err != nil || port == "0" {
		t.Errorf("daemon port %q is not a real port", port)
	}
	// The project's own port: every database of its server is reachable.
	own := h.mustProject(t, "app").Port
	if own == 0 || !strings.Contains(url, "@127.0.0.1:"+strconv.Itoa(own)+"/app?") {
		t.Errorf("url %q does not point at the project's own port %d and database app", url, own)
	}

	h.writeNote(t, "app", "written before down")
	if c := h.mustContainer(t, "app"); !c.State.Running {
		t.Fatalf("container is %s after a query, want running", c.State.Status)
	}

	r := h.run(t, "down")
	if r.code != 0 || !strings.Contains(r.stderr, "pgwake stopped") {
		t.Fatalf("down: exit %d, stderr %q", r.code, r.stderr)
	}
	c := h.mustContainer(t, "app")
	if c.State.Running || c.State.Paused {
		t.Errorf("container is %s after down, want stopped", c.State.Status)
	}
	if c.State.ExitCode != 0 || c.State.OOMKilled {
		t.Errorf("container exited with %d after down, want 0 (Postgres fast shutdown, not a kill)", c.State.ExitCode)
	}
	if r := h.fail(t, "ls"); r.code != 1 || !strings.Contains(r.stderr, "pgwake is not running") {
		t.Errorf("ls after down: exit %d stderr %q, want 1 and not running", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(h.dir, "pgwake.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("admin socket left behind after down: %v", err)
	}

	h.up(t)
	p := h.mustProject(t, "app")
	if p.State != "sleeping" {
		t.Errorf("after up, app is %q, want sleeping (down stopped it)", p.State)
	}
	if p.Image != h.image || p.SleepMode != "stop" || p.Database != "app" {
		t.Errorf("ls --json: %+v; want image %s, sleep mode stop, database app", p, h.image)
	}
	h.wantNotes(t, "app", "written before down")
	p = h.mustProject(t, "app")
	if p.State != "running" || p.Wakes != 1 {
		t.Errorf("after a query, app is %q with %d wakes, want running with 1", p.State, p.Wakes)
	}
	if ps := h.projects(t); len(ps) != 1 {
		t.Errorf("ls --json lists %d projects, want 1", len(ps))
	}
	h.ok(t, "down")
}

// TestIntegrationSIGKILL: a daemon killed with SIGKILL leaves the project's
// container running; the next daemon adopts it without a restart.
func TestIntegrationSIGKILL(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	info, _ := h.up(t)
	h.ok(t, "create", "app")
	h.writeNote(t, "app", "written before the kill")
	before := h.mustContainer(t, "app")
	if !before.State.Running {
		t.Fatalf("container is %s, want running", before.State.Status)
	}
	if p := h.mustProject(t, "app"); p.State != "running" || p.Wakes != 1 {
		t.Fatalf("before the kill, app is %q with %d wakes, want running with 1", p.State, p.Wakes)
	}

	if err := syscall.Kill(info.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", info.PID, err)
	}
	h.waitGone(t, info.PID)
	if r := h.fail(t, "ls"); !strings.Contains(r.stderr, "pgwake is not running") {
		t.Errorf("ls after kill -9: stderr %q, want not running", r.stderr)
	}

	h.up(t) // over the stale admin socket
	p := h.mustProject(t, "app")
	if p.State != "running" || p.Wakes != 0 {
		t.Errorf("after restart, app is %q with %d wakes; want running with 0 (adopted, not woken)", p.State, p.Wakes)
	}
	after := h.mustContainer(t, "app")
	if !after.State.Running || after.State.StartedAt != before.State.StartedAt || after.RestartCount != before.RestartCount {
		t.Errorf("container restarted: running %v, started %s (was %s), restarts %d (was %d)",
			after.State.Running, after.State.StartedAt, before.State.StartedAt, after.RestartCount, before.RestartCount)
	}
	if after.ID != before.ID {
		t.Errorf("container recreated: %s, was %s", after.ID, before.ID)
	}
	h.wantNotes(t, "app", "written before the kill")
	if p := h.mustProject(t, "app"); p.Wakes != 0 || p.State != "running" {
		t.Errorf("after a query on the adopted server, app is %q with %d wakes, want running with 0", p.State, p.Wakes)
	}
	if c := h.mustContainer(t, "app"); c.State.StartedAt != before.State.StartedAt {
		t.Errorf("the query restarted the container: started %s, was %s", c.State.StartedAt, before.State.StartedAt)
	}
	h.ok(t, "down")
}

// TestIntegrationCommands walks through the commands a user runs day to day.
func TestIntegrationCommands(t *testing.T) {
	t.Parallel()
	h := newHarness(t)

	info, r := h.up(t)
	t.Run("up reports the address it serves on", func(t *testing.T) {
		if !strings.Contains(r.stderr, info.Listen) {
			t.Errorf("up stderr %q does not name the address %s", r.stderr, info.Listen)
		}
	})

	t.Run("create rejects invalid names", func(t *testing.T) {
		for _, name := range []string{"Bad_Name", "1app", "my app", "a.b", "", strings.Repeat("a", 41)} {
			r := h.fail(t, "create", name)
			if r.code != 2 || !strings.Contains(r.stderr, "invalid project name") {
				t.Errorf("create %q: exit %d stderr %q, want 2 (usage) and invalid project name", name, r.code, r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("create %q printed %q to stdout", name, r.stdout)
			}
		}
		if ps := h.projects(t); len(ps) != 0 {
			t.Errorf("failed creates left projects: %+v", ps)
		}
	})

	t.Run("create rejects bad settings", func(t *testing.T) {
		for _, args := range [][]string{
			{"create", "x", "--sleep-mode", "hibernate"},
			{"create", "x", "--sleep-after", "soon"},
			{"create", "x", "--sleep-after", "-1m"},
		} {
			// Exit 2 when the CLI's own config validation catches the value
			// (these flags share the config keys' names), 1 when the daemon
			// does.
			r := h.fail(t, args...)
			if (r.code != 1 && r.code != 2) || !strings.Contains(r.stderr, "sleep") {
				t.Errorf("%q: exit %d stderr %q, want 1 or 2 and a word on the bad setting", args, r.code, r.stderr)
			}
		}
		if _, ok := h.project(t, "x"); ok {
			t.Error("a rejected create left project x behind")
		}
	})

	h.ok(t, "create", "app", "--sleep-after", "0")
	t.Run("create twice", func(t *testing.T) {
		r := h.fail(t, "create", "app")
		if r.code != 1 || !strings.Contains(r.stderr, "already exists") {
			t.Errorf("second create: exit %d stderr %q, want 1 and already exists", r.code, r.stderr)
		}
		if ps := h.projects(t); len(ps) != 1 || ps[0].SleepAfterMS != 0 {
			t.Errorf("after the second create: %+v, want app alone, never sleeping", ps)
		}
	})

	t.Run("unknown project", func(t *testing.T) {
		for _, args := range [][]string{{"url", "nope"}, {"wake", "nope"}, {"sleep", "nope"}, {"rm", "nope"}, {"logs", "nope"}, {"psql", "nope"}} {
			r := h.fail(t, args...)
			if r.code != 1 || !strings.Contains(r.stderr, "nope") {
				t.Errorf("%q: exit %d stderr %q, want 1 naming the project", args, r.code, r.stderr)
			}
		}
	})

	t.Run("psql", func(t *testing.T) {
		r := h.run(t, "psql", "app", "--", "-Atc", "select 42")
		if r.code != 0 || r.stdout != "42\n" {
			t.Errorf("psql app -- -Atc 'select 42': exit %d stdout %q stderr %q, want 42", r.code, r.stdout, r.stderr)
		}
		r = h.run(t, "psql", "app", "--", "-Atc", "select nosuchcolumn")
		if r.code == 0 || !strings.Contains(r.stderr, "nosuchcolumn") || !strings.Contains(r.stderr, "pgwake: psql exited with status") {
			t.Errorf("failing psql: exit %d stderr %q, want psql's error and its status", r.code, r.stderr)
		}
	})

	t.Run("logs", func(t *testing.T) {
		out := h.ok(t, "logs", "app")
		if !strings.Contains(out, "database system is ready to accept connections") {
			t.Errorf("logs app lacks Postgres's ready line:\n%s", out)
		}
		out = h.ok(t, "logs", "--tail", "1", "app")
		if strings.Count(out, "\n") != 1 {
			t.Errorf("logs --tail 1 printed %d lines: %q", strings.Count(out, "\n"), out)
		}
	})

	t.Run("sleep and wake", func(t *testing.T) {
		if p := h.mustProject(t, "app"); p.State != "running" {
			t.Fatalf("app is %q after psql, want running", p.State)
		}
		wakes := h.mustProject(t, "app").Wakes
		r := h.run(t, "sleep", "app")
		if r.code != 0 || r.stderr != "app is sleeping\n" {
			t.Errorf("sleep app: exit %d stderr %q", r.code, r.stderr)
		}
		if p := h.mustProject(t, "app"); p.State != "sleeping" {
			t.Errorf("after sleep, app is %q, want sleeping", p.State)
		}
		if c := h.mustContainer(t, "app"); c.State.Running {
			t.Errorf("after sleep, the container is %s", c.State.Status)
		}
		h.ok(t, "sleep", "app") // already asleep: fine

		r = h.run(t, "wake", "app")
		if r.code != 0 || !strings.HasPrefix(r.stderr, "app is running (last wake took ") {
			t.Errorf("wake app: exit %d stderr %q", r.code, r.stderr)
		}
		p := h.mustProject(t, "app")
		if p.State != "running" || p.Wakes != wakes+1 {
			t.Errorf("after wake, app is %q with %d wakes, want running with %d", p.State, p.Wakes, wakes+1)
		}
		if c := h.mustContainer(t, "app"); !c.State.Running {
			t.Errorf("after wake, the container is %s", c.State.Status)
		}
		h.ok(t, "wake", "app") // already awake: fine
		if p := h.mustProject(t, "app"); p.Wakes != wakes+1 {
			t.Errorf("waking an awake project counted a wake: %d, want %d", p.Wakes, wakes+1)
		}

		table := h.ok(t, "ls")
		if !strings.HasPrefix(table, "NAME") || !strings.Contains(table, "app") || !strings.Contains(table, "running") {
			t.Errorf("ls table:\n%s", table)
		}
	})

	var vol string
	t.Run("rm keeps the volume", func(t *testing.T) {
		h.writeNote(t, "app", "kept by rm")
		vol = h.volume(t, "app")
		if vol == "" {
			t.Fatal("app has no data volume")
		}
		r := h.run(t, "rm", "app")
		if r.code != 0 || !strings.Contains(r.stderr, "volume is kept") {
			t.Fatalf("rm app: exit %d stderr %q", r.code, r.stderr)
		}
		if _, ok := h.project(t, "app"); ok {
			t.Error("ls --json still lists app after rm")
		}
		if _, ok := h.container(t, "app"); ok {
			t.Error("app's container survived rm")
		}
		if _, err := h.docker.VolumeInspect(t.Context(), vol, client.VolumeInspectOptions{}); err != nil {
			t.Errorf("volume %s after rm: %v; want it kept", vol, err)
		}
	})

	t.Run("create after rm reuses the data", func(t *testing.T) {
		// rm says: "its data volume is kept (create it again to reuse it)".
		h.ok(t, "create", "app")
		if got := h.volume(t, "app"); got != vol {
			t.Errorf("recreated app uses volume %q, want the kept %q", got, vol)
		}
		url := strings.TrimSpace(h.ok(t, "url", "app"))
		ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatalf("connect to the recreated app: %v", err)
		}
		defer conn.Close(context.Background())
		if got := h.notes(t, conn); len(got) != 1 || got[0] != "kept by rm" {
			t.Errorf("notes in the recreated app = %q, want [kept by rm]", got)
		}
	})

	t.Run("rm --volumes deletes the data", func(t *testing.T) {
		if _, ok := h.project(t, "app"); !ok {
			h.ok(t, "create", "app")
		}
		r := h.run(t, "rm", "--volumes", "app")
		if r.code != 0 || !strings.Contains(r.stderr, "and its data") {
			t.Fatalf("rm --volumes app: exit %d stderr %q", r.code, r.stderr)
		}
		if _, err := h.docker.VolumeInspect(t.Context(), vol, client.VolumeInspectOptions{}); !cerrdefs.IsNotFound(err) {
			t.Errorf("volume %s after rm --volumes: %v; want not found", vol, err)
		}
		if v := h.volume(t, "app"); v != "" {
			t.Errorf("volume %s left after rm --volumes", v)
		}
		if _, ok := h.container(t, "app"); ok {
			t.Error("app's container survived rm --volumes")
		}
		if ps := h.projects(t); len(ps) != 0 {
			t.Errorf("projects after rm: %+v", ps)
		}
	})

	t.Run("second up", func(t *testing.T) {
		// In the background with the same configuration: nothing to do.
		r := h.run(t, "up", "-d", "--wait", "--listen", "127.0.0.1:0")
		if r.code != 0 || !strings.Contains(r.stderr, "already running with this configuration") {
			t.Errorf("second up -d --wait: exit %d stderr %q, want 0 and already running", r.code, r.stderr)
		}
		// In the foreground it would be a second daemon.
		r = h.runTimeout(t, time.Minute, "up", "--listen", "127.0.0.1:0")
		if r.code != 1 || !strings.Contains(r.stderr, "already running") {
			t.Errorf("second foreground up: exit %d stderr %q, want 1 and already running", r.code, r.stderr)
		}
		if got, err := h.admin().Info(t.Context()); err != nil || got.PID != info.PID {
			t.Errorf("first daemon after the second up: %+v, %v; want pid %d serving", got, err, info.PID)
		}
	})

	t.Run("down twice", func(t *testing.T) {
		r := h.run(t, "down")
		if r.code != 0 || !strings.Contains(r.stderr, "pgwake stopped") {
			t.Fatalf("down: exit %d stderr %q", r.code, r.stderr)
		}
		r = h.run(t, "down")
		if r.code != 0 || !strings.Contains(r.stderr, "not running") {
			t.Errorf("down when not running: exit %d stderr %q, want 0 and not running", r.code, r.stderr)
		}
	})

	t.Run("up that cannot listen", func(t *testing.T) {
		h.ok(t, "down")
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		// With or without --wait, -d prints the daemon's own error.
		for _, args := range [][]string{
			{"up", "-d", "--wait", "--listen", ln.Addr().String()},
			{"up", "-d", "--listen", ln.Addr().String()},
		} {
			r := h.run(t, args...)
			last := lastLine(t, r)
			if r.code != 1 || last != "pgwake: listen for clients: listen tcp "+ln.Addr().String()+": bind: address already in use" {
				t.Errorf("%q on a busy port: exit %d, last line %q; want 1 and the daemon's own error", args, r.code, last)
			}
		}
		log, err := os.ReadFile(filepath.Join(h.dir, "pgwake.log"))
		if err != nil || !strings.Contains(string(log), "address already in use") {
			t.Errorf("pgwake.log does not explain the failure (%v):\n%s", err, log)
		}
	})
}
