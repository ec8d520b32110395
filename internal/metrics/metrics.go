// Package metrics exposes pgwake's Prometheus metrics. Per-project gauges
// and counters are read from the same snapshot the admin API serves, at
// scrape time, so /metrics and the API always agree; durations and bytes
// are observed as they happen.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgwake/pgwake/internal/admin"
)

// States lists every state a project can be in, so each gets a series.
var States = []string{"sleeping", "waking", "running", "stopping", "held", "error"}

// Metrics is pgwake's registry.
type Metrics struct {
	reg       *prometheus.Registry
	wakeDur   *prometheus.HistogramVec
	bytes     *prometheus.CounterVec
	refused   *prometheus.CounterVec
	connsDone *prometheus.CounterVec
}

// New builds the registry; snapshot is called at every scrape.
func New(snapshot func() []admin.Project) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		wakeDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "pgwake_wake_duration_seconds",
			Help: "Time from the start of a wake until Postgres served, by project and outcome.",
			// Pause wakes take milliseconds, cold starts seconds.
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 4, 8, 16, 32, 64},
		}, []string{"project", "outcome"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgwake_bytes_total",
			Help: "Bytes proxied, by project and direction (in: client to server). Counted when a connection closes.",
		}, []string{"project", "direction"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgwake_connections_refused_total",
			Help: "Connections refused with an ErrorResponse, by project and SQLSTATE.",
		}, []string{"project", "sqlstate"}),
		connsDone: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgwake_connections_total",
			Help: "Proxied connections that have closed, by project.",
		}, []string{"project"}),
	}
	m.reg.MustRegister(m.wakeDur, m.bytes, m.refused, m.connsDone, &snapshotCollector{snapshot: snapshot},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the registry.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// ObserveWake records a finished wake.
func (m *Metrics) ObserveWake(project string, took time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "failed"
	}
	m.wakeDur.WithLabelValues(project, outcome).Observe(took.Seconds())
}

// ConnDone records a closed connection and the bytes it carried.
func (m *Metrics) ConnDone(project string, fromClient, toClient int64) {
	m.connsDone.WithLabelValues(project).Inc()
	m.bytes.WithLabelValues(project, "in").Add(float64(fromClient))
	m.bytes.WithLabelValues(project, "out").Add(float64(toClient))
}

// Refused records a refused connection. Unknown project names are folded
// into one label so a scanner cannot grow the series without bound.
func (m *Metrics) Refused(project, sqlstate string, known bool) {
	if !known {
		project = "(unknown)"
	}
	m.refused.WithLabelValues(project, sqlstate).Inc()
}

var (
	descState = prometheus.NewDesc("pgwake_project_state",
		"1 for the state the project is in, 0 for the others.", []string{"project", "state"}, nil)
	descActive = prometheus.NewDesc("pgwake_project_connections_active",
		"Open client connections, queued ones included.", []string{"project"}, nil)
	descQueued = prometheus.NewDesc("pgwake_project_connections_queued",
		"Client connections parked while the project wakes.", []string{"project"}, nil)
	descWakes = prometheus.NewDesc("pgwake_project_wakes_total",
		"Successful wakes.", []string{"project"}, nil)
	descWakeFails = prometheus.NewDesc("pgwake_project_wake_failures_total",
		"Failed wakes.", []string{"project"}, nil)
	descPinned = prometheus.NewDesc("pgwake_project_pinned",
		"1 when the project is pinned awake.", []string{"project"}, nil)
	descAuthFailures = prometheus.NewDesc("pgwake_auth_failures_total",
		"Failed logins: at pgwake for projects it authenticates, the server's 28P01 for those it passes through.", []string{"project"}, nil)
	descAuthThrottled = prometheus.NewDesc("pgwake_auth_throttled_total",
		"Login attempts delayed or refused because their client address failed too often.", []string{"project"}, nil)
)

// snapshotCollector turns the admin API's snapshot into metrics.
type snapshotCollector struct {
	snapshot func() []admin.Project
}

func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descState, descActive, descQueued, descWakes, descWakeFails, descPinned, descAuthFailures, descAuthThrottled} {
		ch <- d
	}
}

func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.snapshot() {
		for _, s := range States {
			v := 0.0
			if s == p.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, v, p.Name, s)
		}
		ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(p.Active), p.Name)
		ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(p.Queued), p.Name)
		ch <- prometheus.MustNewConstMetric(descWakes, prometheus.CounterValue, float64(p.Wakes), p.Name)
		ch <- prometheus.MustNewConstMetric(descWakeFails, prometheus.CounterValue, float64(p.WakeFailures), p.Name)
		pinned := 0.0
		if p.Pinned {
			pinned = 1
		}
		ch <- prometheus.MustNewConstMetric(descPinned, prometheus.GaugeValue, pinned, p.Name)
		ch <- prometheus.MustNewConstMetric(descAuthFailures, prometheus.CounterValue, float64(p.AuthFailures), p.Name)
		ch <- prometheus.MustNewConstMetric(descAuthThrottled, prometheus.CounterValue, float64(p.AuthThrottled), p.Name)
	}
}
