package proxy_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/moby/moby/client"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
	"github.com/pgwake/pgwake/internal/testenv"
)

// BenchmarkIntegrationWakeLimit holds pgwake's wake against the limit the
// machine sets: the same container started (or unpaused) by a bare
// Engine API call, then polled as fast as a client can (a connect every
// millisecond) to the first row of SELECT 1, no proxy at all. The two are
// interleaved on one tiered project (its pause and its stop, the same
// server and data), so both see the same machine; pgwake's side is a
// client's connect through the proxy to the first row, with pgwake's own
// phases (engine call, process start to the first accepted connection,
// Postgres's start-up with its 57P03 refusals, the check of the run).
//
//	go test -run '^$' -bench WakeLimit -benchtime 1x -v ./internal/proxy/
//
// PGWAKE_BENCH_WAKES (20) wakes are timed per path and side.
// PGWAKE_BENCH_LOAD=1 runs pgbench -S against a second project meanwhile
// (4 clients), the loaded machine the targets also hold on.
func BenchmarkIntegrationWakeLimit(b *testing.B) {
	n := 20
	if v, err := strconv.Atoi(os.Getenv("PGWAKE_BENCH_WAKES")); err == nil && v > 0 {
		n = v
	}
	const name = "benchlimit"
	tb := newTieredBench(b, name)
	h, spec, ctx, idle, sleepTo := tb.h, tb.spec, b.Context(), tb.idle, tb.sleepTo
	docker := testenv.DockerClient(b)
	if os.Getenv("PGWAKE_BENCH_LOAD") == "1" {
		h.load(b, 4)
	}

	// firstRow is the time from start to the first row of SELECT 1 at u;
	// with retry it polls a server that does not serve yet.
	firstRow := func(start time.Time, u string, retry bool) time.Duration {
		b.Helper()
		for {
			conn, err := pgconn.Connect(ctx, u)
			if err != nil {
				if retry && time.Since(start) < time.Minute {
					time.Sleep(time.Millisecond) // the fastest poll a client makes
					continue
				}
				b.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "select 1").ReadAll(); err != nil {
				b.Fatal(err)
			}
			took := time.Since(start)
			conn.Close(ctx)
			return took
		}
	}
	container := containerName(h, name)
	// raw wakes the server behind pgwake's back, as a user's own script
	// would, and times it to the first row at the container's address;
	// pgwake then adopts the running server, ready for the next sleep.
	raw := func(step string) time.Duration {
		b.Helper()
		start := time.Now()
		var err error
		if step == "stop" {
			_, err = docker.ContainerStart(ctx, container, client.ContainerStartOptions{})
		} else {
			_, err = docker.ContainerUnpause(ctx, container, client.ContainerUnpauseOptions{})
		}
		if err != nil {
			b.Fatal(err)
		}
		res, err := docker.ContainerInspect(ctx, container, client.ContainerInspectOptions{})
		if err != nil {
			b.Fatal(err)
		}
		var ip string
		for _, nw := range res.Container.NetworkSettings.Networks {
			if nw.IPAddress.IsValid() {
				ip = nw.IPAddress.String()
			}
		}
		if ip == "" {
			b.Fatalf("container %s has no address", container)
		}
		u := url.URL{
			Scheme: "postgres", User: url.UserPassword(spec.User, spec.Password),
			Host: net.JoinHostPort(ip, "5432"), Path: "/" + spec.Database, RawQuery: "sslmode=disable&connect_timeout=10",
		}
		took := firstRow(start, u.String(), true)
		h.waitState(name, proxy.StateRunning, time.Minute)
		return took
	}

	type side struct{ rows, own []time.Duration }
	res := map[string]*side{}
	phases := map[string][]proxy.WakePhases{}
	for _, k := range []string{"raw pause", "pgwake pause", "raw stop", "pgwake stop"} {
		res[k] = &side{}
	}
	var warm []time.Duration
	for range b.N {
		for i := range 2 * n {
			step := []string{"pause", "stop"}[i%2]
			// Alternate which side goes first, so neither always follows
			// the other's wake.
			order := []string{"raw", "pgwake"}
			if (i/2)%2 == 1 {
				order = []string{"pgwake", "raw"}
			}
			for _, who := range order {
				sleepTo(step)
				k := who + " " + step
				if who == "raw" {
					res[k].rows = append(res[k].rows, raw(step))
					continue
				}
				res[k].rows = append(res[k].rows, firstRow(time.Now(), h.url(spec), false))
				idle()
				st := h.status(name)
				if msg := st.Events[len(st.Events)-1].Msg; !strings.Contains(msg, "(from "+step+")") {
					b.Fatalf("last event %q; want a wake from the %s", msg, step)
				}
				res[k].own = append(res[k].own, st.LastWake)
				phases[step] = append(phases[step], st.LastPhases)
			}
			warm = append(warm, firstRow(time.Now(), h.url(spec), false))
			idle()
		}
	}

	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }
	var tab strings.Builder
	fmt.Fprintf(&tab, "\n| wake from (%d each) | raw median | raw p95 | pgwake median | pgwake p95 | median ratio | p95 ratio | engine | accept | ready (57P03 retries) | confirm | pgwake's own wake |\n|:--|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", n*b.N)
	for _, step := range []string{"pause", "stop"} {
		r, p := res["raw "+step], res["pgwake "+step]
		rm, rp := nearestRank(r.rows, 0.5), nearestRank(r.rows, 0.95)
		pm, pp := nearestRank(p.rows, 0.5), nearestRank(p.rows, 0.95)
		var eng, acc, rdy, cnf []time.Duration
		retries := 0
		for _, ph := range phases[step] {
			eng, acc, rdy, cnf = append(eng, ph.Engine), append(acc, ph.Accept), append(rdy, ph.Ready), append(cnf, ph.Confirm)
			retries += ph.Retries
		}
		fmt.Fprintf(&tab, "| %s | %s | %s | %s | %s | %.2f | %.2f | %s | %s | %s (%.1f) | %s | %s |\n", step,
			ms(rm), ms(rp), ms(pm), ms(pp), float64(pm)/float64(rm), float64(pp)/float64(rp),
			ms(nearestRank(eng, 0.5)), ms(nearestRank(acc, 0.5)), ms(nearestRank(rdy, 0.5)),
			float64(retries)/float64(max(len(phases[step]), 1)), ms(nearestRank(cnf, 0.5)), ms(nearestRank(p.own, 0.5)))
		b.ReportMetric(float64(pm)/float64(rm), step+"-median-ratio")
		b.ReportMetric(float64(pp)/float64(rp), step+"-p95-ratio")
		b.ReportMetric(float64(rm.Microseconds())/1000, step+"-raw-median-ms")
		b.ReportMetric(float64(pm.Microseconds())/1000, step+"-pgwake-median-ms")
	}
	fmt.Fprintf(&tab, "\nphases are medians over the pgwake wakes; warm (awake, through pgwake): median %s ms\n", ms(nearestRank(warm, 0.5)))
	b.Log(tab.String())
	if dir := os.Getenv("PGWAKE_BENCH_OUT"); dir != "" {
		// Every sample, for bench/plot: "what step ms" per line, what being
		// raw, pgwake or one of pgwake's phases.
		var raw strings.Builder
		for k, s := range res {
			for _, d := range s.rows {
				fmt.Fprintf(&raw, "%s %s\n", k, ms(d))
			}
		}
		for step, list := range phases {
			for _, ph := range list {
				fmt.Fprintf(&raw, "engine %s %s\naccept %s %s\nready %s %s\nconfirm %s %s\n",
					step, ms(ph.Engine), step, ms(ph.Accept), step, ms(ph.Ready), step, ms(ph.Confirm))
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "wakelimit.txt"), []byte(raw.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// load runs pgbench -S with clients against a project of its own, for as
// long as the benchmark runs.
func (h *harness) load(b *testing.B, clients int) {
	b.Helper()
	spec := h.addProject("benchload", backend.SleepStop, 0)
	pgbench := "pgbench"
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench"); len(m) > 0 {
		pgbench = m[len(m)-1]
	}
	if out, err := exec.CommandContext(b.Context(), pgbench, "-i", "-s", "1", h.url(spec)).CombinedOutput(); err != nil {
		b.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, pgbench, "-n", "-S", "-c", strconv.Itoa(clients), "-j", "2", "-T", "3600", h.url(spec))
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
}
