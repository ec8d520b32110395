package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/dockerbackend"
)

// lastLine is the last line a command wrote to stderr; it checks that
// main's "pgwake: " error line is the only one.
func lastLine(t *testing.T, r runResult) string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "pgwake: ") || strings.Count(r.stderr, "pgwake: ") != 1 {
		t.Errorf("stderr %q: want one error line, last, starting \"pgwake: \"", r.stderr)
	}
	return last
}

// foreignContainer creates (without starting) a container named name
// without pgwake's labels, removed when the test ends.
func (h *cliHarness) foreignContainer(t *testing.T, name string) string {
	t.Helper()
	res, err := h.docker.ContainerCreate(t.Context(), client.ContainerCreateOptions{
		Name: name, Config: &container.Config{Image: h.image},
	})
	if err != nil {
		t.Fatalf("create container %q: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := h.docker.ContainerRemove(ctx, res.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("cleanup: remove container %q: %v", name, err)
		}
	})
	return res.ID
}

func (h *cliHarness) containerExists(t *testing.T, id string) bool {
	t.Helper()
	_, err := h.docker.ContainerInspect(t.Context(), id, client.ContainerInspectOptions{})
	if err != nil && !cerrdefs.IsNotFound(err) {
		t.Fatalf("inspect %s: %v", id, err)
	}
	return err == nil
}

// instanceObjects counts the containers and volumes carrying this
// instance's label.
func (h *cliHarness) instanceObjects(t *testing.T) (containers, volumes int) {
	t.Helper()
	f := make(client.Filters).Add("label", dockerbackend.LabelInstance+"="+h.instanceOrEmpty())
	cs, err := h.docker.ContainerList(t.Context(), client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	vs, err := h.docker.VolumeList(t.Context(), client.VolumeListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	return len(cs.Items), len(vs.Items)
}

// busyPort is a port something else listens on for the rest of the test.
func busyPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// TestIntegrationCreateRollsBack: a create that fails leaves nothing: no
// container, no volume, no project; ports outside port_range are refused
// unless asked for; a container with the project's name that pgwake did
// not make is named in the error and left alone.
func TestIntegrationCreateRollsBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.up(t)
	inst := h.instanceOrEmpty()

	t.Run("busy port", func(t *testing.T) {
		port := busyPort(t)
		r := h.fail(t, "create", "busy", "--port", port, "--port-outside-range")
		if !strings.Contains(r.stderr, "address already in use") || !strings.Contains(r.stderr, port) {
			t.Errorf("stderr %q: want the busy port named", r.stderr)
		}
		if _, ok := h.container(t, "busy"); ok {
			t.Error("a container with busy's labels is left")
		}
		if v := h.volume(t, "busy"); v != "" {
			t.Errorf("volume %s is left", v)
		}
		if _, ok := h.project(t, "busy"); ok {
			t.Error("project busy is left in the state")
		}
	})

	t.Run("ports outside port_range", func(t *testing.T) {
		low, high, err := h.portRange()
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range []struct{ port, want string }{
			{"80", "below 1024"},
			{strconv.Itoa(high + 1), fmt.Sprintf("outside port_range %d-%d", low, high)},
		} {
			r := h.fail(t, "create", "ranged", "--port", tt.port)
			if !strings.Contains(r.stderr, tt.want) || !strings.Contains(r.stderr, "--port-outside-range") {
				t.Errorf("create --port %s: stderr %q; want %q and how to allow it", tt.port, r.stderr, tt.want)
			}
		}
		if _, ok := h.project(t, "ranged"); ok {
			t.Error("a refused port left project ranged")
		}
		// A free port inside the range is taken as it is.
		var port int
		for p := low; p <= high; p++ {
			if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
				ln.Close()
				port = p
				break
			}
		}
		if port == 0 {
			t.Fatalf("no free port in %d-%d", low, high)
		}
		h.ok(t, "create", "ranged", "--port", strconv.Itoa(port))
		if url := h.ok(t, "url", "ranged"); !strings.Contains(url, ":"+strconv.Itoa(port)+"/") {
			t.Errorf("url %q does not use port %d", url, port)
		}
	})

	t.Run("a foreign container with the project's name", func(t *testing.T) {
		name := "pgwake-" + inst + "-mine"
		id := h.foreignContainer(t, name)
		r := h.fail(t, "create", "mine")
		if !strings.Contains(r.stderr, name) || !strings.Contains(r.stderr, "not created by this pgwake") {
			t.Errorf("stderr %q: want the container %q named as not pgwake's", r.stderr, name)
		}
		if !h.containerExists(t, id) {
			t.Fatal("the foreign container was removed")
		}
		if _, ok := h.project(t, "mine"); ok {
			t.Error("project mine is left in the state")
		}
		if v := h.volume(t, "mine"); v != "" {
			t.Errorf("volume %s was created for mine", v)
		}
		// The API says 409 Conflict.
		_, err := h.admin().Create(t.Context(), admin.CreateRequest{Name: "mine"})
		var apiErr *admin.APIError
		if !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict || !strings.Contains(apiErr.Msg, name) {
			t.Errorf("API create: %v; want 409 Conflict naming %s", err, name)
		}
	})
	h.ok(t, "down", "--volumes")
}

