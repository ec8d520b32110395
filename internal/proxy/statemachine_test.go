package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
)

// scriptBackend is a FAKE runtime. It exists because a real runtime cannot
// be made, on demand and at a chosen instant, to let a server die while it
// wakes, to hand a crashed server's address to another server, or to lose
// its engine; the real-parts suites (*_integration_test.go) cover every
// path a real runtime can produce. What Status reports is set by the test;
// start, when set, is what Start does.
type scriptBackend struct {
	mu     sync.Mutex
	status backend.Status
	start  func() (backend.Endpoint, error)
	logs   string
	err    error // returned by every call when set: an unreachable runtime
	starts int
	// When set, Sleep signals inSleep and waits for sleepGate.
	inSleep   chan struct{}
	sleepGate chan struct{}
	// sleeps are the modes Sleep was called with, in order; sleepErr, when
	// set, is what a Sleep of that mode returns (nil: it works).
	sleeps   []backend.SleepMode
	sleepErr func(backend.SleepMode) error
}

func (b *scriptBackend) Name() string { return "script" }
func (b *scriptBackend) Close() error { return nil }

func (b *scriptBackend) Ensure(context.Context, backend.Spec) error { return b.failure() }
func (b *scriptBackend) Remove(context.Context, backend.Spec, bool) error {
	return b.failure()
}

func (b *scriptBackend) failure() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

func (b *scriptBackend) Start(context.Context, backend.Spec) (backend.Endpoint, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.starts++
	if b.err != nil {
		return backend.Endpoint{}, b.err
	}
	return b.start()
}

// Sleep pauses a running server (it keeps its run and address) or stops
// it.
func (b *scriptBackend) Sleep(_ context.Context, _ backend.Spec, mode backend.SleepMode) error {
	if b.sleepGate != nil {
		b.inSleep <- struct{}{}
		<-b.sleepGate
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sleeps = append(b.sleeps, mode)
	if b.err != nil {
		return b.err
	}
	if b.sleepErr != nil {
		if err := b.sleepErr(mode); err != nil {
			return err
		}
	}
	if mode == backend.SleepPause && b.status.State == backend.StateRunning {
		b.status.State = backend.StatePaused
		return nil
	}
	b.status = backend.Status{State: backend.StateStopped}
	return nil
}

func (b *scriptBackend) sleepModes() []backend.SleepMode {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]backend.SleepMode(nil), b.sleeps...)
}

func (b *scriptBackend) Status(context.Context, backend.Spec) (backend.Status, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.status, b.err
}

func (b *scriptBackend) Logs(context.Context, backend.Spec, bool, int) (io.ReadCloser, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return io.NopCloser(strings.NewReader(b.logs)), nil
}

func (b *scriptBackend) set(st backend.Status) {
	b.mu.Lock()
	b.status = st
	b.mu.Unlock()
}

func (b *scriptBackend) startCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.starts
}

// watchingScript adds the Watcher capability: the test sends the events.
type watchingScript struct {
	*scriptBackend
	events chan backend.Event
}

func (w *watchingScript) Watch(ctx context.Context) <-chan backend.Event {
	out := make(chan backend.Event)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-w.events:
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// serveBackend runs a proxy with one project "app" on be.
func serveBackend(t *testing.T, be backend.Backend, opts proxy.Options) (*proxy.Server, string) {
	t.Helper()
	return serveProject(t, proxy.Project{Spec: backend.Spec{Name: "app", User: "u", Database: "app"}, Backend: be}, opts)
}

// serveProject runs a proxy with the one project p; setup runs on the
// server before p is added.
func serveProject(t *testing.T, p proxy.Project, opts proxy.Options, setup ...func(*proxy.Server)) (*proxy.Server, string) {
	t.Helper()
	if opts.ReadyPoll == 0 {
		opts.ReadyPoll = time.Millisecond
	}
	if opts.WakeTimeout == 0 {
		// Far beyond the test's own deadline: a wake that ends, ends
		// because pgwake saw why, not because it timed out.
		opts.WakeTimeout = 10 * time.Minute
	}
	srv, err := proxy.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range setup {
		f(srv)
	}
	if err := srv.AddProject(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(context.Background(), ln) }()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return srv, ln.Addr().String()
}

// connectErr connects through the proxy and returns the Postgres error the
// client got; a test deadline far below the wake timeout proves the proxy
// answered because it knew, not because it gave up.
func connectErr(t *testing.T, addr string) *pgconn.PgError {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, "postgres://u@"+addr+"/app?sslmode=disable")
	if err == nil {
		conn.Close(context.Background())
		t.Fatal("connected; want an error")
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		t.Fatalf("err = %v, want a Postgres error from the proxy", err)
	}
	return pgErr
}

