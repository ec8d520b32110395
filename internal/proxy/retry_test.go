package proxy_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
)

// scriptedUpstream is a FAKE Postgres server, used because a real Postgres
// cannot be made to answer 57P03 ("the database system is starting up") or
// to close a connection without a byte on demand. Each accepted connection
// takes the next step of the script; after the script it answers like a
// server that accepts the login.
type scriptedUpstream struct {
	ln net.Listener

	mu       sync.Mutex
	script   []string // "57P03", "eof" or "ok"
	attempts int
	version  string        // server_version it reports: which server a client reached
	delay    time.Duration // before each reply: a slow path to the server
	wg       sync.WaitGroup
}

func newScriptedUpstream(t testing.TB, script ...string) *scriptedUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &scriptedUpstream{ln: ln, script: script, version: "15-scripted"}
	u.wg.Add(1)
	go u.serve()
	t.Cleanup(func() { ln.Close(); u.wg.Wait() })
	return u
}

func (u *scriptedUpstream) serve() {
	defer u.wg.Done()
	for {
		c, err := u.ln.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		step := "ok"
		if u.attempts < len(u.script) {
			step = u.script[u.attempts]
		}
		u.attempts++
		version, delay := u.version, u.delay
		u.mu.Unlock()
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			defer c.Close()
			be := pgproto3.NewBackend(c, c)
			if _, err := be.ReceiveStartupMessage(); err != nil {
				return
			}
			time.Sleep(delay) // the slow path itself, not a synchronisation
			switch step {
			case "eof":
				return
			case "57P03":
				be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "57P03", Message: "the database system is starting up"})
				be.Flush()
				return
			}
			be.Send(&pgproto3.AuthenticationOk{})
			be.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: version})
			be.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}})
			be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
			if be.Flush() != nil {
				return
			}
			for {
				msg, err := be.Receive()
				if err != nil {
					return
				}
				if _, ok := msg.(*pgproto3.Terminate); ok {
					return
				}
			}
		}()
	}
}

// named sets the server_version the server reports, so a test can tell
// which server a client reached.
func (u *scriptedUpstream) named(version string) *scriptedUpstream {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.version = version
	return u
}

// slow makes every reply come d after the startup packet.
func (u *scriptedUpstream) slow(d time.Duration) *scriptedUpstream {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.delay = d
	return u
}

func (u *scriptedUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.attempts
}

// addrBackend is a FAKE backend that "starts" a server at a fixed address
// (the scripted upstream); it exists only to put that fake behind the proxy.
type addrBackend struct {
	addr string

	mu      sync.Mutex
	running bool
}

func (b *addrBackend) Name() string                                     { return "scripted" }
func (b *addrBackend) Ensure(context.Context, backend.Spec) error       { return nil }
func (b *addrBackend) Remove(context.Context, backend.Spec, bool) error { return nil }
func (b *addrBackend) Close() error                                     { return nil }
func (b *addrBackend) Start(context.Context, backend.Spec) (backend.Endpoint, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.running = true
	return backend.Endpoint{Addr: b.addr}, nil
}
func (b *addrBackend) Sleep(context.Context, backend.Spec, backend.SleepMode) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.running = false
	return nil
}
func (b *addrBackend) Status(context.Context, backend.Spec) (backend.Status, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running {
		return backend.Status{State: backend.StateRunning, Addr: b.addr}, nil
	}
	return backend.Status{State: backend.StateStopped}, nil
}

func serveScripted(t *testing.T, u *scriptedUpstream, opts proxy.Options) (*proxy.Server, string) {
	t.Helper()
	return serveBackend(t, &addrBackend{addr: u.ln.Addr().String()}, opts)
}

func TestRetriesStartingUpAndEarlyEOF(t *testing.T) {
	t.Parallel()
	// The wake's readiness probe meets 57P03 then EOF; then the client's own
	// replayed startup meets the same, and must still get through.
	u := newScriptedUpstream(t, "57P03", "eof", "ok", "57P03", "eof", "57P03")
	_, addr := serveScripted(t, u, proxy.Options{})
	conn, err := pgconn.Connect(t.Context(), "postgres://u@"+addr+"/app?sslmode=disable")
	if err != nil {
		t.Fatalf("client saw %v; the proxy should have retried", err)
	}
	defer conn.Close(context.Background())
	if v := conn.ParameterStatus("server_version"); v != "15-scripted" {
		t.Fatalf("server_version %q", v)
	}
	if n := u.count(); n != 7 {
		t.Fatalf("upstream saw %d connections, want 7 (3 probe + 4 client)", n)
	}
}

