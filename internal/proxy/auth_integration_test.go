package proxy_test

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
)

// TestIntegrationAuthAtProxy: pgwake authenticates the project's user
// itself. A wrong password gets 28P01 without waking anything; psql, pgx
// and psycopg2 requiring SCRAM channel binding log in over pgwake's TLS
// (libpq and pgx refuse to go on unless the server offered and completed
// SCRAM-SHA-256-PLUS, so their success proves the binding).
func TestIntegrationAuthAtProxy(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		h, _ := tlsHarness(t, k)
		spec := h.addProject("authed", backend.SleepStop, 0)
		if st := h.status("authed"); st.Auth != proxy.AuthSCRAM {
			t.Fatalf("auth mode %q, want %q", st.Auth, proxy.AuthSCRAM)
		}

		wrong := spec
		wrong.Password = "not-" + spec.Password
		_, err := pgx.Connect(t.Context(), withParams(h.url(wrong), "sslmode", "require"))
		if code := sqlstate(err); code != "28P01" {
			t.Fatalf("wrong password: %v (SQLSTATE %q), want 28P01", err, code)
		}
		out, err := exec.Command("psql", withParams(h.url(wrong), "sslmode", "require"), "-Atc", "select 1").CombinedOutput()
		if err == nil || !strings.Contains(string(out), `password authentication failed for user "postgres"`) {
			t.Fatalf("psql with a wrong password: %v\n%s", err, out)
		}
		st := h.status("authed")
		if st.State != proxy.StateSleeping || st.Wakes != 0 || st.WakeFails != 0 {
			t.Fatalf("a wrong password woke the project: %+v", st)
		}
		if st.AuthFailures != 2 {
			t.Fatalf("auth failures %d, want 2", st.AuthFailures)
		}

		t.Run("psql channel_binding=require", func(t *testing.T) {
			out, err := exec.Command("psql", withParams(h.url(spec), "sslmode", "require", "channel_binding", "require"),
				"-Atc", "select current_user").CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "postgres" {
				t.Fatalf("psql: %v\n%s", err, out)
			}
		})
		t.Run("pgx channel_binding=require", func(t *testing.T) {
			conn, err := pgx.Connect(t.Context(), withParams(h.url(spec), "sslmode", "require", "channel_binding", "require"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(t.Context())
			wantRow(t, conn, "authed", "select current_database()")
		})
		t.Run("psycopg2 channel_binding=require", func(t *testing.T) {
			script := `import sys, psycopg2
c = psycopg2.connect(sys.argv[1])
cur = c.cursor(); cur.execute("select 40 + 2"); print(cur.fetchone()[0])`
			out, err := exec.Command("/usr/bin/python3", "-c", script, withParams(h.url(spec), "sslmode", "require", "channel_binding", "require")).CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "42" {
				t.Fatalf("psycopg2: %v\n%s", err, out)
			}
		})
		t.Run("plaintext SCRAM", func(t *testing.T) {
			// Without TLS there is no channel to bind: plain SCRAM-SHA-256.
			conn := h.connect(t.Context(), spec)
			wantRow(t, conn, 1, "select 1")
		})
		t.Run("a wrong password takes the server's time", func(t *testing.T) {
			// An awake login is timed: the server's connect, startup and
			// SCRAM until AuthenticationOk.
			h.connect(t.Context(), spec).Close(t.Context())
			took := h.srv.LoginTime("authed")
			start := time.Now()
			_, err := pgconn.Connect(t.Context(), h.url(wrong))
			elapsed := time.Since(start)
			if code := sqlstate(err); code != "28P01" {
				t.Fatalf("wrong password: %v, want 28P01", err)
			}
			if took <= 0 || elapsed < took {
				t.Fatalf("wrong password answered in %s; the server logs in in %s, so no sooner", elapsed, took)
			}
		})
		t.Run("another role passes through", func(t *testing.T) {
			conn := h.connect(t.Context(), spec)
			if _, err := conn.Exec(t.Context(), "create role app login password 'app-pw'"); err != nil {
				t.Fatal(err)
			}
			app := spec
			app.User, app.Password = "app", "app-pw"
			c := h.connect(t.Context(), app)
			wantRow(t, c, "app", "select current_user")
			app.Password = "nope"
			_, err := pgx.Connect(t.Context(), h.url(app))
			if code := sqlstate(err); code != "28P01" {
				t.Fatalf("wrong password of another role: %v, want the server's 28P01", err)
			}
		})
	})
}