func connectVersion(t *testing.T, addr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, "postgres://u@"+addr+"/app?sslmode=disable")
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	return conn.ParameterStatus("server_version")
}

func TestServerDyingWhileWakingEndsTheWakeWithItsReason(t *testing.T) {
	t.Parallel()
	addr := deadAddr(t)
	be := &scriptBackend{logs: "LOG:  starting PostgreSQL\nFATAL:  deliberate crash in postgresql.conf\n"}
	be.start = func() (backend.Endpoint, error) {
		// The runtime started it, and it exited before it ever served.
		be.status = backend.Status{State: backend.StateStopped, Exit: "exited with code 3"}
		return backend.Endpoint{Addr: addr, ID: "run-1"}, nil
	}
	srv, paddr := serveBackend(t, be, proxy.Options{StatusInterval: 20 * time.Millisecond, BackoffBase: time.Hour})

	pgErr := connectErr(t, paddr)
	if pgErr.Code != "08006" {
		t.Fatalf("code %s, want 08006", pgErr.Code)
	}
	for _, want := range []string{"exited with code 3", "FATAL:  deliberate crash"} {
		if !strings.Contains(pgErr.Message, want) {
			t.Errorf("client's message %q lacks %q", pgErr.Message, want)
		}
	}
	st, _ := srv.ProjectStatus("app")
	if st.State != proxy.StateSleeping || st.WakeFails != 1 || st.RetryAt.IsZero() {
		t.Fatalf("after the failed wake: state %s, failures %d, retry at %v; want sleeping, 1, backing off", st.State, st.WakeFails, st.RetryAt)
	}
	if !strings.Contains(st.LastError, "exited with code 3") || !strings.Contains(st.LastError, "deliberate crash") {
		t.Fatalf("status last error %q lacks the exit and the log", st.LastError)
	}
}

func TestDieEventDuringWakeEndsItAtOnce(t *testing.T) {
	t.Parallel()
	addr := deadAddr(t)
	started := make(chan struct{})
	be := &watchingScript{scriptBackend: &scriptBackend{}, events: make(chan backend.Event)}
	be.start = func() (backend.Endpoint, error) {
		be.status = backend.Status{State: backend.StateStopped, Exit: "exited with code 1"}
		close(started)
		return backend.Endpoint{Addr: addr, ID: "run-1"}, nil
	}
	// No periodic check within the test's life: only the event can end it.
	_, paddr := serveBackend(t, be, proxy.Options{StatusInterval: time.Hour})
	go func() {
		<-started
		be.events <- backend.Event{Project: "app", State: backend.StateStopped}
	}()
	if pgErr := connectErr(t, paddr); pgErr.Code != "08006" || !strings.Contains(pgErr.Message, "exited with code 1") {
		t.Fatalf("got %s %q, want 08006 with the exit", pgErr.Code, pgErr.Message)
	}
}

func TestWakeNeverLandsOnAnotherServer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		after backend.Status // what the runtime reports once something answered
		want  string
	}{
		{"ours exited, its address reused", backend.Status{State: backend.StateStopped, Exit: "exited with code 1"}, "exited with code 1"},
		{"restarted outside pgwake", backend.Status{State: backend.StateRunning, ID: "someone-elses-run"}, "restarted outside pgwake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			other := newScriptedUpstream(t).named("15-another-project")
			be := &scriptBackend{}
			be.start = func() (backend.Endpoint, error) {
				after := tc.after
				if after.State == backend.StateRunning {
					after.Addr = other.ln.Addr().String()
				}
				be.status = after
				return backend.Endpoint{Addr: other.ln.Addr().String(), ID: "our-run"}, nil
			}
			srv, paddr := serveBackend(t, be, proxy.Options{BackoffBase: time.Hour})
			pgErr := connectErr(t, paddr)
			if pgErr.Code != "08006" || !strings.Contains(pgErr.Message, tc.want) {
				t.Fatalf("got %s %q, want 08006 with %q", pgErr.Code, pgErr.Message, tc.want)
			}
			if st, _ := srv.ProjectStatus("app"); st.State != proxy.StateSleeping || st.Wakes != 0 {
				t.Fatalf("state %s with %d wakes: the other server's answer was taken for ours", st.State, st.Wakes)
			}
		})
	}
}

