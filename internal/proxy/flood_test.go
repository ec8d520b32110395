package proxy_test

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
)

// openSilent opens n connections to addr that never send a byte, closed
// when the test ends.
func openSilent(tb testing.TB, addr string, n int) []net.Conn {
	tb.Helper()
	conns := make([]net.Conn, 0, n)
	tb.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			tb.Fatalf("silent connection %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	return conns
}

func TestSilentFloodDoesNotShutOutARealClient(t *testing.T) {
	t.Parallel()
	const limit = 20
	u := newScriptedUpstream(t)
	srv, paddr := serveBackend(t, &addrBackend{addr: u.ln.Addr().String()}, proxy.Options{MaxStartupConns: limit})
	silent := openSilent(t, paddr, 10*limit)

	// A real client sends its startup packet at once and gets through: to
	// make room, the proxy closed the oldest silent connections.
	if v := connectVersion(t, paddr); v != "15-scripted" {
		t.Fatalf("reached %q", v)
	}
	_ = silent[0].SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := silent[0].Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("oldest silent connection: read %v, want EOF (closed by the proxy)", err)
	}
	if n := srv.StartupConns(); n > limit {
		t.Fatalf("%d connections in their startup phase, limit %d", n, limit)
	}
}

// BenchmarkConnectDuringSilentFlood times a client's connect (TCP, startup
// packet, authentication, ReadyForQuery through the proxy to a scripted
// server) while 5000 silent sockets sit on the proxy, and reports the
// proxy's heap after the flood has gone.
func BenchmarkConnectDuringSilentFlood(b *testing.B) {
	for _, flood := range []int{0, 5000} {
		b.Run(map[int]string{0: "idle", 5000: "flood-5000"}[flood], func(b *testing.B) {
			u := newScriptedUpstream(b)
			srv, err := proxy.New(proxy.Options{ReadyPoll: time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			be := &addrBackend{addr: u.ln.Addr().String()}
			if err := srv.AddProject(context.Background(), proxy.Project{Spec: backend.Spec{Name: "app", User: "u", Database: "app"}, Backend: be}); err != nil {
				b.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go srv.Serve(context.Background(), ln)
			defer srv.Close()
			url := "postgres://u@" + ln.Addr().String() + "/app?sslmode=disable"
			warm, err := pgconn.Connect(context.Background(), url)
			if err != nil {
				b.Fatal(err)
			}
			warm.Close(context.Background())
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)

			silent := openSilent(b, ln.Addr().String(), flood)
			b.ResetTimer()
			for b.Loop() {
				c, err := pgconn.Connect(context.Background(), url)
				if err != nil {
					b.Fatal(err)
				}
				c.Close(context.Background())
			}
			b.StopTimer()
			for _, c := range silent {
				c.Close()
			}
			// Let the proxy see the hang-ups.
			deadline := time.Now().Add(30 * time.Second)
			for srv.StartupConns() > 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			var after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(before.HeapInuse)/(1<<20), "heap-MiB-before")
			b.ReportMetric(float64(after.HeapInuse)/(1<<20), "heap-MiB-after")
		})
	}
}
