// Package testenv provides the shared fixtures of pgwake's integration tests:
// a Docker client and a Postgres image that needs no registry access.
//
// CI and development machines may not be able to pull postgres:NN, so by
// default the tests use an image built locally from the host's Debian
// postgresql packages by testdata/postgres-image/build.sh. That image follows
// the official postgres image's contract, so the code under test cannot tell
// the difference.
package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/pgwake/pgwake/internal/dockerbackend"
)

// DefaultImage is the tag build.sh produces.
const DefaultImage = "pgwake-test/postgres:15"

// ImageEnv names the environment variable that overrides the image, e.g.
// PGWAKETEST_IMAGE=postgres:17 to run the tests against an official image.
const ImageEnv = "PGWAKETEST_IMAGE"

// buildTimeout bounds build.sh, which normally takes seconds; a hung docker
// import should fail the test rather than eat go test's whole -timeout.
const buildTimeout = 5 * time.Minute

// DockerClient returns a client for the engine named by the usual DOCKER_*
// environment variables, verified with a ping and closed when the test ends.
// Tests are skipped under -short; otherwise an unreachable engine is a test
// failure, not a skip, so a broken CI setup cannot pass silently.
func DockerClient(t testing.TB) *client.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test needs Docker; skipped with -short")
	}
	cli, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatalf("testenv: docker client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	// Negotiating here, once, lets the client talk to older engines (CI has
	// API 1.41) instead of failing later on the first real request.
	if _, err := cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		t.Fatalf("testenv: Docker engine not reachable (%v); integration tests need one "+
			"(check DOCKER_HOST / the docker socket, or use go test -short to skip them)", err)
	}
	return cli
}

// imageFresh is set once this process has had build.sh check the image.
var imageFresh atomic.Bool

// PostgresImage returns the Postgres image reference the integration tests
// should run, making sure the engine has it.
//
// With $PGWAKETEST_IMAGE set, that image is used as is and must already be
// present (building it here would put a Debian 15 image under a name such as
// postgres:17). Otherwise DefaultImage is built with build.sh if missing.
func PostgresImage(t testing.TB) string {
	t.Helper()
	cli := DockerClient(t)
	ctx := t.Context()

	ref := os.Getenv(ImageEnv)
	if ref != "" {
		if !imagePresent(ctx, t, cli, ref) {
			t.Fatalf("testenv: $%s=%s is not in the Docker engine; pull it first, or unset %s to use the locally built %s",
				ImageEnv, ref, ImageEnv, DefaultImage)
		}
		return ref
	}
	ref = DefaultImage
	if imagePresent(ctx, t, cli, ref) && imageFresh.Load() {
		return ref
	}

	// Test binaries of several packages run in parallel and may all find the
	// image missing; the lock makes one of them build it while the others
	// wait, and the re-check lets the waiters use the result. flock locks
	// belong to the open file, so this also serialises parallel tests within
	// one binary; the kernel drops the lock if the process dies.
	unlock := lockFile(t, filepath.Join(os.TempDir(), "pgwake-testenv-postgres-image.lock"))
	defer unlock()
	if imagePresent(ctx, t, cli, ref) && imageFresh.Load() {
		return ref
	}
	// Also when present, once per test binary: build.sh rebuilds an image
	// made from older inputs (its entrypoint changed) and is a no-op in
	// a fraction of a second otherwise.
	build(t, ref)
	imageFresh.Store(true)
	if !imagePresent(ctx, t, cli, ref) {
		t.Fatalf("testenv: build.sh succeeded but image %s is still missing", ref)
	}
	return ref
}

// CrashingImage returns an image made from PostgresImage whose entrypoint
// writes the line "pgwake-test: deliberate crash before serving" to stderr
// and exits with code 3 at once, for tests of how a server that dies on
// start is reported. It is made offline (a created, never started container
// of the Postgres image, committed with a new ENTRYPOINT) once per engine,
// under a file lock as the Postgres image is, and made again when that
// image changes.
func CrashingImage(t testing.TB) string {
	t.Helper()
	const (
		ref       = "pgwake-test/crashing:latest"
		baseLabel = "io.pgwake.test.crashing-base"
		script    = "echo 'pgwake-test: deliberate crash before serving' >&2; exit 3"
	)
	base := PostgresImage(t)
	cli := DockerClient(t)
	ctx := t.Context()
	baseImg, err := cli.ImageInspect(ctx, base)
	if err != nil {
		t.Fatalf("testenv: inspect image %s: %v", base, err)
	}
	upToDate := func() bool {
		img, err := cli.ImageInspect(ctx, ref)
		switch {
		case cerrdefs.IsNotFound(err):
			return false
		case err != nil:
			t.Fatalf("testenv: inspect image %s: %v", ref, err)
		}
		return img.Config != nil && img.Config.Labels[baseLabel] == baseImg.ID
	}
	if upToDate() {
		return ref
	}
	unlock := lockFile(t, filepath.Join(os.TempDir(), "pgwake-testenv-crashing-image.lock"))
	defer unlock()
	if upToDate() {
		return ref
	}
	// The label goes on the container (so a leftover is recognisable) and
	// from there into the image, where the check above finds it.
	c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{Config: &container.Config{
		Image:  base,
		Labels: map[string]string{baseLabel: baseImg.ID},
	}})
	if err != nil {
		t.Fatalf("testenv: create a container of %s: %v", base, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if _, err := cli.ContainerRemove(rctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("testenv: remove container %s: %v", c.ID, err)
		}
	}()
	entrypoint, err := json.Marshal([]string{"/bin/sh", "-c", script})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.ContainerCommit(ctx, c.ID, client.ContainerCommitOptions{
		Reference: ref,
		Comment:   "pgwake test image: exits with code 3 before serving",
		Changes:   []string{"ENTRYPOINT " + string(entrypoint)},
		NoPause:   true,
	}); err != nil {
		t.Fatalf("testenv: commit %s: %v", ref, err)
	}
	if !upToDate() {
		t.Fatalf("testenv: committed %s but it does not carry %s=%s", ref, baseLabel, baseImg.ID)
	}
	return ref
}

