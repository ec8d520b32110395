package proxy_test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
)

// BenchmarkIntegrationTieredWake times both wake paths of a tiered
// project on the same server and data, interleaved: a client's connect to
// the first row of SELECT 1 through the proxy while the server is paused
// (tiered's first step) and after the sweep stopped it (its second),
// next to the same client against the awake project. Medians and p95
// (nearest rank) are reported as metrics and logged as a table:
//
//	go test -run '^$' -bench TieredWake -benchtime 1x -v ./internal/proxy/
//
// PGWAKE_BENCH_WAKES (20) is the number of wakes timed per path.
func BenchmarkIntegrationTieredWake(b *testing.B) {
	n := 20
	if v, err := strconv.Atoi(os.Getenv("PGWAKE_BENCH_WAKES")); err == nil && v > 0 {
		n = v
	}
	const name = "benchtier"
	tb := newTieredBench(b, name)
	h, spec, ctx := tb.h, tb.spec, b.Context()
	firstRow := func() time.Duration {
		b.Helper()
		start := time.Now()
		conn, err := pgconn.Connect(ctx, h.url(spec))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "select 1").ReadAll(); err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		conn.Close(ctx)
		tb.idle()
		return took
	}
	sleepTo := tb.sleepTo

	client := map[string][]time.Duration{}
	own := map[string][]time.Duration{} // pgwake's own wake: start or unpause until Postgres answers
	for range b.N {
		for i := range 2 * n {
			step := []string{"pause", "stop"}[i%2]
			sleepTo(step)
			client[step] = append(client[step], firstRow())
			st := h.status(name)
			if msg := st.Events[len(st.Events)-1].Msg; !strings.Contains(msg, "(from "+step+")") {
				b.Fatalf("last event %q; want a wake from the %s", msg, step)
			}
			own[step] = append(own[step], st.LastWake)
			client["warm"] = append(client["warm"], firstRow())
		}
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }
	var tab strings.Builder
	fmt.Fprintf(&tab, "\n| wake from (%d each) | first row median | p95 | minus warm | pgwake's own wake median / p95 |\n|:--|---:|---:|---:|---:|\n", len(client["pause"]))
	warm := nearestRank(client["warm"], 0.5)
	for _, step := range []string{"pause", "stop"} {
		med := nearestRank(client[step], 0.5)
		fmt.Fprintf(&tab, "| %s | %s | %s | %s | %s / %s |\n", step, ms(med), ms(nearestRank(client[step], 0.95)),
			ms(med-warm), ms(nearestRank(own[step], 0.5)), ms(nearestRank(own[step], 0.95)))
		b.ReportMetric(float64(med.Microseconds())/1000, step+"-median-ms")
		b.ReportMetric(float64(nearestRank(client[step], 0.95).Microseconds())/1000, step+"-p95-ms")
	}
	fmt.Fprintf(&tab, "\nwarm (awake, same client): median %s ms, p95 %s ms\n", ms(warm), ms(nearestRank(client["warm"], 0.95)))
	b.ReportMetric(float64(warm.Microseconds())/1000, "warm-median-ms")
	b.Log(tab.String())
}

// tieredBench is one tiered project of a Docker harness, seeded (its
// first start done), that nothing puts to sleep but the benchmark: every
// pause a Sleep call, every stop the sweep's once sleepTo lowers
// stop_after.
type tieredBench struct {
	b    *testing.B
	h    *harness
	spec backend.Spec
}

func newTieredBench(b *testing.B, name string) *tieredBench {
	h := newHarness(b, dockerKit{}, harnessOptions{proxy: proxy.Options{SweepInterval: 20 * time.Millisecond}})
	spec := h.newSpec(name)
	if err := h.be.Ensure(b.Context(), spec); err != nil {
		b.Fatal(err)
	}
	if err := h.srv.AddProject(b.Context(), proxy.Project{Spec: spec, Backend: h.be, SleepMode: backend.SleepTiered, StopAfter: time.Hour}); err != nil {
		b.Fatal(err)
	}
	tb := &tieredBench{b: b, h: h, spec: spec}
	h.seed(spec, "create table notes(n int); insert into notes select generate_series(1, 1000)") // the first start (initdb)
	tb.idle()
	return tb
}

// idle waits until the project has no connections.
func (tb *tieredBench) idle() {
	tb.b.Helper()
	tb.h.waitFor(tb.spec.Name, "no connections", time.Minute, func(st proxy.Status) bool { return st.Active == 0 })
}

// sleepTo puts the project to sleep, to its pause or its stop.
func (tb *tieredBench) sleepTo(step string) {
	b, name := tb.b, tb.spec.Name
	b.Helper()
	stopAfter := time.Hour
	if step == "stop" {
		stopAfter = time.Millisecond
	}
	if err := tb.h.srv.SetStopAfter(name, stopAfter); err != nil {
		b.Fatal(err)
	}
	if err := tb.h.srv.Sleep(b.Context(), name); err != nil {
		b.Fatal(err)
	}
	tb.h.waitFor(name, "asleep ("+step+")", time.Minute, func(st proxy.Status) bool {
		return st.State == proxy.StateSleeping && st.Asleep == step
	})
}

// nearestRank is the nearest-rank q-quantile of d.
func nearestRank(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s))*q+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}
