package proxy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/certs"
	"github.com/pgwake/pgwake/internal/proxy"
)

// tlsHarness is a harness whose proxy offers TLS with a generated local CA.
func tlsHarness(t *testing.T, k kit) (*harness, string) {
	t.Helper()
	dir := t.TempDir()
	conf, err := certs.ServerConfig(dir, "", "", nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, k, harnessOptions{proxy: proxy.Options{TLS: conf}})
	return h, certs.CAPath(dir)
}

func withParams(u string, kv ...string) string {
	parsed, _ := url.Parse(u)
	q := parsed.Query()
	for i := 0; i < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

func TestIntegrationTLS(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		h, ca := tlsHarness(t, k)
		spec := h.addProject("secure", backend.SleepStop, 0)
		_, port, _ := net.SplitHostPort(h.addr)

		t.Run("psql sslmode=require", func(t *testing.T) {
			out, err := exec.Command("psql", withParams(h.url(spec), "sslmode", "require"), "-Atc", "select 1").CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "1" {
				t.Fatalf("psql: %v\n%s", err, out)
			}
		})
		t.Run("psql verify-full against the local CA", func(t *testing.T) {
			u := "postgres://postgres:" + url.QueryEscape(spec.Password) + "@localhost:" + port + "/secure?sslmode=verify-full&sslrootcert=" + url.QueryEscape(ca)
			out, err := exec.Command("psql", u, "-Atc", "select 2").CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "2" {
				t.Fatalf("psql: %v\n%s", err, out)
			}
		})
		t.Run("psql verify-full rejects another CA", func(t *testing.T) {
			// Another pgwake's local CA: a different key, same names.
			dir := t.TempDir()
			if _, err := certs.ServerConfig(dir, "", "", nil, time.Now()); err != nil {
				t.Fatal(err)
			}
			u := "postgres://postgres:x@localhost:" + port + "/secure?sslmode=verify-full&sslrootcert=" + url.QueryEscape(certs.CAPath(dir))
			out, err := exec.Command("psql", u, "-Atc", "select 1").CombinedOutput()
			if err == nil || !strings.Contains(string(out), "certificate verify failed") {
				t.Fatalf("psql with a foreign CA: %v\n%s", err, out)
			}
		})
		t.Run("pgx direct TLS", func(t *testing.T) {
			cfg, err := pgx.ParseConfig(withParams(h.url(spec), "sslmode", "require", "sslnegotiation", "direct"))
			if err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.ConnectConfig(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(t.Context())
			var n int
			if err := conn.QueryRow(t.Context(), "select 3").Scan(&n); err != nil || n != 3 {
				t.Fatalf("query: %d %v", n, err)
			}
		})
		t.Run("direct TLS without ALPN is refused", func(t *testing.T) {
			raw, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			tc := tls.Client(raw, &tls.Config{InsecureSkipVerify: true}) // no NextProtos
			_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
			err = tc.Handshake()
			if err == nil {
				var b [1]byte
				_, err = tc.Read(b[:])
			}
			if err == nil {
				t.Fatal("direct TLS without ALPN postgresql was accepted")
			}
		})
		t.Run("GSSENCRequest answered N, then SSLRequest S", func(t *testing.T) {
			raw := rawConn(t, h.addr)
			for _, req := range []struct {
				code uint32
				want byte
			}{{80877104, 'N'}, {80877103, 'S'}} {
				b := []byte{0, 0, 0, 8, byte(req.code >> 24), byte(req.code >> 16), byte(req.code >> 8), byte(req.code)}
				if _, err := raw.Write(b); err != nil {
					t.Fatal(err)
				}
				var got [1]byte
				if _, err := raw.Read(got[:]); err != nil || got[0] != req.want {
					t.Fatalf("request %d answered %q (%v), want %q", req.code, got[0], err, req.want)
				}
			}
			pool := x509.NewCertPool()
			data, _ := os.ReadFile(ca)
			pool.AppendCertsFromPEM(data)
			tc := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: "localhost"})
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			if _, err := tc.Write(startupPacket(t, map[string]string{"user": "postgres", "database": "secure"})); err != nil {
				t.Fatal(err)
			}
			var hdr [1]byte
			if _, err := tc.Read(hdr[:]); err != nil || hdr[0] != 'R' {
				t.Fatalf("first reply inside TLS: %q %v, want an authentication request", hdr[0], err)
			}
		})
		t.Run("SNI routing", func(t *testing.T) {
			pool := x509.NewCertPool()
			data, _ := os.ReadFile(ca)
			pool.AppendCertsFromPEM(data)
			cfg, err := pgconn.ParseConfig("postgres://postgres:" + url.QueryEscape(spec.Password) + "@" + h.addr + "/postgres?sslmode=verify-full")
			if err != nil {
				t.Fatal(err)
			}
			cfg.TLSConfig = &tls.Config{RootCAs: pool, ServerName: "secure.localhost"}
			conn, err := pgconn.ConnectConfig(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(t.Context())
			res, err := conn.Exec(t.Context(), "select current_database()").ReadAll()
			if err != nil {
				t.Fatal(err)
			}
			// Routed by server name; the database name passed through.
			if got := string(res[0].Rows[0][0]); got != "postgres" {
				t.Fatalf("current_database %q, want postgres", got)
			}
		})
	})
}