// TestIntegrationDownVolumesSweepsLeftovers: `down --volumes` removes
// everything labelled with this instance, also what is in no state file (a
// failed operation's or a crashed daemon's leftovers), and nothing else.
func TestIntegrationDownVolumesSweepsLeftovers(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.up(t)
	h.ok(t, "create", "app")
	inst := h.instanceOrEmpty()
	ctx := t.Context()

	labels := map[string]string{
		dockerbackend.LabelManaged:  "true",
		dockerbackend.LabelInstance: inst,
		dockerbackend.LabelProject:  "ghost",
	}
	vol := "pgwake-" + inst + "-ghost-data"
	if _, err := h.docker.VolumeCreate(ctx, client.VolumeCreateOptions{Name: vol, Labels: labels}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.docker.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name:       "pgwake-" + inst + "-ghost",
		Config:     &container.Config{Image: h.image, Labels: labels},
		HostConfig: &container.HostConfig{Mounts: []mount.Mount{{Type: mount.TypeVolume, Source: vol, Target: "/var/lib/postgresql/data"}}},
	}); err != nil {
		t.Fatal(err)
	}
	foreign := h.foreignContainer(t, fmt.Sprintf("not-pgwake-%s", inst))
	if c, v := h.instanceObjects(t); c != 2 || v != 2 {
		t.Fatalf("before down: %d containers and %d volumes of this instance, want 2 and 2", c, v)
	}

	h.ok(t, "down", "--volumes")
	if c, v := h.instanceObjects(t); c != 0 || v != 0 {
		t.Errorf("after down --volumes: %d containers and %d volumes of this instance are left", c, v)
	}
	if !h.containerExists(t, foreign) {
		t.Error("down --volumes removed a container without pgwake's labels")
	}
}

// TestIntegrationNoBackendSwitchCLI: a state dir whose project lives on
// Docker, started with backend auto while the engine is unreachable, does
// not start on the local backend: `up -d` exits non-zero with the daemon's
// own one-line error, and no local data directory is made.
func TestIntegrationNoBackendSwitchCLI(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.up(t)
	h.ok(t, "create", "app")
	h.ok(t, "down")

	env := h.env[:0:0]
	for _, kv := range h.env {
		if !strings.HasPrefix(kv, "PGWAKE_BACKEND=") {
			env = append(env, kv)
		}
	}
	h.env = append(env, "PGWAKE_BACKEND=auto", "PGWAKE_DOCKER_HOST=unix://"+filepath.Join(t.TempDir(), "no-docker.sock"))
	t.Cleanup(func() { stopLocalServers(h) })

	for _, args := range [][]string{
		{"up", "-d", "--listen", "127.0.0.1:0"},
		{"up", "-d", "--wait", "--listen", "127.0.0.1:0"},
	} {
		r := h.run(t, args...)
		last := lastLine(t, r)
		if r.code != 1 || !strings.Contains(last, "none of the 1 projects can be served") || !strings.Contains(last, "unreachable") {
			t.Errorf("%q: exit %d, last line %q; want 1 and the daemon's error", args, r.code, last)
		}
	}
	for _, root := range []string{filepath.Join(h.dir, "local"), filepath.Join("/var/lib/pgwake", h.instanceOrEmpty())} {
		if _, err := os.Stat(filepath.Join(root, "app")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a local data directory was made for the docker project in %s: %v", root, err)
		}
	}
}

