package daemon

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/testenv"
)

// runDaemon starts a real daemon (Docker backend) in-process and returns
// an admin client and the TCP admin address.
func runDaemon(t *testing.T, mutate func(*config.Config)) (*admin.Client, string, config.Config) {
	t.Helper()
	image := testenv.PostgresImage(t)
	dir, err := os.MkdirTemp("", "pgwd") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.PortRange = testenv.PortRange(t)
	cfg.StateDir = dir
	cfg.Image = image
	cfg.Listen = "127.0.0.1:0"
	cfg.AdminListen = "127.0.0.1:" + freePort(t)
	cfg.SleepAfter = 0
	if mutate != nil {
		mutate(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() {
		done <- Run(ctx, cfg, log, Options{Ready: func(string) { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("daemon exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("daemon did not become ready")
	}
	cl := admin.NewClient(cfg.SocketPath())
	t.Cleanup(func() {
		// down --volumes: removes every project pgwake created.
		if err := cl.Shutdown(context.Background(), true); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
		cancel()
		os.RemoveAll(dir)
	})
	return cl, cfg.AdminListen, cfg
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// scrape reads /metrics and returns the families by name.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value returns the metric's value for the given labels (nil: any).
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
	for _, m := range f.GetMetric() {
		match := true
		for _, lp := range m.GetLabel() {
			if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("metric %s%v missing", name, labels)
	return 0
}

func TestIntegrationAPIAndMetricsAgree(t *testing.T) {
	cl, adminAddr, _ := runDaemon(t, nil)
	ctx := t.Context()
	p, err := cl.Create(ctx, admin.CreateRequest{Name: "obs"})
	if err != nil {
		t.Fatal(err)
	}
	events, err := cl.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Every state the stream shows is kept, and each event also pokes the
	// wait below (which must not consume what the last check reads: it
	// once ate the one "running" under load).
	var (
		seenMu sync.Mutex
		seen   = map[string]bool{}
		poke   = make(chan struct{}, 1)
	)
	go func() {
		for ev := range events {
			if ev.Project.Name == "obs" {
				seenMu.Lock()
				seen[ev.Project.State] = true
				seenMu.Unlock()
				select {
				case poke <- struct{}{}:
				default:
				}
			}
		}
	}()

	const n = 5
	var conns []*pgx.Conn
	for i := range n {
		c, err := pgx.Connect(ctx, p.URL)
		if err != nil {
			t.Fatalf("conn %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	got, err := cl.Project(ctx, "obs")
	if err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, adminAddr)
	lbl := map[string]string{"project": "obs"}
	if got.Active != n || value(t, fams, "pgwake_project_connections_active", lbl) != n {
		t.Fatalf("active: api %d, metrics %v, want %d", got.Active, value(t, fams, "pgwake_project_connections_active", lbl), n)
	}
	if got.State != "running" || value(t, fams, "pgwake_project_state", map[string]string{"project": "obs", "state": "running"}) != 1 {
		t.Fatalf("state: api %s, metrics running=%v", got.State, value(t, fams, "pgwake_project_state", map[string]string{"project": "obs", "state": "running"}))
	}
	for _, c := range conns {
		c.Close(ctx)
	}
	// Wait, on the event stream, for the last connection to be released.
	deadline := time.After(30 * time.Second)
	for got.Active != 0 {
		select {
		case <-poke:
		case <-deadline:
			t.Fatalf("connections not released: %+v", got)
		}
		if got, err = cl.Project(ctx, "obs"); err != nil {
			t.Fatal(err)
		}
	}
	// A refused connection is counted by SQLSTATE.
	unknown := strings.NewReplacer("postgres.obs:", "postgres.nosuch:", "/obs?", "/nosuch?").Replace(p.SharedURL)
	if _, err := pgx.Connect(ctx, unknown); err == nil {
		t.Fatal("connect to an unknown project succeeded")
	}

	fams = scrape(t, adminAddr)
	checks := []struct {
		name   string
		labels map[string]string
		api    float64
		want   float64
	}{
		{"pgwake_project_wakes_total", lbl, float64(got.Wakes), 1},
		{"pgwake_wake_duration_seconds", map[string]string{"project": "obs", "outcome": "ok"}, float64(got.Wakes), 1},
		{"pgwake_project_wake_failures_total", lbl, float64(got.WakeFailures), 0},
		{"pgwake_connections_total", lbl, n, n},
		{"pgwake_project_connections_active", lbl, float64(got.Active), 0},
		{"pgwake_connections_refused_total", map[string]string{"sqlstate": "3D000"}, 1, 1},
	}
	for _, c := range checks {
		m := value(t, fams, c.name, c.labels)
		if m != c.want || c.api != c.want {
			t.Errorf("%s: metrics %v, api %v, want %v", c.name, m, c.api, c.want)
		}
	}
	if in := value(t, fams, "pgwake_bytes_total", map[string]string{"project": "obs", "direction": "in"}); in <= 0 {
		t.Errorf("bytes in = %v, want > 0", in)
	}
	// A new project's one wake is its first start (initdb): shown apart,
	// outside the wake latency figures.
	if got.FirstStartMS <= 0 || got.LastWakeMS != 0 || len(got.RecentWakesMS) != 0 {
		t.Errorf("latency stats: first start %v, last %v, recent %v", got.FirstStartMS, got.LastWakeMS, got.RecentWakesMS)
	}
	// The stream saw the wake happen.
	seenMu.Lock()
	defer seenMu.Unlock()
	if !seen["running"] {
		t.Errorf("event stream states %v, want running among them", seen)
	}
}

func TestIntegrationReadyzNeverWakes(t *testing.T) {
	cl, adminAddr, _ := runDaemon(t, nil)
	if _, err := cl.Create(t.Context(), admin.CreateRequest{Name: "lazy"}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + adminAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d", path, resp.StatusCode)
		}
	}
	p, err := cl.Project(t.Context(), "lazy")
	if err != nil {
		t.Fatal(err)
	}
	if p.State != "sleeping" || p.Wakes != 0 {
		t.Fatalf("readiness probes woke the project: %+v", p)
	}
}

func TestIntegrationAdminTokenBeyondLoopback(t *testing.T) {
	cfg := config.Default()
	cfg.PortRange = testenv.PortRange(t)
	cfg.AdminListen = "0.0.0.0:9999"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "admin_token") {
		t.Fatalf("validate without token: %v, want an error naming admin_token", err)
	}
	port := freePort(t)
	_, _, _ = runDaemon(t, func(c *config.Config) {
		c.AdminListen = "0.0.0.0:" + port
		c.AdminToken = "s3cret"
	})
	url := "http://127.0.0.1:" + port + "/v1/projects"
	for _, tt := range []struct {
		auth string
		want int
	}{
		{"", http.StatusUnauthorized},
		{"Bearer wrong", http.StatusUnauthorized},
		{"Bearer s3cret", http.StatusOK},
	} {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("%q: status %d, want %d", tt.auth, resp.StatusCode, tt.want)
		}
	}

}
