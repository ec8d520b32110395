package proxy_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
)

// BenchmarkIntegrationAuth times logins on one awake project, interleaved:
// a right and a wrong password through pgwake (SCRAM at the proxy, then
// pgwake's own login to the server) next to the same against the server's
// own address. A wrong password should take what the server takes; a
// right one costs pgwake's exchange on top of the server's.
//
//	go test -run '^$' -bench IntegrationAuth -benchtime 1x -v ./internal/proxy/
func BenchmarkIntegrationAuth(b *testing.B) {
	const n = 50
	// No failed-login limit here: the wrong attempts are the measurement.
	h := newHarness(b, dockerKit{}, harnessOptions{proxy: proxy.Options{AuthFailureBurst: 1 << 30}})
	spec := h.addProject("benchauth", backend.SleepStop, 0)
	ctx := b.Context()
	h.seed(spec, "select 1") // the first start
	if err := h.srv.SetPinned("benchauth", true); err != nil {
		b.Fatal(err)
	}
	ep, err := h.be.Start(ctx, spec) // already running: its address
	if err != nil {
		b.Fatal(err)
	}
	direct := url.URL{Scheme: "postgres", User: url.UserPassword(spec.User, spec.Password), Host: ep.Addr,
		Path: "/" + spec.Database, RawQuery: "sslmode=disable"}
	urls := map[string]string{"pgwake": h.url(spec), "server": direct.String()}
	wrongURL := func(u string) string {
		p, _ := url.Parse(u)
		p.User = url.UserPassword(spec.User, "wrong")
		return p.String()
	}
	times := map[string][]time.Duration{}
	for range b.N {
		for range n {
			for _, via := range []string{"pgwake", "server"} {
				start := time.Now()
				conn, err := pgconn.Connect(ctx, urls[via])
				if err != nil {
					b.Fatal(err)
				}
				if _, err := conn.Exec(ctx, "select 1").ReadAll(); err != nil {
					b.Fatal(err)
				}
				times[via+" right"] = append(times[via+" right"], time.Since(start))
				conn.Close(ctx)

				start = time.Now()
				_, err = pgconn.Connect(ctx, wrongURL(urls[via]))
				if code := sqlstate(err); code != "28P01" {
					b.Fatalf("%s wrong password: %v", via, err)
				}
				times[via+" wrong"] = append(times[via+" wrong"], time.Since(start))
			}
		}
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d.Microseconds())/1000) }
	var tab strings.Builder
	fmt.Fprintf(&tab, "\n| login (%d each, interleaved) | median ms | p95 ms |\n|:--|---:|---:|\n", n)
	for _, k := range []string{"server right", "pgwake right", "server wrong", "pgwake wrong"} {
		med := nearestRank(times[k], 0.5)
		fmt.Fprintf(&tab, "| %s | %s | %s |\n", k, ms(med), ms(nearestRank(times[k], 0.95)))
		b.ReportMetric(float64(med.Microseconds())/1000, strings.ReplaceAll(k, " ", "-")+"-median-ms")
	}
	if st := h.status("benchauth"); st.Wakes != 1 {
		b.Fatalf("wakes %d, want the one first start", st.Wakes)
	}
	b.Log(tab.String())
}