// imagePresent reports whether the engine has ref; errors other than "not
// found" fail the test.
func imagePresent(ctx context.Context, t testing.TB, cli *client.Client, ref string) bool {
	t.Helper()
	_, err := cli.ImageInspect(ctx, ref)
	switch {
	case err == nil:
		return true
	case cerrdefs.IsNotFound(err):
		return false
	default:
		t.Fatalf("testenv: inspect image %s: %v", ref, err)
		return false
	}
}

// build runs testdata/postgres-image/build.sh for ref.
func build(t testing.TB, ref string) {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	script := filepath.Join(root, "testdata", "postgres-image", "build.sh")
	ctx, cancel := context.WithTimeout(t.Context(), buildTimeout)
	defer cancel()
	// Run through bash so a lost executable bit does not matter.
	cmd := exec.CommandContext(ctx, "bash", script, ref)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("testenv: %s %s: %v\n%s", script, ref, err, out.Bytes())
	}
	t.Logf("testenv: built %s in %v", ref, time.Since(start).Round(time.Millisecond))
}

// repoRoot walks up from the working directory (the package directory under
// go test) to the directory holding go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// lockFile takes an exclusive flock on path, waiting as long as needed, and
// returns the function that releases it.
func lockFile(t testing.TB, path string) (unlock func()) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("testenv: open lock file: %v", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		t.Fatalf("testenv: lock %s: %v", path, err)
	}
	return func() { _ = f.Close() } // closing the file releases the lock
}

// RemoveInstance deletes every container and volume labelled with a pgwake
// instance id (dev.pgwake.instance), so a test leaves nothing behind.
func RemoveInstance(t testing.TB, cli *client.Client, instance string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := make(client.Filters).Add("label", dockerbackend.LabelInstance+"="+instance)
	cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		t.Errorf("cleanup: list containers: %v", err)
	}
	for _, c := range cs.Items {
		if _, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("cleanup: remove container %s: %v", c.ID, err)
		}
	}
	vs, err := cli.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		t.Errorf("cleanup: list volumes: %v", err)
	}
	for _, v := range vs.Items {
		if _, err := cli.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("cleanup: remove volume %s: %v", v.Name, err)
		}
	}
}

// StopLocalServers stops (immediate shutdown: the data is thrown away next)
// every postmaster whose data directory is root/*/data, waits for them to
// exit, and deletes root. A pid in a postmaster.pid counts only while it is
// that directory's server (see runsIn): a server killed with SIGKILL leaves
// its file behind, and the kernel may have given the pid to any process
// since, a Docker container's Postgres among them (on the host its
// processes are ordinary ones), which another test would see die.
func StopLocalServers(root string) {
	pidfiles, _ := filepath.Glob(filepath.Join(root, "*", "data", "postmaster.pid"))
	type server struct {
		pid  int
		data string
	}
	var servers []server
	for _, pf := range pidfiles {
		data, err := os.ReadFile(pf)
		if err != nil {
			continue
		}
		first, _, _ := strings.Cut(string(data), "\n")
		pid, err := strconv.Atoi(strings.TrimSpace(first))
		if dir := filepath.Dir(pf); err == nil && pid > 0 && runsIn(pid, dir) {
			servers = append(servers, server{pid, dir})
			_ = syscall.Kill(pid, syscall.SIGQUIT)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range servers {
		for time.Now().Before(deadline) && runsIn(s.pid, s.data) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	_ = os.RemoveAll(root)
}

// runsIn reports whether process pid exists and works in directory dir: a
// postmaster changes into its data directory at start, and nothing else
// of these tests works there. A zombie has no working directory, so it is
// gone already. Without /proc (not Linux) it reports whether pid exists.
func runsIn(pid int, dir string) bool {
	if _, err := os.Stat("/proc/self/cwd"); err != nil {
		return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	}
	want, err := os.Stat(dir)
	if err != nil {
		return false
	}
	got, err := os.Stat(fmt.Sprintf("/proc/%d/cwd", pid))
	return err == nil && os.SameFile(got, want)
}

// PauseOutside pauses a container as someone outside pgwake would, trying
// again while runc gives up freezing processes that keep changing state
// (a server booting on a loaded machine: "OCI runtime pause failed: unable
// to freeze"), as a user would and as pgwake's own pause does.
func PauseOutside(ctx context.Context, cli *client.Client, name string) error {
	var err error
	for attempt, delay := 0, 50*time.Millisecond; attempt < 8; attempt, delay = attempt+1, delay*2 {
		if _, err = cli.ContainerPause(ctx, name, client.ContainerPauseOptions{}); err == nil || !strings.Contains(err.Error(), "unable to freeze") || attempt == 7 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
	}
	return err
}
