package dockerbackend_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/dockerbackend"
	"github.com/pgwake/pgwake/internal/testenv"
)

// crashLine is what testenv.CrashingImage's entrypoint writes before it
// exits with code 3.
const crashLine = "pgwake-test: deliberate crash before serving"

// testLabel marks what a test makes by hand without pgwake's labels, so a
// leftover of a killed test run can be found.
const testLabel = "io.pgwake.test.dockerbackend"

// newInstance returns a fresh instance id, so parallel tests and earlier
// runs never share a name.
func newInstance(t testing.TB) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "t" + hex.EncodeToString(b)
}

// newBackend connects a Backend for instance and removes everything
// labelled with the instance when the test ends.
func newBackend(t testing.TB, cli *client.Client, instance string) *dockerbackend.Backend {
	t.Helper()
	b, err := dockerbackend.New(t.Context(), dockerbackend.Options{Instance: instance})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	t.Cleanup(func() { testenv.RemoveInstance(t, cli, instance) })
	return b
}

func projectSpec(name, image string) backend.Spec {
	return backend.Spec{Name: name, Image: image, User: "postgres", Password: "secret-" + name, Database: name}
}

// cleanupCtx is for t.Cleanup, which runs after t.Context is cancelled.
func cleanupCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*time.Minute)
}

// foreignContainer creates (without starting) a container named name that
// carries no dev.pgwake labels, and removes it when the test ends.
func foreignContainer(t testing.TB, cli *client.Client, name, image string) string {
	t.Helper()
	res, err := cli.ContainerCreate(t.Context(), client.ContainerCreateOptions{
		Name:   name,
		Config: &container.Config{Image: image, Labels: map[string]string{testLabel: t.Name()}},
	})
	if err != nil {
		t.Fatalf("create foreign container %q: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := cleanupCtx()
		defer cancel()
		if _, err := cli.ContainerRemove(ctx, res.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("cleanup: remove container %q: %v", name, err)
		}
	})
	return res.ID
}

// labelledContainer creates (without starting) a container with pgwake's
// labels for instance and project under a name pgwake would not choose: a
// leftover.
func labelledContainer(t testing.TB, cli *client.Client, name, image, instance, project string) string {
	t.Helper()
	res, err := cli.ContainerCreate(t.Context(), client.ContainerCreateOptions{
		Name: name,
		Config: &container.Config{Image: image, Labels: map[string]string{
			dockerbackend.LabelManaged:  "true",
			dockerbackend.LabelInstance: instance,
			dockerbackend.LabelProject:  project,
		}},
	})
	if err != nil {
		t.Fatalf("create container %q: %v", name, err)
	}
	return res.ID // testenv.RemoveInstance removes it
}

// assertContainer fails unless the container with id still exists in state.
func assertContainer(t testing.TB, cli *client.Client, id string, state container.ContainerState) {
	t.Helper()
	res, err := cli.ContainerInspect(t.Context(), id, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatalf("container %s: %v", id, err)
	}
	if res.Container.State == nil || res.Container.State.Status != state {
		t.Fatalf("container %s is %+v, want %s", id, res.Container.State, state)
	}
}

func assertNoContainer(t testing.TB, cli *client.Client, name string) {
	t.Helper()
	if _, err := cli.ContainerInspect(t.Context(), name, client.ContainerInspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Fatalf("container %q: want not found, got err %v", name, err)
	}
}

func volumeExists(t testing.TB, cli *client.Client, name string) bool {
	t.Helper()
	_, err := cli.VolumeInspect(t.Context(), name, client.VolumeInspectOptions{})
	switch {
	case err == nil:
		return true
	case cerrdefs.IsNotFound(err):
		return false
	}
	t.Fatalf("inspect volume %q: %v", name, err)
	return false
}

