package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/dockerbackend"
	"github.com/pgwake/pgwake/internal/localbackend"
	"github.com/pgwake/pgwake/internal/testenv"
)

// kit is one backend the shared proxy suite runs against, with the means
// to observe and disturb its servers from outside pgwake.
type kit interface {
	name() string
	image(t testing.TB) string
	newBackend(t testing.TB, instance string, log *slog.Logger) backend.Backend
	// startCounter returns a function counting server starts since now, as
	// the runtime itself records them (not as pgwake counts them).
	startCounter(t testing.TB, h *harness, spec backend.Spec) func() int
	// stopOutside stops a project's server behind pgwake's back.
	stopOutside(t testing.TB, h *harness, spec backend.Spec)
	// brokenSpec returns a project whose wake always fails, and a piece of
	// the reason clients must be told.
	brokenSpec(t testing.TB, h *harness) (backend.Spec, string)
	// crashingProject registers a project whose server starts and then
	// exits before it ever serves, and returns pieces of the reason clients
	// must be told (the exit, a line of the server's own log).
	crashingProject(t testing.TB, h *harness) (backend.Spec, []string)
	// crash kills a project's server hard (SIGKILL), as the OOM killer or
	// a power cut would, and waits until it is gone.
	crash(t testing.TB, h *harness, spec backend.Spec)
	// reuseAddress arranges for taker's next start to get addr, the address
	// of a crashed server, where the runtime does not already hand freed
	// addresses out again.
	reuseAddress(t testing.TB, h *harness, taker backend.Spec, addr string)
	canPause() bool
}

// backendsEnv selects the kits (comma-separated); the default is docker.
// TestIntegrationLocalSuiteWithoutDocker runs the suite again with "local"
// and no reachable Docker engine, TestIntegrationKubernetesSuite with
// "kubernetes".
const backendsEnv = "PGWAKE_TEST_BACKENDS"

func kits() []kit {
	names := os.Getenv(backendsEnv)
	if names == "" {
		names = "docker"
	}
	var out []kit
	for _, n := range strings.Split(names, ",") {
		switch strings.TrimSpace(n) {
		case "docker":
			out = append(out, &dockerKit{})
		case "local":
			out = append(out, &localKit{})
		case "kubernetes":
			out = append(out, &kubeKit{})
		}
	}
	return out
}

// forEachBackend runs fn once per selected backend, in parallel subtests.
func forEachBackend(t *testing.T, fn func(t *testing.T, k kit)) {
	t.Parallel()
	for _, k := range kits() {
		t.Run(k.name(), func(t *testing.T) {
			t.Parallel()
			fn(t, k)
		})
	}
}

// forDocker is forEachBackend for what exists on the docker backend only
// (containers).
func forDocker(t *testing.T, fn func(t *testing.T, k kit)) {
	forEachBackend(t, func(t *testing.T, k kit) {
		if k.name() != "docker" {
			t.Skip("containers only exist on the docker backend")
		}
		fn(t, k)
	})
}

type dockerKit struct{}

func (dockerKit) name() string   { return "docker" }
func (dockerKit) canPause() bool { return true }

func (dockerKit) image(t testing.TB) string { return testenv.PostgresImage(t) }

