package localbackend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/testenv"
)

// waitFor bounds every wait on a server; a loaded two-core machine boots
// postgres in seconds, not tens of seconds.
const waitFor = 30 * time.Second

// pollEvery is how often a wait re-checks what it waits for.
const pollEvery = 20 * time.Millisecond

func testSpec(name string) backend.Spec {
	return backend.Spec{Name: name, User: "pgwake", Password: "secret-" + name, Database: "app"}
}

// newRoot makes a backend root that the postgres user can reach when the
// tests run as root (t.TempDir's parent is 0700), and stops every server
// under it and deletes it when the test ends.
func newRoot(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: runs PostgreSQL servers; skipped with -short")
	}
	if _, err := FindBinDir(); err != nil {
		t.Fatalf("the local backend tests need PostgreSQL server binaries: %v", err)
	}
	root, err := os.MkdirTemp("", "pgwake-localbackend-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.StopLocalServers(root) })
	return root
}

// newBackend is a Backend on root, as a (re)started pgwake makes one.
func newBackend(t *testing.T, root string) *Backend {
	t.Helper()
	b, err := New(t.Context(), Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// eventually polls check until it returns nil or waitFor passes.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, waitFor, err)
		}
		time.Sleep(pollEvery)
	}
}

// until adapts a condition for eventually.
func until(cond func() bool) func() error {
	return func() error {
		if cond() {
			return nil
		}
		return errors.New("not yet")
	}
}

func status(t *testing.T, b *Backend, spec backend.Spec) backend.Status {
	t.Helper()
	st, err := b.Status(t.Context(), spec)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	return st
}

func start(t *testing.T, b *Backend, spec backend.Spec) backend.Endpoint {
	t.Helper()
	ep, err := b.Start(t.Context(), spec)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	return ep
}

// serve waits until the server at ep answers a query as the spec's user.
func serve(t *testing.T, ep backend.Endpoint, spec backend.Spec) {
	t.Helper()
	url := fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&connect_timeout=5", spec.User, spec.Password, ep.Addr, spec.Database)
	eventually(t, "server serves", func() error {
		conn, err := pgx.Connect(t.Context(), url)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		var one int
		return conn.QueryRow(t.Context(), "SELECT 1").Scan(&one)
	})
}

// alive reports whether a process pid exists (a zombie counts).
func alive(pid int) bool { return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }

var idPattern = regexp.MustCompile(`^[1-9][0-9]*@[0-9]+$`)