// TestIntegrationAuthThrottle: 200 wrong-password attempts from one
// address, 20 at a time, against a sleeping project: nothing wakes, the
// failed-login limit engages (53300 after the burst), and a client with
// the right password from another address logs in at once.
func TestIntegrationAuthThrottle(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		h := newHarness(t, k, harnessOptions{})
		spec := h.addProject("guarded", backend.SleepStop, 0)
		wrong := spec
		wrong.Password = "guess"

		var mu sync.Mutex
		codes := map[string]int{}
		sem := make(chan struct{}, 20)
		var wg sync.WaitGroup
		for range 200 {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				_, err := pgx.Connect(t.Context(), h.url(wrong))
				mu.Lock()
				codes[sqlstate(err)]++
				mu.Unlock()
			})
		}
		wg.Wait()
		t.Logf("answers: %v", codes)
		if codes["28P01"]+codes["53300"] != 200 || codes["28P01"] < 10 || codes["53300"] == 0 {
			t.Fatalf("answers %v: want 200 of 28P01 (at least the burst of 10) and 53300 (the limit)", codes)
		}
		st := h.status("guarded")
		if st.State != proxy.StateSleeping || st.Wakes != 0 {
			t.Fatalf("wrong passwords woke the project: %+v", st)
		}
		if st.AuthThrottled == 0 || st.AuthFailures != codes["28P01"] {
			t.Fatalf("status counts %d failures, %d throttled; want %d and more than 0", st.AuthFailures, st.AuthThrottled, codes["28P01"])
		}

		// Another address (all of 127/8 is loopback) is not throttled.
		cfg, err := pgx.ParseConfig(h.url(spec))
		if err != nil {
			t.Fatal(err)
		}
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
		cfg.DialFunc = d.DialContext
		began := time.Now()
		conn, err := pgx.ConnectConfig(t.Context(), cfg)
		if err != nil {
			t.Fatalf("right password from another address: %v", err)
		}
		defer conn.Close(t.Context())
		wantRow(t, conn, 1, "select 1")
		t.Logf("right password from 127.0.0.2 connected (with the wake) in %s", time.Since(began).Round(time.Millisecond))
		if after := h.status("guarded"); after.AuthThrottled != st.AuthThrottled || after.Wakes != 1 {
			t.Fatalf("the right client was throttled or did not wake it once: %+v", after)
		}
	})
}

// TestIntegrationAuthPassThrough: a project whose password pgwake does not
// hold (an adopted one without its secret) leaves authentication to the
// server; the server's 28P01 counts against the client's address, so a
// client failing over and over stops waking the project after the burst.
func TestIntegrationAuthPassThrough(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		// The runtime knows the server's password (as an adopted
		// workload's own manifest does); the proxy is not told it.
		owner := &ownPassword{}
		h := newHarness(t, k, harnessOptions{
			// No refill within the test: under load a failed login through
			// the Kubernetes path took over a second, and the default
			// one-per-second refill let the fourth try through (28P01).
			proxy: proxy.Options{AuthFailureBurst: 3, AuthFailureEvery: time.Hour, AuthMaxWait: time.Millisecond},
			wrap:  func(b backend.Backend) backend.Backend { owner.Backend = b; return owner },
		})
		spec := h.newSpec("opaque")
		known := spec.Password
		owner.password = known
		spec.Password = ""
		if err := h.be.Ensure(t.Context(), spec); err != nil {
			t.Fatal(err)
		}
		if err := h.srv.AddProject(t.Context(), proxy.Project{Spec: spec, Backend: h.be, SleepMode: backend.SleepStop}); err != nil {
			t.Fatal(err)
		}
		if st := h.status("opaque"); st.Auth != proxy.AuthPassThrough {
			t.Fatalf("auth mode %q, want %q", st.Auth, proxy.AuthPassThrough)
		}
		right := spec
		right.Password = known
		conn := h.connect(t.Context(), right)
		wantRow(t, conn, "opaque", "select current_database()")
		conn.Close(t.Context())

		wrong := right
		wrong.Password = "stale"
		for i := range 3 {
			_, err := pgx.Connect(t.Context(), h.url(wrong))
			if code := sqlstate(err); code != "28P01" {
				t.Fatalf("attempt %d: %v, want the server's 28P01", i, err)
			}
		}
		_, err := pgx.Connect(t.Context(), h.url(wrong))
		if code := sqlstate(err); code != "53300" {
			t.Fatalf("after the burst: %v, want 53300", err)
		}
		if st := h.status("opaque"); st.AuthFailures != 3 || st.AuthThrottled != 1 {
			t.Fatalf("counted %d failures and %d throttled, want 3 and 1", st.AuthFailures, st.AuthThrottled)
		}
	})
}

// ownPassword is a real backend whose runtime holds the server's password
// itself, so the proxy above it can be left without one.
type ownPassword struct {
	backend.Backend
	password string
}

func (o *ownPassword) with(s backend.Spec) backend.Spec { s.Password = o.password; return s }

func (o *ownPassword) Ensure(ctx context.Context, s backend.Spec) error {
	return o.Backend.Ensure(ctx, o.with(s))
}

func (o *ownPassword) Start(ctx context.Context, s backend.Spec) (backend.Endpoint, error) {
	return o.Backend.Start(ctx, o.with(s))
}

func (o *ownPassword) Sleep(ctx context.Context, s backend.Spec, m backend.SleepMode) error {
	return o.Backend.Sleep(ctx, o.with(s), m)
}

func (o *ownPassword) Status(ctx context.Context, s backend.Spec) (backend.Status, error) {
	return o.Backend.Status(ctx, o.with(s))
}

func (o *ownPassword) Remove(ctx context.Context, s backend.Spec, volumes bool) error {
	return o.Backend.Remove(ctx, o.with(s), volumes)
}

func sqlstate(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	if err == nil {
		return "ok"
	}
	return "error: " + err.Error()
}
