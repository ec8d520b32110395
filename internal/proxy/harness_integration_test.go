package proxy_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
)

// harness runs a real proxy.Server on loopback in front of a real Docker
// backend. Everything it creates carries a fresh instance label and is
// removed when the test ends.
type harness struct {
	t        testing.TB
	kit      kit
	image    string
	instance string
	be       backend.Backend
	srv      *proxy.Server
	addr     string

	changed chan struct{} // signalled (non-blocking) on every state change
}

type harnessOptions struct {
	proxy proxy.Options
	// wrap lets a test interpose on backend calls (to hold a sleep call
	// open, for example); the real backend still does the work.
	wrap func(backend.Backend) backend.Backend
}

func newHarness(t testing.TB, k kit, o harnessOptions) *harness {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test; skipped with -short")
	}
	h := &harness{
		t:        t,
		kit:      k,
		image:    k.image(t),
		instance: "t" + randHex(4),
		changed:  make(chan struct{}, 1),
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	be := k.newBackend(t, h.instance, log)
	h.be = be
	if o.wrap != nil {
		h.be = o.wrap(be)
	}

	opts := o.proxy
	opts.Logger = log
	if opts.SweepInterval == 0 {
		opts.SweepInterval = 50 * time.Millisecond
	}
	if opts.WakeTimeout == 0 {
		opts.WakeTimeout = 60 * time.Second
	}
	opts.OnChange = func(string) {
		select {
		case h.changed <- struct{}{}:
		default:
		}
	}
	srv, err := proxy.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	h.srv = srv
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ctx, ln); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer scancel()
		if err := srv.Shutdown(sctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		// Every path must give its connection slot back exactly once.
		if n := srv.OpenConns(); n != 0 {
			t.Errorf("OpenConns after shutdown = %d, want 0", n)
		}
	})
	return h
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// addProject creates a project's server (not started) and registers it.
func (h *harness) addProject(name string, mode backend.SleepMode, sleepAfter time.Duration) backend.Spec {
	h.t.Helper()
	spec := h.newSpec(name)
	h.register(spec, mode, sleepAfter)
	return spec
}

// newSpec is a project of this harness's image with a fresh password.
func (h *harness) newSpec(name string) backend.Spec {
	return backend.Spec{Name: name, Image: h.image, User: "postgres", Password: "pw-" + randHex(8), Database: name}
}

// register creates spec's server (not started) and registers the project.
func (h *harness) register(spec backend.Spec, mode backend.SleepMode, sleepAfter time.Duration) {
	h.t.Helper()
	if err := h.be.Ensure(h.t.Context(), spec); err != nil {
		h.t.Fatal(err)
	}
	if err := h.srv.AddProject(h.t.Context(), proxy.Project{Spec: spec, Backend: h.be, SleepAfter: sleepAfter, SleepMode: mode}); err != nil {
		h.t.Fatal(err)
	}
}

// clientQuery is the query string of the test clients' connection
// strings. Their connect_timeout only guards against a hang: it exceeds
// what pgwake itself may take to answer (a new project's first start,
// bounded by FirstStartTimeout, 5 min by default, then up to WakeTimeout
// of connection retries), so a test sees pgwake's answer, never its own
// client giving up first. A first start (initdb) took 38-70 s here with
// the machine loaded, close to the 90 s this used to be.
const clientQuery = "sslmode=disable&connect_timeout=420"

// url is a connection string through the proxy.
func (h *harness) url(spec backend.Spec) string {
	u := url.URL{
		Scheme: "postgres", User: url.UserPassword(spec.User, spec.Password),
		Host: h.addr, Path: "/" + spec.Name, RawQuery: clientQuery,
	}
	return u.String()
}

func (h *harness) connect(ctx context.Context, spec backend.Spec) *pgx.Conn {
	h.t.Helper()
	conn, err := pgx.Connect(ctx, h.url(spec))
	if err != nil {
		h.t.Fatalf("connect to %s: %v", spec.Name, err)
	}
	h.t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// seed connects to spec's project, runs sql and disconnects.
func (h *harness) seed(spec backend.Spec, sql string) {
	h.t.Helper()
	ctx := h.t.Context()
	conn := h.connect(ctx, spec)
	if _, err := conn.Exec(ctx, sql); err != nil {
		h.t.Fatalf("%s: %v", sql, err)
	}
	conn.Close(ctx)
}

// wantRow fails the test unless sql, run on conn, returns the single value
// want.
func wantRow[T comparable](t testing.TB, conn *pgx.Conn, want T, sql string, args ...any) {
	t.Helper()
	var got T
	if err := conn.QueryRow(t.Context(), sql, args...).Scan(&got); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	if got != want {
		t.Fatalf("%s = %v, want %v", sql, got, want)
	}
}

func (h *harness) status(name string) proxy.Status {
	h.t.Helper()
	st, err := h.srv.ProjectStatus(name)
	if err != nil {
		h.t.Fatal(err)
	}
	return st
}

// waitFor waits, on state-change notifications rather than a fixed sleep,
// until cond holds for the project's status.
func (h *harness) waitFor(name string, what string, timeout time.Duration, cond func(proxy.Status) bool) proxy.Status {
	h.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		st := h.status(name)
		if cond(st) {
			return st
		}
		select {
		case <-h.changed:
		case <-deadline.C:
			h.t.Fatalf("project %s: %s not reached within %s; status %+v", name, what, timeout, st)
		}
	}
}

func (h *harness) waitState(name string, want proxy.State, timeout time.Duration) proxy.Status {
	h.t.Helper()
	return h.waitFor(name, "state "+string(want), timeout, func(st proxy.Status) bool { return st.State == want })
}