func TestIntegrationIdentity(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	b := newBackend(t, root)
	spec := testSpec("ident")

	if err := b.Ensure(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	if st := status(t, b, spec); st.State != backend.StateStopped || st.ID != "" || st.Exit != "" {
		t.Fatalf("after Ensure: %+v, want stopped without ID or exit", st)
	}
	ep := start(t, b, spec)
	if !idPattern.MatchString(ep.ID) {
		t.Fatalf("Start ID %q, want <pid>@<start time>", ep.ID)
	}
	for i := range 3 {
		st := status(t, b, spec)
		if st.State != backend.StateRunning || st.ID != ep.ID || st.Addr != ep.Addr {
			t.Fatalf("Status %d: %+v, want running at %s with ID %s", i, st, ep.Addr, ep.ID)
		}
	}
	serve(t, ep, spec)
	if again := start(t, b, spec); again != ep {
		t.Fatalf("Start of a running server: %+v, want %+v", again, ep)
	}
	// A restarted pgwake adopts the server under the same identity.
	if st := status(t, newBackend(t, root), spec); st.State != backend.StateRunning || st.ID != ep.ID {
		t.Fatalf("Status from a new Backend: %+v, want running with ID %s", st, ep.ID)
	}

	if err := b.Sleep(t.Context(), spec, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	if st := status(t, b, spec); st.State != backend.StateStopped || st.ID != "" || st.Exit != "" {
		t.Fatalf("after Sleep: %+v, want stopped without ID or exit reason", st)
	}
	ep2 := start(t, b, spec)
	if ep2.ID == ep.ID || !idPattern.MatchString(ep2.ID) {
		t.Fatalf("second start ID %q, want a new <pid>@<start time> (first %q)", ep2.ID, ep.ID)
	}
	if st := status(t, b, spec); st.State != backend.StateRunning || st.ID != ep2.ID {
		t.Fatalf("after the second start: %+v, want running with ID %s", st, ep2.ID)
	}
	serve(t, ep2, spec)

	// Kill (before a reset replaces the data) is an immediate shutdown,
	// and the next start recovers.
	if err := b.Kill(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	if st := status(t, b, spec); st.State != backend.StateStopped {
		t.Fatalf("after Kill: %+v, want stopped", st)
	}
	rc, err := b.Logs(t.Context(), spec, false, 30)
	if err != nil {
		t.Fatal(err)
	}
	logs, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !strings.Contains(string(logs), "received immediate shutdown request") {
		t.Errorf("Kill was not an immediate shutdown (%v); the log ends:\n%s", err, logs)
	}
	serve(t, start(t, b, spec), spec)
}

func TestIntegrationExitReason(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		conf  string // appended to postgresql.conf
		noWAL bool   // remove the WAL
	}{
		// Fails while reading its configuration, before postmaster.pid.
		{name: "bad setting", conf: "shared_buffers = 'garbage'\n"},
		// Fails just after writing postmaster.pid, which it removes on its
		// way out: only the process's exit tells this from a server not
		// yet started.
		{name: "missing preload library", conf: "shared_preload_libraries = 'pgwake_no_such_library'\n"},
		// Fails in recovery, usually well after Start returned.
		{name: "corrupt data", noWAL: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root := newRoot(t)
			b := newBackend(t, root)
			spec := testSpec("dies")
			if err := b.Ensure(t.Context(), spec); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(filepath.Join(b.dataDir(spec.Name), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteString(tt.conf); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if tt.noWAL {
				wal, err := filepath.Glob(filepath.Join(b.dataDir(spec.Name), "pg_wal", "0*"))
				if err != nil || len(wal) == 0 {
					t.Fatalf("no WAL segments to remove: %v", err)
				}
				for _, seg := range wal {
					if err := os.Remove(seg); err != nil {
						t.Fatal(err)
					}
				}
			}

			began := time.Now()
			_, startErr := b.Start(t.Context(), spec)
			var st backend.Status
			eventually(t, "Status reports the dead server", until(func() bool {
				st = status(t, b, spec)
				return st.State != backend.StateRunning
			}))
			t.Logf("Start: %v; Status after %v: %+v", startErr, time.Since(began).Round(time.Millisecond), st)

			logData, err := os.ReadFile(b.LogFile(spec.Name))
			if err != nil {
				t.Fatal(err)
			}
			var fatal string
			for line := range strings.SplitSeq(string(logData), "\n") {
				if strings.Contains(line, "FATAL:") || strings.Contains(line, "PANIC:") {
					fatal = strings.TrimSpace(line)
				}
			}
			if fatal == "" {
				t.Fatalf("no FATAL or PANIC line in the server log:\n%s", logData)
			}
			if st.State != backend.StateStopped || st.Exit != "exited with code 1" || !strings.Contains(st.Log, fatal) {
				t.Fatalf("Status = %+v, want stopped, exited with code 1, with the log's %q", st, fatal)
			}
			if startErr != nil && !strings.Contains(startErr.Error(), fatal) {
				t.Errorf("Start error %q lacks the log's %q", startErr, fatal)
			}
			// The reason stays until the next start.
			if again := status(t, b, spec); again != st {
				t.Errorf("Status again = %+v, want %+v", again, st)
			}
		})
	}
}

// procChildren lists the processes whose parent is pid.
func procChildren(t *testing.T, pid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var kids []int
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		s := string(data)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			k, _ := strconv.Atoi(strings.Fields(s)[0])
			kids = append(kids, k)
		}
	}
	return kids
}

func TestIntegrationStalePidFile(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("telling a reused pid from a postmaster needs /proc")
	}
	t.Parallel()
	root := newRoot(t)
	b := newBackend(t, root)
	spec := testSpec("stale")
	ep := start(t, b, spec)
	serve(t, ep, spec)

	pidPath := filepath.Join(b.dataDir(spec.Name), "postmaster.pid")
	pf, err := readPidFile(b.dataDir(spec.Name))
	if err != nil {
		t.Fatal(err)
	}
	kids := procChildren(t, pf.pid)
	if len(kids) == 0 {
		t.Fatalf("postmaster %d has no child processes", pf.pid)
	}
	// SIGKILL leaves postmaster.pid behind; the server's children exit
	// once they notice their postmaster is gone.
	if err := syscall.Kill(pf.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the killed server and its children are gone", until(func() bool {
		return !slices.ContainsFunc(append(kids, pf.pid), alive)
	}))
	if _, err := os.Stat(pidPath); err != nil {
		t.Fatalf("postmaster.pid after SIGKILL: %v", err)
	}

	st := status(t, b, spec)
	if st.State != backend.StateStopped || !strings.HasPrefix(st.Exit, "killed by signal 9") {
		t.Fatalf("Status after SIGKILL = %+v, want stopped, killed by signal 9", st)
	}
	// A restarted pgwake did not see it die; the stale file says enough.
	b2 := newBackend(t, root)
	wantStale := fmt.Sprintf("names pid %d, which is not this server", pf.pid)
	if st := status(t, b2, spec); st.State != backend.StateStopped || !strings.Contains(st.Exit, wantStale) {
		t.Fatalf("Status from a new Backend = %+v, want stopped with %q", st, wantStale)
	}

	// The pid given to an unrelated process: it is alive, and no server.
	other := exec.Command("sleep", "3600")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = other.Process.Kill()
		_ = other.Wait()
	})
	data, err := os.ReadFile(pidPath)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(data), "\n")
	if err := os.WriteFile(pidPath, []byte(strconv.Itoa(other.Process.Pid)+"\n"+rest), 0o600); err != nil {
		t.Fatal(err)
	}
	if !signalAlive(other.Process.Pid) {
		t.Fatal("the unrelated process is not alive")
	}
	for name, be := range map[string]*Backend{"starter": b, "new": b2} {
		if st := status(t, be, spec); st.State != backend.StateStopped || st.ID != "" || st.Exit == "" {
			t.Errorf("%s Backend: Status with a reused pid = %+v, want stopped with a reason", name, st)
		}
	}
	// Sleep must not take the unrelated process for the server (pg_ctl
	// stop would signal it).
	if err := b2.Sleep(t.Context(), spec, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	if !signalAlive(other.Process.Pid) || other.ProcessState != nil {
		t.Fatal("Sleep signalled the unrelated process")
	}

	// Once that process is gone too, the server starts again (postgres
	// itself drops a lock file of a dead pid), as a new run.
	if err := other.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = other.Wait()
	ep2 := start(t, b, spec)
	if ep2.ID == ep.ID {
		t.Fatalf("restart after a crash kept ID %s", ep.ID)
	}
	serve(t, ep2, spec)
	if st := status(t, b2, spec); st.State != backend.StateRunning || st.ID != ep2.ID {
		t.Fatalf("Status after the restart = %+v, want running with ID %s", st, ep2.ID)
	}
}