func TestIntegrationDirectTLSWithTLSOffIsClosed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		h := newHarness(t, k, harnessOptions{})
		spec := h.addProject("plain", backend.SleepStop, 0)
		_, err := pgx.Connect(t.Context(), withParams(h.url(spec), "sslmode", "require", "sslnegotiation", "direct"))
		if err == nil {
			t.Fatal("direct TLS to a proxy without TLS succeeded")
		}
		if st := h.status("plain"); st.Wakes != 0 {
			t.Fatalf("refused direct TLS woke the project")
		}
	})
}

func TestIntegrationPortRouting(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		h := newHarness(t, k, harnessOptions{})
		spec := h.addProject("ported", backend.SleepStop, 0)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go h.srv.ServeProject(t.Context(), ln, "ported")
		// A client that cannot choose the database name: it asks for the
		// default one, and the port decides the project.
		u := "postgres://postgres:" + url.QueryEscape(spec.Password) + "@" + ln.Addr().String() + "/postgres?sslmode=disable&options=-c%20search_path%3Dpgwake_test"
		conn, err := pgx.Connect(t.Context(), u)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(t.Context())
		var db, sp string
		if err := conn.QueryRow(t.Context(), "select current_database(), current_setting('search_path')").Scan(&db, &sp); err != nil {
			t.Fatal(err)
		}
		// The startup parameters other than routing passed through untouched.
		if db != "postgres" || sp != "pgwake_test" {
			t.Fatalf("got db %q search_path %q", db, sp)
		}
	})
}

// TestIntegrationUserRouting: on the shared port, USER.PROJECT as the user
// name reaches PROJECT as USER, with SCRAM against the real server (it
// reads the user from the replayed startup packet) and the database name
// passed through, so a client can reach every database of the server.
func TestIntegrationUserRouting(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		h := newHarness(t, k, harnessOptions{})
		spec := h.addProject("users", backend.SleepStop, 0)
		ctx := t.Context()
		admin := h.connect(ctx, spec)
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "create database test_users"); err != nil {
			t.Fatal(err)
		}

		for _, tc := range []struct{ name, db, want string }{
			{"another database", "test_users", "test_users"},
			{"the default database", "postgres", "postgres"},
			{"no database: defaults to the real user", "", "postgres"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				u := url.URL{
					Scheme: "postgres", User: url.UserPassword(spec.User+"."+spec.Name, spec.Password),
					Host: h.addr, Path: "/" + tc.db, RawQuery: clientQuery,
				}
				cfg, err := pgx.ParseConfig(u.String())
				if err != nil {
					t.Fatal(err)
				}
				if tc.db == "" {
					cfg.Database = "" // not sent: the server picks the default
				}
				conn, err := pgx.ConnectConfig(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(ctx)
				var user, db string
				if err := conn.QueryRow(ctx, "select current_user, current_database()").Scan(&user, &db); err != nil {
					t.Fatal(err)
				}
				if user != spec.User || db != tc.want {
					t.Fatalf("user %q database %q, want %q %q", user, db, spec.User, tc.want)
				}
			})
		}

		// A wrong password is the server's refusal, as on a direct connect.
		u := "postgres://" + spec.User + "." + spec.Name + ":wrong@" + h.addr + "/postgres?sslmode=disable"
		_, err := pgx.Connect(ctx, u)
		if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
			t.Fatalf("wrong password: %v, want 28P01", err)
		}
	})
}