// TestIntegrationUpWaitsForDeclaredProjects: `up -d --wait` is a contract.
// It returns 0 once the projects pgwake.yaml declares exist (a URL works
// right after it); run again with the same configuration it is a no-op
// that creates only what is newly declared; with another configuration it
// names what differs and fails. A declared project that cannot be created
// fails start-up with its cause, in the background and in the foreground;
// a bad name is a configuration error (exit 2) naming the file and line.
func TestIntegrationUpWaitsForDeclaredProjects(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	yaml := filepath.Join(h.dir, "pgwake.yaml")
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(yaml, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("projects:\n  - name: decl\n")
	h.up(t)
	if p, ok := h.project(t, "decl"); !ok || p.Backend != "docker" {
		t.Fatalf("after up -d --wait, declared project: %+v, listed %v; want it on docker", p, ok)
	}
	h.connectURL(t, strings.TrimSpace(h.ok(t, "url", "decl"))).Close(t.Context())

	// Again, with one more project declared: only that one is created.
	write("projects:\n  - name: decl\n  - name: more\n")
	r := h.run(t, "up", "-d", "--wait", "--listen", "127.0.0.1:0")
	if r.code != 0 || !strings.Contains(r.stderr, "already running with this configuration") || !strings.Contains(r.stderr, "created declared project more") {
		t.Errorf("up again: exit %d, stderr %q; want 0, the new project created, nothing else", r.code, r.stderr)
	}
	if _, ok := h.project(t, "more"); !ok {
		t.Errorf("the newly declared project was not created")
	}
	r = h.fail(t, "up", "-d", "--listen", "127.0.0.1:0", "--max-connections", "7")
	if r.code != 1 || !strings.Contains(r.stderr, `max_connections is "1000" there, "7" here (--max-connections)`) {
		t.Errorf("up with another config: exit %d, stderr %q; want 1 naming max_connections", r.code, r.stderr)
	}
	// Defaults for new projects are no difference: creates send their own.
	if r := h.run(t, "up", "-d", "--listen", "127.0.0.1:0", "--sleep-after", "5m"); r.code != 0 {
		t.Errorf("up with another sleep_after: exit %d, stderr %q; want 0", r.code, r.stderr)
	}
	h.ok(t, "down")

	write("projects:\n  - name: fine\n  - name: Bad_Name\n")
	r = h.fail(t, "up", "-d", "--wait", "--listen", "127.0.0.1:0")
	if r.code != 2 || !strings.Contains(r.stderr, "pgwake.yaml line 1: projects[1]: invalid project name") {
		t.Errorf("up with a bad declared name: exit %d, stderr %q; want 2 naming the file", r.code, r.stderr)
	}

	// An image that cannot be pulled (no registry here) fails start-up
	// with that cause, and creates nothing.
	write("projects:\n  - name: nopull\n    image: pgwake-test/not-in-any-registry:1\n")
	_, before := h.instanceObjects(t)
	for _, args := range [][]string{{"up", "-d", "--wait"}, {"up"}} {
		r := h.run(t, append(args, "--listen", "127.0.0.1:0")...)
		last := lastLine(t, r)
		if r.code != 1 || !strings.Contains(last, `declared project "nopull"`) || !strings.Contains(last, "pgwake-test/not-in-any-registry:1") {
			t.Errorf("%v with an image that cannot be pulled: exit %d, last line %q; want 1 and the cause", args, r.code, last)
		}
		h.waitLockFree(t)
	}
	if _, volumes := h.instanceObjects(t); volumes != before {
		t.Errorf("%d volumes after failed creates, want the %d from before", volumes, before)
	}
}

// TestIntegrationDownVolumesAfterCrash: `down --volumes` with no daemon
// (it was killed) still removes everything pgwake created: found by its
// state dir and its labels.
func TestIntegrationDownVolumesAfterCrash(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	info, _ := h.up(t)
	h.ok(t, "create", "one")
	h.ok(t, "create", "two")
	h.writeNote(t, "one", "x")
	if c, v := h.instanceObjects(t); c != 2 || v != 2 {
		t.Fatalf("%d containers, %d volumes before the kill, want 2 and 2", c, v)
	}
	if err := syscall.Kill(info.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.waitGone(t, info.PID)
	r := h.run(t, "down", "--volumes")
	if r.code != 0 || !strings.Contains(r.stderr, "removed everything pgwake created") {
		t.Fatalf("down --volumes after a crash: exit %d, stderr %q", r.code, r.stderr)
	}
	if c, v := h.instanceObjects(t); c != 0 || v != 0 {
		t.Errorf("%d containers, %d volumes left, want none", c, v)
	}
	h.up(t)
	if ps := h.projects(t); len(ps) != 0 {
		t.Errorf("projects after the purge: %d, want none", len(ps))
	}
	h.ok(t, "down")
}
