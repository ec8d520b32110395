package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgwake/pgwake/internal/backend"
)

// fakeBackend answers every call and can send events.
type fakeBackend struct {
	mu     sync.Mutex
	starts int
	closed bool
	events chan backend.Event
}

func (f *fakeBackend) Name() string                                     { return "docker" }
func (f *fakeBackend) Ensure(context.Context, backend.Spec) error       { return nil }
func (f *fakeBackend) Remove(context.Context, backend.Spec, bool) error { return nil }
func (f *fakeBackend) Sleep(context.Context, backend.Spec, backend.SleepMode) error {
	return nil
}
func (f *fakeBackend) Status(context.Context, backend.Spec) (backend.Status, error) {
	return backend.Status{State: backend.StateStopped}, nil
}
func (f *fakeBackend) Start(context.Context, backend.Spec) (backend.Endpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts++
	return backend.Endpoint{Addr: "127.0.0.1:1"}, nil
}
func (f *fakeBackend) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}
func (f *fakeBackend) Watch(ctx context.Context) <-chan backend.Event {
	out := make(chan backend.Event)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-f.events:
				out <- ev
			}
		}
	}()
	return out
}

// TestLazyBackendUnavailableThenConnected: an unreachable runtime's calls
// fail with its reason and match backend.ErrUnavailable; attempts to
// connect again are rate-limited; once one succeeds, every call reaches
// the real backend, events included, and Close closes it.
func TestLazyBackendUnavailableThenConnected(t *testing.T) {
	t.Parallel()
	reason := errors.New("docker engine unreachable at unix:///nowhere.sock (is Docker running?)")
	real := &fakeBackend{events: make(chan backend.Event)}
	var mu sync.Mutex
	attempts, up := 0, false
	connect := func(context.Context) (backend.Backend, error) {
		mu.Lock()
		defer mu.Unlock()
		attempts++
		if !up {
			return nil, fmt.Errorf("try %d: %w", attempts, reason)
		}
		return real, nil
	}
	l := newLazyBackend("docker", nil, reason, connect, time.Hour, slog.New(slog.DiscardHandler))
	ctx := t.Context()
	events := l.Watch(ctx)
	spec := backend.Spec{Name: "app"}

	_, err := l.Start(ctx, spec)
	if !errors.Is(err, backend.ErrUnavailable) || err.Error() != "docker backend unavailable: "+reason.Error() {
		t.Fatalf("Start: %v, want ErrUnavailable with the reason", err)
	}
	if _, err := l.Status(ctx, spec); !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("Status: %v", err)
	}
	if ok, _ := l.available(); ok {
		t.Fatal("available before connecting")
	}
	if attempts != 0 {
		t.Fatalf("%d connection attempts within the retry interval, want 0", attempts)
	}
	if !l.SupportsPause() {
		t.Error("an unconnected backend refuses pause; the call that needs it should say why instead")
	}

	// The interval has passed (set the clock back rather than wait).
	l.mu.Lock()
	l.lastTry = time.Now().Add(-2 * time.Hour)
	l.mu.Unlock()
	if err := l.Ensure(ctx, spec); !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), "try 1") {
		t.Fatalf("Ensure after the interval: %v, want the new attempt's error", err)
	}
	if err := l.Ensure(ctx, spec); !strings.Contains(err.Error(), "try 1") || attempts != 1 {
		t.Fatalf("a second call at once tried again (%d attempts): %v", attempts, err)
	}

	mu.Lock()
	up = true
	mu.Unlock()
	l.mu.Lock()
	l.lastTry = time.Now().Add(-2 * time.Hour)
	l.mu.Unlock()
	if ep, err := l.Start(ctx, spec); err != nil || ep.Addr != "127.0.0.1:1" {
		t.Fatalf("Start once the runtime answers: %+v, %v", ep, err)
	}
	if ok, err := l.available(); !ok || err != nil {
		t.Fatalf("available after connecting: %v, %v", ok, err)
	}
	if _, err := l.Start(ctx, spec); err != nil || real.starts != 2 || attempts != 2 {
		t.Fatalf("second Start: %v; %d starts, %d attempts; want 2 and 2", err, real.starts, attempts)
	}

	// The watch started before the connection follows the real backend.
	real.events <- backend.Event{Project: "app", State: backend.StateStopped}
	select {
	case ev := <-events:
		if ev.Project != "app" {
			t.Fatalf("event %+v", ev)
		}
	case <-ctx.Done():
		t.Fatal("no event")
	}

	if err := l.Close(); err != nil || !real.closed {
		t.Fatalf("Close: %v, real closed %v", err, real.closed)
	}
	if _, err := l.Start(ctx, spec); !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("Start after Close: %v", err)
	}
}

// TestUnavailableKeepsTheBackendsWords: an error that already says the
// runtime is unavailable is passed on as it is, on one line.
func TestUnavailableKeepsTheBackendsWords(t *testing.T) {
	t.Parallel()
	own := fmt.Errorf("%w: docker engine unreachable at unix:///x.sock", backend.ErrUnavailable)
	if got := unavailable("docker", own).Error(); got != own.Error() {
		t.Errorf("got %q, want %q", got, own)
	}
	multi := errors.New("no PostgreSQL server binaries found\nin PATH")
	err := unavailable("local", multi)
	if strings.Contains(err.Error(), "\n") || !errors.Is(err, backend.ErrUnavailable) || !errors.Is(err, multi) {
		t.Errorf("got %q", err)
	}
}

func TestMostUsed(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		count map[string]int
		want  string
	}{
		{map[string]int{"docker": 1}, "docker"},
		{map[string]int{"docker": 1, "local": 2}, "local"},
		{map[string]int{"docker": 2, "local": 2}, "docker"},
	} {
		if got := mostUsed(tt.count); got != tt.want {
			t.Errorf("mostUsed(%v) = %q, want %q", tt.count, got, tt.want)
		}
	}
}