func TestIntegrationCancel(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		h := newHarness(t, k, harnessOptions{})
		spec := h.addProject("cancel", backend.SleepStop, 0)
		ctx := t.Context()
		watcher := h.connect(ctx, spec)

		// waitRunning waits until pg_sleep runs on the server.
		waitRunning := func(t *testing.T) {
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				var n int
				if err := watcher.QueryRow(ctx, "select count(*) from pg_stat_activity where query = 'select pg_sleep(30)' and state = 'active' and pid <> pg_backend_pid()").Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n > 0 {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Fatal("pg_sleep never started")
		}

		t.Run("pgx context cancellation", func(t *testing.T) {
			cfg, err := pgx.ParseConfig(h.url(spec))
			if err != nil {
				t.Fatal(err)
			}
			// Ask pgx to cancel on the server when the context ends (its
			// default only interrupts the socket).
			cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
				return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 20 * time.Second}
			}
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			qctx, cancel := context.WithCancel(ctx)
			errc := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := conn.Exec(qctx, "select pg_sleep(30)")
				errc <- err
			}()
			waitRunning(t)
			cancel()
			err = <-errc
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
				t.Fatalf("err = %v, want SQLSTATE 57014 from the server", err)
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Fatalf("query ended after %s", d)
			}
		})
		t.Run("psql interrupted", func(t *testing.T) {
			cmd := exec.Command("psql", h.url(spec), "-c", "select pg_sleep(30)")
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waitRunning(t)
			// Ctrl-C: libpq sends a CancelRequest on a new connection.
			if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("psql did not end after the cancel: %s", out.String())
			}
			if !strings.Contains(out.String(), "canceling statement due to user request") {
				t.Fatalf("psql output %q, want the cancel error", out.String())
			}
		})
		// Keys are forgotten when sessions end: only the watcher remains.
		watcher.Close(ctx)
		h.waitFor("cancel", "no connections", 10*time.Second, func(st proxy.Status) bool { return st.Active == 0 })
		if n := h.srv.CancelKeys(); n != 0 {
			t.Fatalf("%d cancel keys left after every session ended", n)
		}
	})
}

func TestIntegrationSlowAndSplitClients(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		h := newHarness(t, k, harnessOptions{proxy: proxy.Options{StartupTimeout: 5 * time.Second}})
		spec := h.addProject("slow", backend.SleepStop, 0)

		t.Run("startup packet in 1-byte writes", func(t *testing.T) {
			// pgconn dials through a conn that writes one byte at a time.
			cfg, err := pgconn.ParseConfig(h.url(spec))
			if err != nil {
				t.Fatal(err)
			}
			cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return &byteWriter{Conn: c}, nil
			}
			conn, err := pgconn.ConnectConfig(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(t.Context())
			res, err := conn.Exec(t.Context(), "select 5").ReadAll()
			if err != nil || string(res[0].Rows[0][0]) != "5" {
				t.Fatalf("query: %v", err)
			}
		})
		t.Run("client closing mid-startup wakes nothing", func(t *testing.T) {
			h.waitFor("slow", "no connections", 10*time.Second, func(st proxy.Status) bool { return st.Active == 0 })
			if err := h.srv.Sleep(t.Context(), "slow"); err != nil {
				t.Fatal(err)
			}
			before := h.status("slow").Wakes
			c := rawConn(t, h.addr)
			full := startupPacket(t, map[string]string{"user": "postgres", "database": "slow"})
			c.Write(full[:len(full)/2])
			c.Close()
			// The proxy notices the close at once (EOF), well before the
			// startup timeout; nothing was routed.
			h.waitFor("slow", "no connections", 10*time.Second, func(st proxy.Status) bool { return st.Active == 0 })
			if st := h.status("slow"); st.Wakes != before || st.State != proxy.StateSleeping {
				t.Fatalf("a client that closed mid-startup changed the project: %+v", st)
			}
		})
	})
}