func TestIntegrationRemoveAll(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	made := newBackend(t, root)
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Projects of this instance, whether or not any pgwake lists them.
	running := testSpec("running")
	ep := start(t, made, running)
	pf, err := readPidFile(made.dataDir(running.Name))
	if err != nil {
		t.Fatal(err)
	}
	if err := made.Ensure(t.Context(), testSpec("stopped")); err != nil {
		t.Fatal(err)
	}
	legacy := testSpec("legacy") // made before the marker existed
	if err := made.Ensure(t.Context(), legacy); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, legacy.Name, projectMarker)); err != nil {
		t.Fatal(err)
	}
	// What a pgwake that crashed during initdb leaves.
	write(filepath.Join(root, "halfmade", projectMarker), "")
	write(filepath.Join(root, "halfmade", "data.initdb", "PG_VERSION"), "15\n")

	// Not pgwake's: left alone.
	write(filepath.Join(root, "foreign", "notes.txt"), "mine")
	write(filepath.Join(root, "foreign-cluster", "data", "PG_VERSION"), "15\n")
	write(filepath.Join(root, "loose-file"), "mine")
	outside, err := os.MkdirTemp("", "pgwake-localbackend-outside-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(outside) })
	write(filepath.Join(outside, projectMarker), "")
	if err := os.Symlink(outside, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	foreign := []string{"foreign", "foreign-cluster", "link", "loose-file"}

	// A restarted pgwake, which started none of these servers.
	sweeper := newBackend(t, root)
	began := time.Now()
	if err := sweeper.RemoveAll(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	t.Logf("RemoveAll(false) took %v", time.Since(began).Round(time.Millisecond))
	if st := status(t, sweeper, running); st.State != backend.StateStopped {
		t.Fatalf("after RemoveAll without volumes: %+v, want stopped", st)
	}
	eventually(t, "the swept server is gone", until(func() bool { return !alive(pf.pid) }))
	if !strings.Contains(string(must(os.ReadFile(made.LogFile(running.Name)))), "received fast shutdown request") {
		t.Errorf("the server was not stopped with a fast shutdown")
	}
	for _, name := range []string{"running", "stopped", "legacy", "halfmade"} {
		if _, err := os.Stat(filepath.Join(root, name)); err != nil {
			t.Errorf("RemoveAll without volumes removed %s: %v", name, err)
		}
	}

	// Running again, to be stopped and removed in one sweep.
	if ep2 := start(t, made, running); ep2.ID == ep.ID {
		t.Fatal("same ID after a restart")
	}
	began = time.Now()
	if err := sweeper.RemoveAll(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	t.Logf("RemoveAll(true) took %v", time.Since(began).Round(time.Millisecond))
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if !slices.Equal(left, foreign) {
		t.Fatalf("root after RemoveAll with volumes holds %v, want only %v", left, foreign)
	}
	if got := string(must(os.ReadFile(filepath.Join(root, "foreign", "notes.txt")))); got != "mine" {
		t.Errorf("foreign file changed: %q", got)
	}
	if _, err := os.Stat(filepath.Join(outside, projectMarker)); err != nil {
		t.Errorf("the link's target was touched: %v", err)
	}
	if st := status(t, sweeper, running); st.State != backend.StateMissing {
		t.Errorf("after RemoveAll with volumes: %+v, want missing", st)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestIntegrationFailedEnsureLeavesNothing(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	b := newBackend(t, root)
	tests := []struct {
		name     string
		spec     backend.Spec
		before   map[string]string // files in the project dir before the call; nil: no dir
		inTheWay bool              // a file where the project dir goes
		wantErr  string
	}{
		{name: "initdb fails in a new project", spec: backend.Spec{Name: "newdir", User: "pg_reserved", Password: "x"},
			wantErr: "initdb"},
		{name: "initdb fails in a directory that was there", spec: backend.Spec{Name: "olddir", User: "pg_reserved", Password: "x"},
			before: map[string]string{"keep.txt": "keep", "data/half": "from an interrupted call"}, wantErr: "initdb"},
		{name: "the database cannot be made", spec: backend.Spec{Name: "nodb", User: "pgwake", Password: "x", Database: "template1"},
			wantErr: `create database "template1"`},
		{name: "a file in the way", spec: backend.Spec{Name: "file", User: "pgwake", Password: "x"},
			inTheWay: true, wantErr: "project dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(root, tt.spec.Name)
			for name, content := range tt.before {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tt.inTheWay {
				if err := os.WriteFile(dir, []byte("in the way"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := b.Ensure(t.Context(), tt.spec)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Ensure error %v, want one about %s", err, tt.wantErr)
			}
			switch {
			case tt.inTheWay:
				if got := string(must(os.ReadFile(dir))); got != "in the way" {
					t.Fatalf("the file in the way holds %q", got)
				}
			case tt.before == nil:
				if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("project dir after a failed Ensure: %v, want it gone", err)
				}
			default:
				// What was there stays, except the useless half-made data.
				var left []string
				err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
					if err != nil {
						return err
					}
					if !d.IsDir() {
						left = append(left, must(filepath.Rel(dir, path)))
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(left, []string{"keep.txt"}) {
					t.Fatalf("project dir after a failed Ensure holds %v, want only keep.txt", left)
				}
				entries := must(os.ReadDir(dir))
				if len(entries) != 1 {
					t.Fatalf("project dir after a failed Ensure has %d entries, want keep.txt alone", len(entries))
				}
				// And a good spec then makes the project there.
				good := testSpec(tt.spec.Name)
				if err := b.Ensure(t.Context(), good); err != nil {
					t.Fatal(err)
				}
				if st := status(t, b, good); st.State != backend.StateStopped {
					t.Fatalf("after a good Ensure: %+v", st)
				}
				if _, err := os.Stat(filepath.Join(dir, projectMarker)); err != nil {
					t.Fatalf("no project marker: %v", err)
				}
			}
		})
	}
}

// TestIntegrationPortTakenBeforeBind: another socket takes the port Start
// chose before the postmaster binds it. Start must not hand out that
// address (a client sent there reaches whoever holds it); it starts the
// server on another port. The hook only times the race, which cannot be
// hit on purpose from outside: the socket that takes the port is real.
func TestIntegrationPortTakenBeforeBind(t *testing.T) {
	t.Parallel()
	b := newBackend(t, newRoot(t))
	spec := testSpec("taken")
	var taken net.Listener
	b.beforeLaunch = func(port int) {
		if taken != nil {
			return
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Errorf("take port %d: %v", port, err)
			return
		}
		taken = ln
		t.Cleanup(func() { ln.Close() })
	}
	ep := start(t, b, spec)
	if taken == nil {
		t.Fatal("the hook did not take the port")
	}
	if ep.Addr == taken.Addr().String() {
		t.Fatalf("Start returned %s, the address another socket holds", ep.Addr)
	}
	serve(t, ep, spec)
	url := fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&connect_timeout=5", spec.User, spec.Password, ep.Addr, spec.Database)
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var dir string
	if err := conn.QueryRow(t.Context(), "SHOW data_directory").Scan(&dir); err != nil {
		t.Fatal(err)
	}
	if !samePath(dir, b.dataDir(spec.Name)) {
		t.Fatalf("the server at %s serves %s, want %s", ep.Addr, dir, b.dataDir(spec.Name))
	}
	if st := status(t, b, spec); st.State != backend.StateRunning || st.Addr != ep.Addr || st.ID != ep.ID {
		t.Fatalf("status = %+v, want running at %s as %s", st, ep.Addr, ep.ID)
	}
}

// TestIntegrationAdoptSocketOnlyServer: a pgwake that died while its init
// scripts' server (socket only) ran leaves that server behind; the next
// pgwake's Start stops it and starts one that listens, rather than waiting
// for a TCP port it never opens.
func TestIntegrationAdoptSocketOnlyServer(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	b := newBackend(t, root)
	spec := testSpec("socketonly")
	start(t, b, spec)
	if err := b.Sleep(t.Context(), spec, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	port, err := b.port(spec.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.launchArgs(spec.Name, []string{"-p", strconv.Itoa(port), "-k", b.sockDir(spec.Name), "-c", "listen_addresses="}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the socket-only server made its sockets", until(func() bool {
		pf, err := readPidFile(b.dataDir(spec.Name))
		return err == nil && pf.socketOnly()
	}))
	if st := status(t, b, spec); st.State != backend.StateStopped || st.Addr != "" {
		t.Fatalf("status of a socket-only server = %+v, want stopped without an address", st)
	}

	next := newBackend(t, root) // the pgwake after the one that died
	ep := start(t, next, spec)
	serve(t, ep, spec)
	if st := status(t, next, spec); st.State != backend.StateRunning || st.ID != ep.ID {
		t.Fatalf("status = %+v, want running as %s", st, ep.ID)
	}
}
