package proxy

import (
	"log/slog"
	"net"
	"sort"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// refusalLog logs refused and evicted connections at a bounded rate: a
// flood of bad connections must not fill the disk with log lines. What it
// does not log one by one it counts, and flush reports the counts.
type refusalLog struct {
	log *slog.Logger
	lim *rate.Limiter

	mu         sync.Mutex
	suppressed map[string]int // sqlstate -> refusals not logged
	evictions  int
	since      time.Time
}

// refusalBurst and refusalRate: ten lines at once, then one a second.
const (
	refusalBurst = 10
	refusalRate  = rate.Limit(1)
)

func (r *refusalLog) init(log *slog.Logger) {
	r.log = log
	r.lim = rate.NewLimiter(refusalRate, refusalBurst)
	r.suppressed = map[string]int{}
	r.since = time.Now()
}

func (r *refusalLog) refused(project, code, msg string, remote net.Addr) {
	if r.lim.Allow() {
		r.log.Warn("connection refused", "project", project, "sqlstate", code, "reason", msg, "remote", remote)
		return
	}
	r.mu.Lock()
	r.suppressed[code]++
	r.mu.Unlock()
}

// evicted counts a connection closed because too many were still in their
// startup phase; the first of a flood is logged at once.
func (r *refusalLog) evicted() {
	r.mu.Lock()
	r.evictions++
	first := r.evictions == 1
	r.mu.Unlock()
	if first {
		r.log.Warn("too many connections in their startup phase; closing the oldest silent ones")
	}
}

// flush logs what was counted since the last flush, as one line, and
// returns how many connections were evicted meanwhile.
func (r *refusalLog) flush() (evicted int) {
	r.mu.Lock()
	sup, ev, since := r.suppressed, r.evictions, r.since
	if len(sup) == 0 && ev == 0 {
		r.mu.Unlock()
		return 0
	}
	r.suppressed, r.evictions, r.since = map[string]int{}, 0, time.Now()
	r.mu.Unlock()
	codes := make([]string, 0, len(sup))
	for c := range sup {
		codes = append(codes, c)
	}
	sort.Strings(codes)
	attrs := []any{"over", time.Since(since).Round(time.Second)}
	for _, c := range codes {
		attrs = append(attrs, "refused_"+c, sup[c])
	}
	if ev > 0 {
		attrs = append(attrs, "evicted_silent", ev)
	}
	r.log.Warn("connections refused or evicted without a log line each", attrs...)
	return ev
}