// byteWriter writes everything one byte per write call, with a pause, as a
// slow or fragmenting client would.
type byteWriter struct{ net.Conn }

func (b *byteWriter) Write(p []byte) (int, error) {
	for i := range p {
		if _, err := b.Conn.Write(p[i : i+1]); err != nil {
			return i, err
		}
		time.Sleep(time.Millisecond)
	}
	return len(p), nil
}

// TestIntegrationUpstreamTLS: with upstream TLS required the proxy speaks
// TLS to the project's server, verifying it against a CA. It runs on the
// local backend, whose server configuration the test can change (ssl=on).
func TestIntegrationUpstreamTLS(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		lk, ok := k.(*localKit)
		if !ok {
			t.Skip("needs a server the test can configure for TLS: the local backend")
		}
		certDir := t.TempDir()
		if _, err := certs.ServerConfig(certDir, "", "", nil, time.Now()); err != nil {
			t.Fatal(err)
		}
		upstream, err := certs.UpstreamConfig(certs.CAPath(certDir))
		if err != nil {
			t.Fatal(err)
		}
		h := newHarness(t, k, harnessOptions{proxy: proxy.Options{UpstreamTLS: upstream}})
		spec := h.addProject("tlsup", backend.SleepStop, 0)
		plain := h.addProject("plainup", backend.SleepStop, 0)

		// ssl=on with a certificate from the same CA, owned by the server's
		// user as Postgres requires.
		data := filepath.Join(lk.root(h), "tlsup", "data")
		fi, err := os.Stat(data)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		for src, dst := range map[string]string{"server.pem": "server.crt", "server-key.pem": "server.key"} {
			b, err := os.ReadFile(filepath.Join(certs.Dir(certDir), src))
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(data, dst)
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, int(st.Uid), int(st.Gid)); err != nil {
				t.Fatal(err)
			}
		}
		f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("ssl = on\n")
		f.Close()

		conn := h.connect(t.Context(), spec)
		var ssl bool
		if err := conn.QueryRow(t.Context(), "select ssl from pg_stat_ssl where pid = pg_backend_pid()").Scan(&ssl); err != nil {
			t.Fatal(err)
		}
		if !ssl {
			t.Fatal("the proxy's connection to the server is not encrypted")
		}

		// A server without TLS is refused, with the reason.
		_, err = pgx.Connect(t.Context(), h.url(plain))
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "08006" || !strings.Contains(pgErr.Message, "does not accept TLS") {
			t.Fatalf("connect to a plaintext server with upstream TLS required: %v", err)
		}
	})
}

// TestIntegrationReplicationParamPassesThrough: a logical replication client
// (replication=database) gets a walsender session through the proxy. Local
// backend only: initdb's pg_hba allows replication from 127.0.0.1, while the
// test image allows no replication from the Docker bridge.
func TestIntegrationReplicationParamPassesThrough(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		if _, ok := k.(*localKit); !ok {
			t.Skip("the test image's pg_hba has no replication line for the bridge")
		}
		h := newHarness(t, k, harnessOptions{})
		spec := h.addProject("repl", backend.SleepStop, 0)
		cfg, err := pgconn.ParseConfig(h.url(spec))
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["replication"] = "database"
		conn, err := pgconn.ConnectConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(t.Context())
		res, err := conn.Exec(t.Context(), "IDENTIFY_SYSTEM").ReadAll()
		if err != nil {
			t.Fatalf("IDENTIFY_SYSTEM (a walsender command) failed: %v", err)
		}
		// systemid, timeline, xlogpos, dbname: the walsender is bound to the
		// project's database.
		if row := res[0].Rows[0]; string(row[3]) != spec.Database {
			t.Fatalf("IDENTIFY_SYSTEM dbname %q, want %q", row[3], spec.Database)
		}
	})
}