func TestRunningProjectWhoseAddressWasReusedIsWokenNotRelayed(t *testing.T) {
	t.Parallel()
	// What takes over the crashed server's address: another Postgres that
	// answers, or something that accepts and never says a word (a paused
	// server): neither may hold or reach the client.
	for _, squatter := range []string{"answers", "silent"} {
		t.Run(squatter, func(t *testing.T) {
			t.Parallel()
			first := newScriptedUpstream(t).named("15-ours-first-run")
			second := newScriptedUpstream(t).named("15-ours-second-run")
			firstAddr := first.ln.Addr().String()

			be := &scriptBackend{}
			be.start = func() (backend.Endpoint, error) {
				ep := backend.Endpoint{Addr: firstAddr, ID: "run-1"}
				if be.starts > 1 {
					ep = backend.Endpoint{Addr: second.ln.Addr().String(), ID: "run-2"}
				}
				be.status = backend.Status{State: backend.StateRunning, Addr: ep.Addr, ID: ep.ID}
				return ep, nil
			}
			srv, paddr := serveBackend(t, be, proxy.Options{})
			if v := connectVersion(t, paddr); v != "15-ours-first-run" {
				t.Fatalf("first client reached %q", v)
			}

			// The server crashes, no event arrives (a lagging event stream),
			// and something else takes its address.
			first.ln.Close()
			first.wg.Wait()
			be.set(backend.Status{State: backend.StateStopped, Exit: "killed"})
			ln, err := net.Listen("tcp", firstAddr)
			if err != nil {
				t.Skipf("could not take over %s: %v", firstAddr, err)
			}
			if squatter == "answers" {
				other := &scriptedUpstream{ln: ln, version: "15-another-project"}
				other.wg.Add(1)
				go other.serve()
				t.Cleanup(func() { ln.Close(); other.wg.Wait() })
			} else {
				holdSilent(t, ln)
			}

			for i := range 3 {
				if v := connectVersion(t, paddr); v != "15-ours-second-run" {
					t.Fatalf("client %d reached %q, want this project's own restarted server", i, v)
				}
			}
			if st, _ := srv.ProjectStatus("app"); st.Wakes != 2 || be.startCount() != 2 {
				t.Fatalf("wakes %d, starts %d; want 2 and 2", st.Wakes, be.startCount())
			}
		})
	}
}

// stalePause is scriptBackend reporting its running server paused for the
// next n reads (FAKE: Docker 20.10 does so for a moment when it applies a
// pause's event after the unpause that followed, which no test can make it
// do on demand).
type stalePause struct {
	*scriptBackend
	n atomic.Int32
}

func (b *stalePause) Status(ctx context.Context, spec backend.Spec) (backend.Status, error) {
	st, err := b.scriptBackend.Status(ctx, spec)
	if err == nil && st.State == backend.StateRunning && b.n.Add(-1) >= 0 {
		st = backend.Status{State: backend.StatePaused, ID: st.ID}
	}
	return st, err
}

func TestStalePausedReportDoesNotWakeAServingServerAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		stale     int32
		wantWakes int
	}{
		{"stale for a few reads", 3, 1},
		// Paused for good (by hand) while pgwake serves it: believed after
		// the settle bound, so the client gets the server woken again.
		{"paused for good", 1 << 30, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := newScriptedUpstream(t).named("15-ours")
			be := &stalePause{scriptBackend: &scriptBackend{}}
			be.start = func() (backend.Endpoint, error) {
				if be.starts > 1 {
					be.n.Store(0) // the wake's unpause: running, and reported so
				}
				be.status = backend.Status{State: backend.StateRunning, Addr: up.ln.Addr().String(), ID: "run-1"}
				return backend.Endpoint{Addr: up.ln.Addr().String(), ID: "run-1"}, nil
			}
			srv, paddr := serveBackend(t, be, proxy.Options{ReadyPoll: 10 * time.Millisecond})
			if v := connectVersion(t, paddr); v != "15-ours" {
				t.Fatalf("first client reached %q", v)
			}
			be.n.Store(tc.stale)
			if v := connectVersion(t, paddr); v != "15-ours" {
				t.Fatalf("second client reached %q", v)
			}
			if st, _ := srv.ProjectStatus("app"); st.Wakes != tc.wantWakes || be.startCount() != tc.wantWakes {
				t.Fatalf("wakes %d, starts %d; want %d", st.Wakes, be.startCount(), tc.wantWakes)
			}
		})
	}
}

// holdSilent accepts connections on ln and never writes to them.
func holdSilent(t *testing.T, ln net.Listener) {
	var mu sync.Mutex
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
}