func (dockerKit) newBackend(t testing.TB, instance string, log *slog.Logger) backend.Backend {
	docker := testenv.DockerClient(t)
	be, err := dockerbackend.New(t.Context(), dockerbackend.Options{Instance: instance, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	t.Cleanup(func() { testenv.RemoveInstance(t, docker, instance) })
	return be
}

func containerName(h *harness, project string) string { return "pgwake-" + h.instance + "-" + project }

// startCounter counts the start and unpause events the Docker engine
// recorded for the project.
func (dockerKit) startCounter(t testing.TB, h *harness, spec backend.Spec) func() int {
	docker := testenv.DockerClient(t)
	since := time.Now()
	return func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		f := make(client.Filters).
			Add("type", string(events.ContainerEventType)).
			Add("label", dockerbackend.LabelInstance+"="+h.instance).
			Add("label", dockerbackend.LabelProject+"="+spec.Name).
			Add("event", "start", "unpause")
		ts := func(t time.Time) string { return fmt.Sprintf("%d.%09d", t.Unix(), t.Nanosecond()) }
		// With until in the past the engine replays its history and closes
		// the stream, so the count is final.
		res := docker.Events(ctx, client.EventsListOptions{Filters: f, Since: ts(since), Until: ts(time.Now())})
		n := 0
		for {
			select {
			case <-res.Messages:
				n++
			case err := <-res.Err:
				if err != nil && !errors.Is(err, io.EOF) {
					t.Fatalf("docker events: %v", err)
				}
				return n
			}
		}
	}
}

func (dockerKit) stopOutside(t testing.TB, h *harness, spec backend.Spec) {
	dockerCLI(t, "stop", containerName(h, spec.Name))
}

func (dockerKit) brokenSpec(t testing.TB, h *harness) (backend.Spec, string) {
	// An image that is neither present nor pullable here.
	return backend.Spec{Name: "broken", Image: "pgwake-test/does-not-exist:0", User: "postgres", Password: "x", Database: "broken"}, "does-not-exist"
}

func (dockerKit) crashingProject(t testing.TB, h *harness) (backend.Spec, []string) {
	spec := h.newSpec("crashy")
	spec.Image = testenv.CrashingImage(t)
	h.register(spec, backend.SleepStop, 0)
	return spec, []string{"exited with code 3", "deliberate crash before serving"}
}

func (dockerKit) crash(t testing.TB, h *harness, spec backend.Spec) {
	dockerCLI(t, "kill", "--signal", "KILL", containerName(h, spec.Name))
}

// reuseAddress does nothing: Docker hands out the lowest free bridge
// address, so the next container started usually gets the crashed one's.
func (dockerKit) reuseAddress(testing.TB, *harness, backend.Spec, string) {}

func dockerCLI(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("docker", args...).CombinedOutput(); err != nil {
		t.Fatalf("docker %v: %v\n%s", args, err, out)
	}
}

type localKit struct{}

func (*localKit) name() string             { return "local" }
func (*localKit) canPause() bool           { return false }
func (*localKit) image(testing.TB) string  { return "" }
func (k *localKit) root(h *harness) string { return filepath.Join(os.TempDir(), "pgwl-"+h.instance) }

func (k *localKit) newBackend(t testing.TB, instance string, log *slog.Logger) backend.Backend {
	// Not t.TempDir: when the tests run as root, postgres runs as another
	// user, which must be able to reach its directories.
	root := filepath.Join(os.TempDir(), "pgwl-"+instance)
	be, err := localbackend.New(t.Context(), localbackend.Options{Root: root, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.StopLocalServers(root) })
	return be
}

func readPid(pidfile string) int {
	data, err := os.ReadFile(pidfile)
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(first))
	return pid
}