// waitServing follows the container's log from its current start until
// the real server (the one listening on TCP, not the entrypoint's temporary
// socket-only one) reports it accepts connections, so that a stop reaches
// Postgres itself and not the entrypoint script. A first start runs
// initdb, so it waits as long as pgwake would (first_start_timeout): with
// the machine loaded initdb's "syncing data to disk" alone outlasted the
// two minutes this used to allow.
func waitServing(t testing.TB, cli *client.Client, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), config.Default().FirstStartTimeout)
	defer cancel()
	res, err := cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cli.ContainerLogs(ctx, name, client.ContainerLogsOptions{
		ShowStdout: true, ShowStderr: true, Follow: true, Since: res.Container.State.StartedAt,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	pr, pw := io.Pipe()
	go func() {
		_, err := stdcopy.StdCopy(pw, pw, rc)
		pw.CloseWithError(err)
	}()
	defer pr.Close()
	tcp := false
	var seen []string
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		line := sc.Text()
		seen = append(seen, line)
		switch {
		case strings.Contains(line, "listening on IPv4 address"):
			tcp = true
		case tcp && strings.Contains(line, "ready to accept connections"):
			return
		}
	}
	t.Fatalf("log of %q ended (%v) before the server accepted connections:\n%s", name, sc.Err(), strings.Join(seen, "\n"))
}

// TestIntegrationStartCrash: a server whose entrypoint dies at once makes
// Start fail with the exit code and the log's last lines, and Status then
// says why it stopped.
func TestIntegrationStartCrash(t *testing.T) {
	t.Parallel()
	cli := testenv.DockerClient(t)
	img := testenv.CrashingImage(t)
	inst := newInstance(t)
	b := newBackend(t, cli, inst)
	spec := projectSpec("crash", img)
	name := b.ContainerName(spec.Name)
	ctx := t.Context()

	// Start inspects right after the start; the entrypoint may not have
	// exited by then (about half the time here), and Start then reports
	// the server running. Its exit must show in Status, and the next Start
	// tries again.
	const attempts = 100
	for i := 1; ; i++ {
		ep, err := b.Start(ctx, spec)
		if err != nil {
			for _, want := range []string{name, "exited with code 3 right after start", crashLine} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Start error %q lacks %q", err, want)
				}
			}
			if n := strings.Count(err.Error(), crashLine); n > 1 {
				t.Errorf("Start error shows %d crashes' log, want only this run's: %q", n, err)
			}
			t.Logf("attempt %d: %v", i, err)
			break
		}
		if ep.ID == "" {
			t.Errorf("Start returned no run ID: %+v", ep)
		}
		w := cli.ContainerWait(ctx, name, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
		select {
		case r := <-w.Result:
			if r.StatusCode != 3 {
				t.Fatalf("container exited with %d, want 3", r.StatusCode)
			}
		case err := <-w.Error:
			t.Fatalf("wait for %q: %v", name, err)
		}
		if st, err := b.Status(ctx, spec); err != nil || st.State != backend.StateStopped || st.Exit != "exited with code 3" {
			t.Fatalf("Status after the crash = %+v, %v; want stopped, exited with code 3", st, err)
		}
		if i == attempts {
			t.Fatalf("Start reported the crashing container running %d times", attempts)
		}
	}
	st, err := b.Status(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != backend.StateStopped || st.Exit != "exited with code 3" || st.ID != "" {
		t.Errorf("Status = %+v, want stopped, exited with code 3, no ID", st)
	}
	if tail := b.LogTail(ctx, spec, 10); !strings.Contains(tail, crashLine) {
		t.Errorf("LogTail = %q, want it to contain %q", tail, crashLine)
	}
}