func TestFailedWakeLeavesNoServerRunningAfterShutdown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	holdSilent(t, ln) // started, never ready
	be := &scriptBackend{}
	be.start = func() (backend.Endpoint, error) {
		be.status = backend.Status{State: backend.StateRunning, Addr: ln.Addr().String(), ID: "run-1"}
		return backend.Endpoint{Addr: ln.Addr().String(), ID: "run-1"}, nil
	}
	srv, paddr := serveBackend(t, be, proxy.Options{WakeTimeout: 300 * time.Millisecond, BackoffBase: time.Hour})
	if pgErr := connectErr(t, paddr); pgErr.Code != "08006" {
		t.Fatalf("code %s, want 08006", pgErr.Code)
	}
	// Twice, concurrently: both calls return.
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- srv.Shutdown(context.Background()) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	}
	if st, _ := be.Status(t.Context(), backend.Spec{}); st.State != backend.StateStopped {
		t.Fatalf("server %s after shutdown; the failed wake's server must be stopped", st.State)
	}
}

func TestUnreachableRuntimeIsReportedNeverReplaced(t *testing.T) {
	t.Parallel()
	be := &scriptBackend{err: fmt.Errorf("%w: docker engine unreachable at unix:///nowhere", backend.ErrUnavailable)}
	srv, paddr := serveBackend(t, be, proxy.Options{BackoffBase: time.Hour})
	if st, _ := srv.ProjectStatus("app"); !strings.Contains(st.LastError, "unreachable") {
		t.Fatalf("registered without the runtime's error: %q", st.LastError)
	}
	pgErr := connectErr(t, paddr)
	if pgErr.Code != "08006" || !strings.Contains(pgErr.Message, "docker engine unreachable") {
		t.Fatalf("got %s %q, want 08006 naming the unreachable engine", pgErr.Code, pgErr.Message)
	}
}

func TestClientArrivingDuringSleepIsParkedAndWokenAgain(t *testing.T) {
	t.Parallel()
	u := newScriptedUpstream(t)
	be := &scriptBackend{inSleep: make(chan struct{}), sleepGate: make(chan struct{})}
	be.start = func() (backend.Endpoint, error) {
		id := fmt.Sprintf("run-%d", be.starts)
		be.status = backend.Status{State: backend.StateRunning, Addr: u.ln.Addr().String(), ID: id}
		return backend.Endpoint{Addr: u.ln.Addr().String(), ID: id}, nil
	}
	srv, paddr := serveBackend(t, be, proxy.Options{})
	if err := srv.Wake(t.Context(), "app"); err != nil {
		t.Fatal(err)
	}
	slept := make(chan error, 1)
	go func() { slept <- srv.Sleep(context.Background(), "app") }()
	<-be.inSleep // the sleep is inside the runtime call

	got := make(chan string, 1)
	go func() { got <- connectVersion(t, paddr) }()
	deadline := time.After(30 * time.Second)
	for {
		if st, _ := srv.ProjectStatus("app"); st.Queued == 1 {
			break // parked behind the sleep, holding its slot
		}
		select {
		case <-deadline:
			t.Fatal("the client was not parked behind the sleep")
		case <-time.After(time.Millisecond):
		}
	}
	close(be.sleepGate)
	if err := <-slept; err != nil {
		t.Fatal(err)
	}
	if v := <-got; v != "15-scripted" {
		t.Fatalf("client reached %q", v)
	}
	if st, _ := srv.ProjectStatus("app"); st.Wakes != 2 || be.startCount() != 2 {
		t.Fatalf("wakes %d, starts %d; want the project woken again after the sleep", st.Wakes, be.startCount())
	}
}

