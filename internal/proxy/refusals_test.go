package proxy

import (
	"bytes"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
)

func TestRefusalLogIsBoundedAndCounts(t *testing.T) {
	var buf bytes.Buffer
	var r refusalLog
	r.init(slog.New(slog.NewTextHandler(&buf, nil)))
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5555}
	const flood = 10000
	for range flood {
		r.refused("", "08P01", "invalid length of startup packet: 4294967280", remote)
	}
	for range 3 {
		r.evicted()
	}
	if n := r.flush(); n != 3 {
		t.Fatalf("flush reported %d evictions, want 3", n)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	// A burst of ten (perhaps one more if the refill ticked), the first
	// eviction, and one summary line: never one line per refusal.
	if len(lines) > refusalBurst+3 {
		t.Fatalf("%d log lines for %d refusals:\n%s", len(lines), flood, buf.String())
	}
	summary := lines[len(lines)-1]
	logged := strings.Count(buf.String(), `msg="connection refused"`)
	if !strings.Contains(summary, "refused_08P01=") || !strings.Contains(summary, "evicted_silent=3") {
		t.Fatalf("summary %q lacks the counts", summary)
	}
	var counted int
	for _, f := range strings.Fields(summary) {
		if v, ok := strings.CutPrefix(f, "refused_08P01="); ok {
			counted, _ = strconv.Atoi(v)
		}
	}
	if logged+counted != flood {
		t.Fatalf("%d logged + %d counted = %d, want %d", logged, counted, logged+counted, flood)
	}
	if r.flush() != 0 {
		t.Fatal("a second flush reported evictions again")
	}
}