// TestIntegrationRunID: the ID names one run of the server: the same while
// it runs or is paused, none while stopped, a new one after every start.
func TestIntegrationRunID(t *testing.T) {
	t.Parallel()
	cli := testenv.DockerClient(t)
	img := testenv.PostgresImage(t)
	b := newBackend(t, cli, newInstance(t))
	spec := projectSpec("app", img)
	name := b.ContainerName(spec.Name)
	ctx := t.Context()

	status := func(want backend.State) backend.Status {
		t.Helper()
		st, err := b.Status(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != want {
			t.Fatalf("Status = %+v, want %s", st, want)
		}
		return st
	}

	ep, err := b.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if ep.ID == "" || ep.Addr == "" {
		t.Fatalf("Start = %+v, want an address and a run ID", ep)
	}
	if st := status(backend.StateRunning); st.ID != ep.ID || st.Addr != ep.Addr || st.Exit != "" {
		t.Fatalf("Status = %+v after Start = %+v", st, ep)
	}
	if again, err := b.Start(ctx, spec); err != nil || again.ID != ep.ID {
		t.Fatalf("Start of a running server = %+v, %v; want ID %q", again, err, ep.ID)
	}

	if err := b.Sleep(ctx, spec, backend.SleepPause); err != nil {
		t.Fatal(err)
	}
	if st := status(backend.StatePaused); st.ID != ep.ID {
		t.Fatalf("paused: ID %q, want %q", st.ID, ep.ID)
	}
	if resumed, err := b.Start(ctx, spec); err != nil || resumed.ID != ep.ID || !resumed.Serving {
		t.Fatalf("Start after pause = %+v, %v; want ID %q, serving", resumed, err, ep.ID)
	}

	waitServing(t, cli, name) // so the stop is Postgres's fast shutdown
	if err := b.Sleep(ctx, spec, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	if st := status(backend.StateStopped); st.ID != "" || st.Exit != "exited with code 0" {
		t.Fatalf("stopped: %+v, want no ID and a clean exit", st)
	}

	ep2, err := b.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if ep2.ID == "" || ep2.ID == ep.ID {
		t.Fatalf("second run ID %q, first %q: want a new one", ep2.ID, ep.ID)
	}
	if st := status(backend.StateRunning); st.ID != ep2.ID {
		t.Fatalf("Status ID %q after the second Start, want %q", st.ID, ep2.ID)
	}

	// Kill (before a reset replaces the data) is an immediate shutdown,
	// and the next start recovers.
	waitServing(t, cli, name)
	if err := b.Kill(ctx, spec); err != nil {
		t.Fatal(err)
	}
	status(backend.StateStopped)
	if logs := readLogs(t, b, spec); !strings.Contains(logs, "received immediate shutdown request") {
		t.Errorf("Kill was not an immediate shutdown; the server's log ends:\n%s", logs)
	}
	if err := b.Kill(ctx, spec); err != nil {
		t.Errorf("Kill of a stopped server: %v", err)
	}
	if ep3, err := b.Start(ctx, spec); err != nil || ep3.ID == ep2.ID {
		t.Fatalf("Start after Kill = %+v, %v", ep3, err)
	}
}

// TestIntegrationUnpauseAfterChangesOutside: a wake from a pause unpauses
// the container Sleep paused without inspecting it first, so whatever
// happened to it in between must still end in a serving container, and a
// new run must show in Status, which the proxy checks every connection
// against.
func TestIntegrationUnpauseAfterChangesOutside(t *testing.T) {
	t.Parallel()
	cli := testenv.DockerClient(t)
	img := testenv.PostgresImage(t)
	b := newBackend(t, cli, newInstance(t))
	spec := projectSpec("app", img)
	name := b.ContainerName(spec.Name)
	ctx := t.Context()

	first, err := b.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	waitServing(t, cli, name)
	pause := func() {
		t.Helper()
		if err := b.Sleep(ctx, spec, backend.SleepPause); err != nil {
			t.Fatal(err)
		}
		assertContainer(t, cli, name, container.StatePaused)
	}
	start := func(what string) backend.Endpoint {
		t.Helper()
		ep, err := b.Start(ctx, spec)
		if err != nil {
			t.Fatalf("Start after %s: %v", what, err)
		}
		assertContainer(t, cli, name, container.StateRunning)
		return ep
	}

	// Unpaused behind pgwake's back: the unpause fails, Start looks.
	pause()
	if _, err := cli.ContainerUnpause(ctx, name, client.ContainerUnpauseOptions{}); err != nil {
		t.Fatal(err)
	}
	if ep := start("an unpause outside"); ep.ID != first.ID || ep.Addr != first.Addr {
		t.Fatalf("Start = %+v, want the same run %+v", ep, first)
	}

	// Restarted and paused again outside: the unpause succeeds and
	// reports the run pgwake paused; Status names the new one.
	pause()
	for _, op := range []func() error{
		func() error { _, err := cli.ContainerUnpause(ctx, name, client.ContainerUnpauseOptions{}); return err },
		func() error { _, err := cli.ContainerRestart(ctx, name, client.ContainerRestartOptions{}); return err },
		func() error {
			// runc gives up freezing processes that keep changing state
			// (a server booting on a loaded machine); Sleep retries
			// this too.
			waitServing(t, cli, name)
			return testenv.PauseOutside(ctx, cli, name)
		},
	} {
		if err := op(); err != nil {
			t.Fatal(err)
		}
	}
	ep := start("a restart outside")
	st, err := b.Status(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if ep.ID != first.ID || st.State != backend.StateRunning || st.ID == first.ID || st.ID == "" {
		t.Fatalf("Start = %+v, then Status = %+v: want the paused run from Start and a new run from Status", ep, st)
	}

	// Removed while paused: Start makes a new container on the volume.
	waitServing(t, cli, name)
	pause()
	if _, err := cli.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if ep := start("a removal outside"); ep.ID == "" || ep.ID == first.ID || ep.ID == st.ID {
		t.Fatalf("Start = %+v after the container was removed, want a new run", ep)
	}
}

func readLogs(t *testing.T, b *dockerbackend.Backend, spec backend.Spec) string {
	t.Helper()
	rc, err := b.Logs(t.Context(), spec, false, 30)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestIntegrationNotOwned: pgwake neither uses, replaces nor removes a
// container or volume that has its name but not its labels.
func TestIntegrationNotOwned(t *testing.T) {
	t.Parallel()
	cli := testenv.DockerClient(t)
	img := testenv.PostgresImage(t)

	wantNotOwned := func(t *testing.T, what string, err error, msg ...string) {
		t.Helper()
		if !errors.Is(err, backend.ErrNotOwned) {
			t.Errorf("%s: err = %v, want ErrNotOwned", what, err)
			return
		}
		for _, m := range msg {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: error %q lacks %q", what, err, m)
			}
		}
	}

	t.Run("container", func(t *testing.T) {
		t.Parallel()
		b := newBackend(t, cli, newInstance(t))
		spec := projectSpec("app", img)
		name := b.ContainerName(spec.Name)
		id := foreignContainer(t, cli, name, img)
		ctx := t.Context()

		msg := []string{name, "no dev.pgwake labels"}
		wantNotOwned(t, "Ensure", b.Ensure(ctx, spec), msg...)
		_, err := b.Start(ctx, spec)
		wantNotOwned(t, "Start", err, msg...)
		_, err = b.Status(ctx, spec)
		wantNotOwned(t, "Status", err, msg...)
		wantNotOwned(t, "Sleep", b.Sleep(ctx, spec, backend.SleepStop), msg...)
		_, err = b.Logs(ctx, spec, false, 10)
		wantNotOwned(t, "Logs", err, msg...)
		wantNotOwned(t, "Remove", b.Remove(ctx, spec, true), msg...)

		assertContainer(t, cli, id, container.StateCreated) // never started, never replaced
		if volumeExists(t, cli, b.VolumeName(spec.Name)) {
			t.Errorf("volume %q was created for a project whose container is not ours", b.VolumeName(spec.Name))
		}
	})

	t.Run("volume", func(t *testing.T) {
		t.Parallel()
		b := newBackend(t, cli, newInstance(t))
		spec := projectSpec("app", img)
		vol := b.VolumeName(spec.Name)
		if _, err := cli.VolumeCreate(t.Context(), client.VolumeCreateOptions{Name: vol, Labels: map[string]string{testLabel: t.Name()}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := cleanupCtx()
			defer cancel()
			if _, err := cli.VolumeRemove(ctx, vol, client.VolumeRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
				t.Errorf("cleanup: remove volume %q: %v", vol, err)
			}
		})
		ctx := t.Context()

		msg := []string{vol, "no dev.pgwake labels"}
		wantNotOwned(t, "Ensure", b.Ensure(ctx, spec), msg...)
		_, err := b.Start(ctx, spec)
		wantNotOwned(t, "Start", err, msg...)
		wantNotOwned(t, "Remove with volumes", b.Remove(ctx, spec, true), msg...)
		if err := b.Remove(ctx, spec, false); err != nil {
			t.Errorf("Remove without volumes: %v (it has nothing to remove)", err)
		}

		if !volumeExists(t, cli, vol) {
			t.Fatalf("foreign volume %q is gone", vol)
		}
		assertNoContainer(t, cli, b.ContainerName(spec.Name))
	})

	// Instance "a" with project "x-app" and instance "a-x" with project
	// "app" share names; each must leave the other's alone.
	t.Run("other instance", func(t *testing.T) {
		t.Parallel()
		inst := newInstance(t)
		a := newBackend(t, cli, inst)
		b := newBackend(t, cli, inst+"-x")
		specA, specB := projectSpec("x-app", img), projectSpec("app", img)
		if a.ContainerName(specA.Name) != b.ContainerName(specB.Name) {
			t.Fatalf("names differ: %q, %q", a.ContainerName(specA.Name), b.ContainerName(specB.Name))
		}
		ctx := t.Context()
		if err := a.Ensure(ctx, specA); err != nil {
			t.Fatal(err)
		}
		stA, err := a.Status(ctx, specA)
		if err != nil {
			t.Fatal(err)
		}

		msg := []string{a.ContainerName(specA.Name), `instance "` + inst + `", project "x-app"`}
		wantNotOwned(t, "Ensure", b.Ensure(ctx, specB), msg...)
		_, err = b.Start(ctx, specB)
		wantNotOwned(t, "Start", err, msg...)
		wantNotOwned(t, "Remove", b.Remove(ctx, specB, true), msg...)
		if err := b.RemoveAll(ctx, true); err != nil {
			t.Fatal(err)
		}

		if st, err := a.Status(ctx, specA); err != nil || st.State != stA.State {
			t.Fatalf("instance a's project: %+v, %v; want it %s", st, err, stA.State)
		}
		if !volumeExists(t, cli, a.VolumeName(specA.Name)) {
			t.Fatalf("instance a's volume is gone")
		}
	})
}

// relativePGDATAImage makes an image whose PGDATA is not an absolute path:
// the backend mounts the data volume there, which Docker refuses when the
// container is created, after the volume was.
func relativePGDATAImage(t testing.TB, cli *client.Client, base, instance string) string {
	t.Helper()
	ctx := t.Context()
	ref := "pgwake-test/relative-pgdata:" + instance
	c, err := cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{Image: base, Labels: map[string]string{testLabel: t.Name()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
			t.Errorf("remove container %s: %v", c.ID, err)
		}
	}()
	if _, err := cli.ContainerCommit(ctx, c.ID, client.ContainerCommitOptions{
		Reference: ref, Changes: []string{"ENV PGDATA=relative/pgdata"}, NoPause: true,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := cleanupCtx()
		defer cancel()
		if _, err := cli.ImageRemove(ctx, ref, client.ImageRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("cleanup: remove image %s: %v", ref, err)
		}
	})
	return ref
}

// TestIntegrationEnsureRollback: an Ensure that fails after creating the
// volume removes it again, and keeps a volume it did not create.
func TestIntegrationEnsureRollback(t *testing.T) {
	t.Parallel()
	cli := testenv.DockerClient(t)
	img := testenv.PostgresImage(t)
	inst := newInstance(t)
	b := newBackend(t, cli, inst)
	bad := relativePGDATAImage(t, cli, img, inst)
	ctx := t.Context()

	t.Run("new volume removed", func(t *testing.T) {
		spec := projectSpec("fresh", bad)
		err := b.Ensure(ctx, spec)
		if err == nil || !strings.Contains(err.Error(), "create container") {
			t.Fatalf("Ensure = %v, want the container create to fail", err)
		}
		t.Logf("Ensure: %v", err)
		if volumeExists(t, cli, b.VolumeName(spec.Name)) {
			t.Errorf("volume %q outlived the failed Ensure", b.VolumeName(spec.Name))
		}
		assertNoContainer(t, cli, b.ContainerName(spec.Name))
		if _, err := b.Start(ctx, spec); err == nil {
			t.Fatalf("Start succeeded")
		}
		if volumeExists(t, cli, b.VolumeName(spec.Name)) {
			t.Errorf("volume %q outlived the failed Start", b.VolumeName(spec.Name))
		}
	})

	t.Run("existing volume kept", func(t *testing.T) {
		good := projectSpec("kept", img)
		if err := b.Ensure(ctx, good); err != nil {
			t.Fatal(err)
		}
		drifted := good
		drifted.Image = bad
		if err := b.Ensure(ctx, drifted); err == nil {
			t.Fatalf("Ensure with the bad image succeeded")
		}
		if !volumeExists(t, cli, b.VolumeName(good.Name)) {
			t.Fatalf("the project's existing volume was removed")
		}
		if err := b.Ensure(ctx, good); err != nil {
			t.Fatalf("Ensure back on the good image: %v", err)
		}
	})
}

// TestIntegrationRemoveLeftovers: Remove finds a project's containers and
// volumes by their labels, whatever their names; RemoveAll removes all of
// an instance's and nothing else.
func TestIntegrationRemoveLeftovers(t *testing.T) {
	t.Parallel()
	cli := testenv.DockerClient(t)
	img := testenv.PostgresImage(t)
	inst := newInstance(t)
	b := newBackend(t, cli, inst)
	ctx := t.Context()

	app, other := projectSpec("app", img), projectSpec("other", img)
	for _, s := range []backend.Spec{app, other} {
		if err := b.Ensure(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	oldName := b.ContainerName(app.Name) + "-old"
	labelledContainer(t, cli, oldName, img, inst, app.Name)
	oldVol := b.VolumeName(app.Name) + "-old"
	if _, err := cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: oldVol, Labels: map[string]string{
		dockerbackend.LabelManaged: "true", dockerbackend.LabelInstance: inst, dockerbackend.LabelProject: app.Name,
	}}); err != nil {
		t.Fatal(err)
	}
	ghost := b.ContainerName("ghost") + "-crashed"
	labelledContainer(t, cli, ghost, img, inst, "ghost")
	stranger := foreignContainer(t, cli, "pgwake-test-stranger-"+inst, img)

	if err := b.Remove(ctx, app, true); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{b.ContainerName(app.Name), oldName} {
		assertNoContainer(t, cli, n)
	}
	for _, v := range []string{b.VolumeName(app.Name), oldVol} {
		if volumeExists(t, cli, v) {
			t.Errorf("volume %q outlived Remove", v)
		}
	}
	if st, err := b.Status(ctx, other); err != nil || st.State != backend.StateStopped {
		t.Fatalf("other project after removing app: %+v, %v", st, err)
	}

	// A paused server: RemoveAll thaws it so the stop is a fast shutdown.
	if _, err := b.Start(ctx, other); err != nil {
		t.Fatal(err)
	}
	waitServing(t, cli, b.ContainerName(other.Name))
	if err := b.Sleep(ctx, other, backend.SleepPause); err != nil {
		t.Fatal(err)
	}
	if err := b.RemoveAll(ctx, false); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{b.ContainerName(other.Name), ghost} {
		assertNoContainer(t, cli, n)
	}
	if !volumeExists(t, cli, b.VolumeName(other.Name)) {
		t.Fatalf("RemoveAll without volumes removed volume %q", b.VolumeName(other.Name))
	}
	if err := b.RemoveAll(ctx, true); err != nil {
		t.Fatal(err)
	}
	if volumeExists(t, cli, b.VolumeName(other.Name)) {
		t.Errorf("volume %q outlived RemoveAll with volumes", b.VolumeName(other.Name))
	}
	f := make(client.Filters).Add("label", dockerbackend.LabelInstance+"="+inst)
	cs, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	vs, err := cli.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Items) != 0 || len(vs.Items) != 0 {
		t.Errorf("after RemoveAll: %d containers, %d volumes still labelled with the instance", len(cs.Items), len(vs.Items))
	}
	assertContainer(t, cli, stranger, container.StateCreated)
}
