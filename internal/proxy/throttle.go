package proxy

import (
	"context"
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// authThrottle limits failed logins per client address: a burst of
// failures passes, then each further attempt from that address waits for
// the bucket to refill before it may try, and one that would wait longer
// than maxWait is refused at once. Only failures take tokens, so a client
// that logs in correctly never drains its address's budget; but while an
// address is throttled every attempt from it waits, since a password can
// only be told right by trying it.
//
// In pass-through mode a failure is the server's 28P01, so the limit is
// on wakes a failing client causes; with SCRAM at the proxy nothing wakes
// on a failure, and the limit is on password guessing.
type authThrottle struct {
	every   time.Duration // one failure's worth of refill
	burst   int
	maxWait time.Duration

	mu sync.Mutex
	by map[string]*rate.Limiter // by client IP; dropped once full again
}

func newAuthThrottle(every time.Duration, burst int, maxWait time.Duration) *authThrottle {
	return &authThrottle{every: every, burst: burst, maxWait: maxWait, by: map[string]*rate.Limiter{}}
}

// throttled is an attempt refused because its address failed too often.
type throttled struct {
	addr  string
	retry time.Duration
}

func (e *throttled) Error() string { return "too many failed logins from " + e.addr }

// admit is called before an attempt from addr authenticates. It returns at
// once for an address with budget left; otherwise it reserves the
// attempt's token and waits for it, or reports *throttled when the wait
// would exceed maxWait. paid says the attempt's failure is already
// counted, waited says it had to wait.
func (t *authThrottle) admit(ctx context.Context, addr string) (paid, waited bool, err error) {
	t.mu.Lock()
	lim := t.by[addr]
	if lim == nil || lim.Tokens() >= 1 {
		t.mu.Unlock()
		return false, false, nil
	}
	r := lim.Reserve()
	t.mu.Unlock()
	d := r.Delay()
	if d > t.maxWait {
		r.Cancel()
		return false, true, &throttled{addr: addr, retry: d - t.maxWait}
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true, true, nil
	case <-ctx.Done():
		r.Cancel()
		return false, true, ctx.Err()
	}
}

// failed counts a failed login from addr, unless admit already did.
func (t *authThrottle) failed(addr string, paid bool) {
	if paid {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	lim := t.by[addr]
	if lim == nil {
		lim = rate.NewLimiter(rate.Every(t.every), t.burst)
		t.by[addr] = lim
	}
	lim.Allow()
}

// prune forgets addresses whose budget is whole again, so a scan from
// many addresses does not grow the map for good.
func (t *authThrottle) prune() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for addr, lim := range t.by {
		if lim.Tokens() >= float64(t.burst) {
			delete(t.by, addr)
		}
	}
}

// clientIP is the address a throttle counts a connection under.
func clientIP(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}
