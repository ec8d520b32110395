package k8sbackend_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/k8sbackend"
	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

// benchWakes is how many wakes each path is timed over
// (PGWAKE_BENCH_WAKES overrides it).
func benchWakes() int {
	if n, err := strconv.Atoi(os.Getenv("PGWAKE_BENCH_WAKES")); err == nil && n > 0 {
		return n
	}
	return 20
}

// BenchmarkIntegrationKubernetesWake times a wake from 0 replicas to the
// first row of SELECT 1 through the backend (scale call, Pod Ready,
// port-forward open, first reply), and next to it, in the same run and on
// the same project, the same by hand: `kubectl scale --replicas=1`,
// `kubectl wait --for=condition=Ready`, `kubectl port-forward` and a
// query. Medians and p95 are reported as metrics and logged as a table
// (go test -run '^$' -bench KubernetesWake -benchtime 1x -v). The node is
// simulated (see the package's tests); the control plane is real.
func BenchmarkIntegrationKubernetesWake(b *testing.B) {
	env := kubeenv.Shared(b)
	ns := env.NewNamespace(b)
	var mu sync.Mutex
	steps := map[string][]time.Duration{}
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	be, err := k8sbackend.New(b.Context(), k8sbackend.Options{
		Config: env.RESTConfig, Namespace: ns, Dial: k8sbackend.DialPortForward,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		Trace: func(_, step string, took time.Duration) {
			mu.Lock()
			steps[step] = append(steps[step], took)
			mu.Unlock()
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	s := spec(b, "bench")
	ctx := b.Context()
	// The first start (initdb) is not a wake.
	ep, err := be.Start(ctx, s)
	if err != nil {
		b.Fatal(err)
	}
	firstRow(b, ep.Addr, s)
	if err := be.Sleep(ctx, s, backend.SleepStop); err != nil {
		b.Fatal(err)
	}
	mu.Lock()
	clear(steps)
	mu.Unlock()

	n := benchWakes()
	var total, reply, raw []time.Duration
	for range b.N {
		for range n {
			start := time.Now()
			ep, err := be.Start(ctx, s)
			if err != nil {
				b.Fatal(err)
			}
			r0 := time.Now()
			firstRow(b, ep.Addr, s)
			reply = append(reply, time.Since(r0))
			total = append(total, time.Since(start))
			if err := be.Sleep(ctx, s, backend.SleepStop); err != nil {
				b.Fatal(err)
			}
		}
		for range n {
			raw = append(raw, kubectlWake(b, env, ns, s))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	rows := []struct {
		name string
		d    []time.Duration
	}{
		{"scale call", steps["scale"]}, {"Pod Ready", steps["ready"]}, {"port-forward open", steps["dial"]},
		{"first reply", reply}, {"pgwake wake to first row", total}, {"kubectl scale+wait+port-forward+query", raw},
	}
	var tab strings.Builder
	fmt.Fprintf(&tab, "\n| step (%d wakes) | median | p95 |\n|---|---:|---:|\n", len(total))
	for _, r := range rows {
		med, p95 := quantile(r.d, 0.5), quantile(r.d, 0.95)
		fmt.Fprintf(&tab, "| %s | %s | %s |\n", r.name, med.Round(time.Millisecond), p95.Round(time.Millisecond))
	}
	b.Log(tab.String())
	b.ReportMetric(float64(quantile(total, 0.5).Milliseconds()), "wake-median-ms")
	b.ReportMetric(float64(quantile(total, 0.95).Milliseconds()), "wake-p95-ms")
	b.ReportMetric(float64(quantile(raw, 0.5).Milliseconds()), "kubectl-median-ms")
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// firstRow connects and reads SELECT 1, retrying while Postgres still
// starts (a Ready Pod is a running container, not a serving Postgres).
func firstRow(tb testing.TB, addr string, s backend.Spec) {
	tb.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := row(addr, s)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("first row at %s: %v", addr, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// row connects to addr and reads SELECT 1 once.
func row(addr string, s backend.Spec) error {
	host, port, _ := net.SplitHostPort(addr)
	url := fmt.Sprintf("postgres://%s:%s@%s:%s/%s?sslmode=disable&connect_timeout=10", s.User, s.Password, host, port, s.Database)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var one int
	return conn.QueryRow(ctx, "select 1").Scan(&one)
}

// kubectlWake wakes the project by hand, as a user without pgwake would,
// and returns the time to the first row; then scales it back to 0.
// `kubectl port-forward` exits on the first connection the Pod refuses
// (Postgres still booting), so it is started again until a query works.
func kubectlWake(tb testing.TB, env *kubeenv.Env, ns string, s backend.Spec) time.Duration {
	tb.Helper()
	kc := func(args ...string) *exec.Cmd {
		return exec.Command("kubectl", append([]string{"--kubeconfig", env.Kubeconfig, "-n", ns}, args...)...)
	}
	run := func(args ...string) {
		if out, err := kc(args...).CombinedOutput(); err != nil {
			tb.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
	}
	pod := "pod/pgwake-" + s.Name + "-0"
	start := time.Now()
	run("scale", "statefulset/pgwake-"+s.Name, "--replicas=1")
	// wait fails while the Pod does not exist yet: retry it.
	for {
		out, err := kc("wait", "--for=condition=Ready", pod, "--timeout=120s").CombinedOutput()
		if err == nil {
			break
		}
		if !strings.Contains(string(out), "NotFound") || time.Since(start) > 2*time.Minute {
			tb.Fatalf("kubectl wait: %v\n%s", err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		err := kubectlRow(tb, kc("port-forward", pod, ":5432"), s)
		if err == nil {
			break
		}
		if time.Since(start) > 2*time.Minute {
			tb.Fatalf("no row through kubectl port-forward: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(start)
	run("scale", "statefulset/pgwake-"+s.Name, "--replicas=0")
	run("wait", "--for=delete", pod, "--timeout=180s")
	return took
}

// kubectlRow runs pf (kubectl port-forward) and reads one row through it.
func kubectlRow(tb testing.TB, pf *exec.Cmd, s backend.Spec) error {
	stdout, err := pf.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := pf.Start(); err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = pf.Process.Kill(); _ = pf.Wait() }()
	// "Forwarding from 127.0.0.1:NNNN -> 5432"
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "Forwarding" {
			go func() {
				for sc.Scan() {
				}
			}()
			return row(f[2], s)
		}
	}
	return fmt.Errorf("kubectl port-forward printed no address")
}