func waitGone(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// startCounter counts "ready to accept connections" in the server's own
// log: each line is one server start.
func (k *localKit) startCounter(t testing.TB, h *harness, spec backend.Spec) func() int {
	logf := filepath.Join(k.root(h), spec.Name, "postgres.log")
	count := func() int {
		data, _ := os.ReadFile(logf)
		return strings.Count(string(data), "ready to accept connections")
	}
	base := count()
	return func() int { return count() - base }
}

// stopOutside sends the postmaster SIGINT (fast shutdown), as an operator's
// pg_ctl stop would, and waits for it to exit.
func (k *localKit) stopOutside(t testing.TB, h *harness, spec backend.Spec) {
	pid := readPid(filepath.Join(k.root(h), spec.Name, "data", "postmaster.pid"))
	if pid <= 0 {
		t.Fatalf("no running server for %s", spec.Name)
	}
	if err := syscall.Kill(pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if !waitGone(pid, 30*time.Second) {
		t.Fatalf("server %d did not stop", pid)
	}
}

// crashingProject makes a server whose configuration Postgres rejects at
// start: the postmaster exits before it serves.
func (k *localKit) crashingProject(t testing.TB, h *harness) (backend.Spec, []string) {
	spec := h.newSpec("crashy")
	h.register(spec, backend.SleepStop, 0)
	conf := filepath.Join(k.root(h), spec.Name, "data", "postgresql.conf")
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("\nshared_buffers = 'not-a-size'\n"); err != nil {
		t.Fatal(err)
	}
	return spec, []string{"shared_buffers"}
}

func (k *localKit) crash(t testing.TB, h *harness, spec backend.Spec) {
	pid := readPid(filepath.Join(k.root(h), spec.Name, "data", "postmaster.pid"))
	if pid <= 0 {
		t.Fatalf("no running server for %s", spec.Name)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !waitGone(pid, 30*time.Second) {
		t.Fatalf("server %d did not die", pid)
	}
}

// reuseAddress writes addr's port as the one taker's server used last,
// which the local backend takes again when it is free.
func (k *localKit) reuseAddress(t testing.TB, h *harness, taker backend.Spec, addr string) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(k.root(h), taker.Name, "port"), []byte(port+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (k *localKit) brokenSpec(t testing.TB, h *harness) (backend.Spec, string) {
	// A regular file where the project's directory must go: initdb cannot
	// even start.
	if err := os.MkdirAll(k.root(h), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(k.root(h), "broken"), []byte("in the way"), 0o644); err != nil {
		t.Fatal(err)
	}
	return backend.Spec{Name: "broken", User: "postgres", Password: "x", Database: "broken"}, "project dir"
}

// TestIntegrationLocalSuiteWithoutDocker runs the whole shared suite again
// on the local backend, in a child test process that cannot reach any
// Docker engine: the local backend must not need one.
func TestIntegrationLocalSuiteWithoutDocker(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test; skipped with -short")
	}
	if os.Getenv(backendsEnv) != "" {
		t.Skip("already a backend-selected run")
	}
	if _, err := localbackend.FindBinDir(); err != nil {
		t.Fatalf("the local backend suite needs PostgreSQL server binaries: %v", err)
	}
	t.Parallel()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestIntegration", "-test.v", "-test.count=1",
		"-test.skip=^TestIntegrationLocalSuiteWithoutDocker$")
	cmd.Env = append(os.Environ(), backendsEnv+"=local", "DOCKER_HOST=unix:///nonexistent/docker.sock")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("shared suite on the local backend failed: %v\n%s", err, out)
	}
	passed := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "--- PASS: TestIntegration") && strings.Contains(line, "/local") {
			passed++
		}
	}
	if passed < 8 {
		t.Fatalf("only %d local subtests passed; output:\n%s", passed, out)
	}
	t.Logf("%d shared-suite tests passed on the local backend without Docker", passed)
}

// TestIntegrationKubernetesSuite runs the whole shared suite again on the
// kubernetes backend, in a child test process, against a real control
// plane with a simulated node (see kubeKit).
func TestIntegrationKubernetesSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test; skipped with -short")
	}
	if os.Getenv(backendsEnv) != "" {
		t.Skip("already a backend-selected run")
	}
	t.Parallel()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestIntegration", "-test.v", "-test.count=1",
		"-test.skip=^(TestIntegrationLocalSuiteWithoutDocker|TestIntegrationKubernetesSuite)$")
	cmd.Env = append(os.Environ(), backendsEnv+"=kubernetes")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("shared suite on the kubernetes backend failed: %v\n%s", err, out)
	}
	passed := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "--- PASS: TestIntegration") && strings.Contains(line, "/kubernetes") {
			passed++
		}
	}
	if passed < 8 {
		t.Fatalf("only %d kubernetes subtests passed; output:\n%s", passed, out)
	}
	t.Logf("%d shared-suite tests passed on the kubernetes backend", passed)
}