// TestSlowPathStillWakes: a server that answers every readiness probe
// later than the first probe's bound (as through a port-forward on a busy
// API server) is seen to serve, because each timed-out probe doubles the
// bound. With a fixed bound every probe timed out until the wake failed.
func TestSlowPathStillWakes(t *testing.T) {
	t.Parallel()
	u := newScriptedUpstream(t).slow(2500 * time.Millisecond)
	srv, addr := serveScripted(t, u, proxy.Options{WakeTimeout: 40 * time.Second, BackoffBase: time.Hour})
	conn, err := pgconn.Connect(t.Context(), "postgres://u@"+addr+"/app?sslmode=disable")
	if err != nil {
		t.Fatalf("client saw %v; the wake should have waited for the slow server", err)
	}
	defer conn.Close(context.Background())
	if st, _ := srv.ProjectStatus("app"); st.State != proxy.StateRunning || st.WakeFails != 0 {
		t.Fatalf("state %s, wake failures %d; want running and none", st.State, st.WakeFails)
	}
}

func TestStartingUpUntilDeadlineFails(t *testing.T) {
	t.Parallel()
	script := make([]string, 1_000_000)
	for i := range script {
		script[i] = "57P03"
	}
	u := newScriptedUpstream(t, script...)
	srv, addr := serveScripted(t, u, proxy.Options{WakeTimeout: 300 * time.Millisecond, BackoffBase: time.Hour})
	_, err := pgconn.Connect(t.Context(), "postgres://u@"+addr+"/app?sslmode=disable")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		t.Fatalf("err = %v, want a Postgres error", err)
	}
	if pgErr.Code != "08006" || !strings.Contains(pgErr.Message, "starting up") {
		t.Fatalf("got %s %q, want 08006 with the backend's reason", pgErr.Code, pgErr.Message)
	}
	st, _ := srv.ProjectStatus("app")
	if st.State != proxy.StateSleeping || st.WakeFails != 1 {
		t.Fatalf("after a timed-out wake: state %s failures %d, want sleeping and 1", st.State, st.WakeFails)
	}
}

// gatedBackend holds Start until released, to remove a project mid-wake.
type gatedBackend struct {
	*addrBackend
	entered  chan struct{}
	release  chan struct{}
	returned atomic.Bool
}

func (b *gatedBackend) Start(ctx context.Context, spec backend.Spec) (backend.Endpoint, error) {
	close(b.entered)
	<-b.release
	defer b.returned.Store(true)
	return b.addrBackend.Start(ctx, spec)
}

func TestRemoveProjectWaitsForInflightWake(t *testing.T) {
	t.Parallel()
	u := newScriptedUpstream(t)
	gb := &gatedBackend{addrBackend: &addrBackend{addr: u.ln.Addr().String()}, entered: make(chan struct{}), release: make(chan struct{})}
	srv, err := proxy.New(proxy.Options{ReadyPoll: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.AddProject(t.Context(), proxy.Project{Spec: backend.Spec{Name: "app", User: "u", Database: "app"}, Backend: gb}); err != nil {
		t.Fatal(err)
	}
	go srv.Wake(context.Background(), "app")
	<-gb.entered // the wake is inside Start

	removed := make(chan struct{})
	go func() {
		srv.RemoveProject("app")
		close(removed)
	}()
	close(gb.release)
	<-removed
	// The caller deletes the server right after RemoveProject returns; the
	// wake must be over by then, or it would race that deletion.
	if !gb.returned.Load() {
		t.Fatal("RemoveProject returned while the wake's Start was still running")
	}
}

func TestParkedClientHangingUpFreesItsSlot(t *testing.T) {
	t.Parallel()
	u := newScriptedUpstream(t)
	gb := &gatedBackend{addrBackend: &addrBackend{addr: u.ln.Addr().String()}, entered: make(chan struct{}), release: make(chan struct{})}
	changed := make(chan struct{}, 1)
	srv, err := proxy.New(proxy.Options{ReadyPoll: time.Millisecond, OnChange: func(string) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	defer close(gb.release)
	if err := srv.AddProject(t.Context(), proxy.Project{Spec: backend.Spec{Name: "app", User: "u", Database: "app"}, Backend: gb}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(t.Context(), ln)

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	pkt, _ := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"user": "u", "database": "app"}}).Encode(nil)
	c.Write(pkt)
	<-gb.entered // parked: the wake is held inside Start
	waitActive := func(want int) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			if st, _ := srv.ProjectStatus("app"); st.Active == want {
				return
			}
			select {
			case <-changed:
			case <-deadline:
				st, _ := srv.ProjectStatus("app")
				t.Fatalf("active = %d, want %d", st.Active, want)
			}
		}
	}
	waitActive(1)
	c.Close()
	// The wake is still held, yet the slot comes back.
	waitActive(0)
	if srv.OpenConns() != 0 {
		t.Fatalf("OpenConns = %d after the parked client left", srv.OpenConns())
	}
}