func TestFirstStartIsKeptOutOfWakeLatencies(t *testing.T) {
	t.Parallel()
	u := newScriptedUpstream(t)
	be := &scriptBackend{}
	be.start = func() (backend.Endpoint, error) {
		be.status = backend.Status{State: backend.StateRunning, Addr: u.ln.Addr().String(), ID: fmt.Sprint(be.starts)}
		return backend.Endpoint{Addr: u.ln.Addr().String(), ID: fmt.Sprint(be.starts), First: be.starts == 1}, nil
	}
	srv, _ := serveBackend(t, be, proxy.Options{})
	if err := srv.Wake(t.Context(), "app"); err != nil {
		t.Fatal(err)
	}
	st, _ := srv.ProjectStatus("app")
	if st.FirstStart <= 0 || len(st.Recent) != 0 || st.LastWake != 0 {
		t.Fatalf("after the first start: first %v, recent %v, last %v; want it outside the wake figures", st.FirstStart, st.Recent, st.LastWake)
	}
	if err := srv.Sleep(t.Context(), "app"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Wake(t.Context(), "app"); err != nil {
		t.Fatal(err)
	}
	if st, _ := srv.ProjectStatus("app"); len(st.Recent) != 1 || st.Wakes != 2 {
		t.Fatalf("after a real wake: recent %v, wakes %d", st.Recent, st.Wakes)
	}
}

// A client that connects to a project held for longer than the wake
// timeout (a large copy) is told to try again, 57P03 with why it is held,
// and nothing starts the server under the copy.
func TestHeldTooLongTellsClientsToRetry(t *testing.T) {
	t.Parallel()
	be := &scriptBackend{status: backend.Status{State: backend.StateStopped}}
	// The wake timeout bounds only the wait for the hold here: the hold
	// lasts until the client has its answer, however slow the machine.
	srv, addr := serveBackend(t, be, proxy.Options{StatusInterval: time.Hour, WakeTimeout: 300 * time.Millisecond})
	entered, gate := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		held <- srv.HoldAsleep(t.Context(), "app", proxy.HoldNoStop, false, "branch app-2", func(context.Context) error {
			close(entered)
			<-gate
			return nil
		})
	}()
	<-entered
	pgErr := connectErr(t, addr)
	if pgErr.Code != "57P03" || !strings.Contains(pgErr.Message, "held for branch app-2") {
		t.Errorf("client of a held project got %s %q, want 57P03 naming the branch", pgErr.Code, pgErr.Message)
	}
	var he *proxy.HeldError
	if err := srv.Wake(t.Context(), "app"); !errors.As(err, &he) || he.For != "branch app-2" {
		t.Errorf("Wake of a held project: %v, want a HeldError", err)
	}
	if st, _ := srv.ProjectStatus("app"); st.State != proxy.StateHeld || st.Queued != 0 {
		t.Errorf("after the clients gave up: %s with %d queued, want held with none", st.State, st.Queued)
	}
	close(gate)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if n := be.startCount(); n != 0 {
		t.Fatalf("%d starts, want 0", n)
	}
}

// A hold keeps a sleeping project asleep while its data is copied: a wake
// asked for meanwhile waits for the hold, and starts the server after it,
// once. An awake project is not held unless the hold may stop it.
func TestHoldAsleepParksWakesUntilDone(t *testing.T) {
	t.Parallel()
	addr := deadAddr(t)
	be := &scriptBackend{status: backend.Status{State: backend.StateStopped}}
	be.start = func() (backend.Endpoint, error) {
		be.status = backend.Status{State: backend.StateRunning, Addr: addr, ID: "run-1"}
		return backend.Endpoint{Addr: addr, ID: "run-1", Serving: true}, nil
	}
	srv, _ := serveBackend(t, be, proxy.Options{StatusInterval: time.Hour})
	ctx := t.Context()

	entered, gate := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		held <- srv.HoldAsleep(ctx, "app", proxy.HoldNoStop, false, "copy", func(context.Context) error {
			close(entered)
			<-gate
			return nil
		})
	}()
	<-entered
	if st, _ := srv.ProjectStatus("app"); st.State != proxy.StateHeld {
		t.Fatalf("state %s during the hold, want held", st.State)
	}
	woke := make(chan error, 1)
	go func() { woke <- srv.Wake(ctx, "app") }()
	for {
		st, _ := srv.ProjectStatus("app")
		if st.Queued == 1 {
			break
		}
		select {
		case err := <-woke:
			t.Fatalf("a wake during the hold returned %v before the hold ended", err)
		case <-time.After(time.Millisecond):
		}
	}
	if n := be.startCount(); n != 0 {
		t.Fatalf("%d starts during the hold, want 0", n)
	}
	close(gate)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if err := <-woke; err != nil {
		t.Fatalf("the wake that waited for the hold: %v", err)
	}
	if n := be.startCount(); n != 1 {
		t.Fatalf("%d starts, want 1", n)
	}
	err := srv.HoldAsleep(ctx, "app", proxy.HoldNoStop, false, "copy", func(context.Context) error {
		t.Error("held an awake project")
		return nil
	})
	if !errors.Is(err, proxy.ErrAwake) {
		t.Fatalf("hold of an awake project: %v, want ErrAwake", err)
	}
	// May stop it: it is stopped, held, and sleeping after.
	if err := srv.HoldAsleep(ctx, "app", proxy.HoldStopDiscard, false, "reset", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if st, _ := srv.ProjectStatus("app"); st.State != proxy.StateSleeping {
		t.Fatalf("after a stopping hold: %s, want sleeping", st.State)
	}
	if st, _ := be.Status(ctx, backend.Spec{}); st.State != backend.StateStopped {
		t.Fatalf("the server is %s after a stopping hold, want stopped", st.State)
	}
}
