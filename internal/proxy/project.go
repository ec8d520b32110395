package proxy

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/pgwake/pgwake/internal/backend"
)

// State is a project's place in the wake state machine.
type State string

const (
	StateSleeping State = "sleeping"
	StateWaking   State = "waking"
	StateRunning  State = "running"
	StateStopping State = "stopping"
)

// Project is a project's configuration as the proxy needs it.
type Project struct {
	Spec       backend.Spec
	SleepAfter time.Duration // zero: never sleep on idle
	SleepMode  backend.SleepMode
	Pinned     bool
}

// wakeCall is one in-flight wake shared by every client that arrives while
// it runs (single flight). err is written before done is closed.
type wakeCall struct {
	done chan struct{}
	err  error
}

// project is the runtime state of one project. Every field below mu is
// guarded by it; no I/O happens while it is held.
type project struct {
	srv *Server

	mu         sync.Mutex
	cfg        Project
	state      State
	addr       string
	active     int // connections holding a slot: parked or piping
	queued     int // of those, parked waiting for a wake or a sleep to end
	wake       *wakeCall
	stopDone   chan struct{} // closed when an in-flight sleep ends
	lastActive time.Time
	wokeAt     time.Time
	failures   int
	retryAt    time.Time
	lastErr    string
	lastErrAt  time.Time
	wakes      int
	wakeFails  int
	latencies  []time.Duration // recent cold starts, oldest first
	events     []Event         // recent state changes, oldest first
	removed    bool
}

// Event is one entry of a project's recent history, for the TUI.
type Event struct {
	At  time.Time `json:"at"`
	Msg string    `json:"msg"`
}

// maxEvents bounds the history kept per project.
const maxEvents = 20

// recordLocked appends to the project's history; p.mu must be held.
func (p *project) recordLocked(format string, args ...any) {
	p.events = append(p.events, Event{At: p.srv.now(), Msg: fmt.Sprintf(format, args...)})
	if len(p.events) > maxEvents {
		p.events = p.events[len(p.events)-maxEvents:]
	}
}

// maxLatencies bounds the cold-start history kept per project.
const maxLatencies = 100

// WakeError is a failed or refused wake, reported to clients with its reason.
type WakeError struct {
	Project string
	Err     error
	RetryAt time.Time // set while the project backs off
}

func (e *WakeError) Error() string {
	if !e.RetryAt.IsZero() {
		return fmt.Sprintf("project %q failed to wake; next attempt in %s: %v",
			e.Project, time.Until(e.RetryAt).Round(100*time.Millisecond), e.Err)
	}
	return fmt.Sprintf("project %q failed to wake: %v", e.Project, e.Err)
}

func (e *WakeError) Unwrap() error { return e.Err }

// errRemoved is returned to clients of a project removed while they waited.
var errRemoved = errors.New("project was removed")

// acquire takes a connection slot on the project (and counts it as active,
// which keeps the project from being put to sleep). The slot must be given
// back with release exactly once.
func (p *project) acquire() (ok, removed bool) {
	p.mu.Lock()
	if p.removed || p.active >= p.srv.opts.MaxProjectConns {
		removed = p.removed
		p.mu.Unlock()
		return false, removed
	}
	p.active++
	p.lastActive = p.srv.now()
	p.mu.Unlock()
	p.srv.notify(p.cfg.Spec.Name)
	return true, false
}

// running reports whether the project's server is up right now.
func (p *project) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state == StateRunning
}

func (p *project) release() {
	p.mu.Lock()
	p.active--
	p.lastActive = p.srv.now()
	p.mu.Unlock()
	p.srv.notify(p.cfg.Spec.Name)
}

// awake returns the address of the project's running server, waking it if
// needed. The caller holds a slot (acquire) before calling, so the project
// cannot be put to sleep between this check and its use: that is the
// "register before checking state" rule that prevents lost wake-ups.
func (p *project) awake(ctx context.Context) (string, error) {
	for {
		p.mu.Lock()
		if p.removed {
			p.mu.Unlock()
			return "", &WakeError{Project: p.cfg.Spec.Name, Err: errRemoved}
		}
		switch p.state {
		case StateRunning:
			addr := p.addr
			p.mu.Unlock()
			return addr, nil
		case StateStopping:
			ch := p.stopDone
			p.queued++
			p.mu.Unlock()
			err := p.park(ctx, ch)
			if err != nil {
				return "", err
			}
			continue // it is asleep now; wake it again
		case StateSleeping:
			if now := p.srv.now(); now.Before(p.retryAt) {
				err := &WakeError{Project: p.cfg.Spec.Name, Err: errors.New(p.lastErr), RetryAt: p.retryAt}
				p.mu.Unlock()
				return "", err
			}
			p.wake = &wakeCall{done: make(chan struct{})}
			p.state = StateWaking
			p.recordLocked("waking")
			go p.runWake(p.wake, p.cfg.Spec)
		}
		c := p.wake
		p.queued++
		p.mu.Unlock()
		if err := p.park(ctx, c.done); err != nil {
			return "", err
		}
		if c.err != nil {
			return "", c.err
		}
	}
}

// inFlight returns the channel closed when the wake or sleep in progress
// ends, or nil when none is (the two never overlap: a wake starts from
// Sleeping, a sleep from Running). p.mu must be held.
func (p *project) inFlight() chan struct{} {
	if p.wake != nil {
		return p.wake.done
	}
	return p.stopDone
}

// park waits for done with the connection counted as queued; p.queued was
// incremented by the caller under the lock.
func (p *project) park(ctx context.Context, done <-chan struct{}) error {
	p.srv.notify(p.cfg.Spec.Name)
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	p.mu.Lock()
	p.queued--
	p.mu.Unlock()
	p.srv.notify(p.cfg.Spec.Name)
	return err
}

// runWake starts the server and waits until Postgres serves. It runs on a
// context detached from the client that triggered it, so a client giving up
// does not abort a wake other clients are waiting for.
func (p *project) runWake(c *wakeCall, spec backend.Spec) {
	s := p.srv
	start := s.now()
	ctx, cancel := context.WithTimeout(s.baseCtx, s.opts.WakeTimeout)
	defer cancel()

	s.log.Info("waking project", "project", spec.Name)
	addr, err := p.startAndWait(ctx, spec)
	took := s.now().Sub(start)

	p.mu.Lock()
	if err != nil {
		p.state = StateSleeping
		p.failures++
		p.wakeFails++
		p.retryAt = s.now().Add(s.backoff(p.failures))
		p.lastErr, p.lastErrAt = err.Error(), s.now()
		p.recordLocked("wake failed after %s: %v", took.Round(time.Millisecond), err)
		c.err = &WakeError{Project: spec.Name, Err: err}
	} else {
		p.state = StateRunning
		p.addr = addr
		p.failures = 0
		p.retryAt = time.Time{}
		p.wokeAt = s.now()
		p.lastActive = p.wokeAt
		p.wakes++
		p.recordLocked("awake in %s", took.Round(time.Millisecond))
		p.latencies = append(p.latencies, took)
		if len(p.latencies) > maxLatencies {
			p.latencies = p.latencies[1:]
		}
	}
	p.wake = nil
	close(c.done)
	p.mu.Unlock()

	if s.opts.OnWake != nil {
		s.opts.OnWake(spec.Name, took, err)
	}
	if err != nil {
		s.log.Error("wake failed", "project", spec.Name, "after", took.Round(time.Millisecond), "err", err)
	} else {
		s.log.Info("project awake", "project", spec.Name, "took", took.Round(time.Millisecond), "addr", addr)
	}
	s.notify(spec.Name)
}

func (p *project) startAndWait(ctx context.Context, spec backend.Spec) (string, error) {
	ep, err := p.srv.opts.Backend.Start(ctx, spec)
	if err != nil {
		return "", err
	}
	if ep.Serving {
		return ep.Addr, nil
	}
	if err := p.srv.waitReady(ctx, spec, ep.Addr); err != nil {
		return "", err
	}
	return ep.Addr, nil
}

// maybeSleep puts the project to sleep if it has been idle long enough. The
// counts are checked under the lock right before the state moves to
// Stopping; clients arriving after that wait for the stop and wake it again.
func (p *project) maybeSleep(force bool) {
	s := p.srv
	now := s.now()
	p.mu.Lock()
	idle := p.state == StateRunning && p.active == 0 && !p.removed
	due := !p.cfg.Pinned && p.cfg.SleepAfter > 0 &&
		now.Sub(p.lastActive) >= p.cfg.SleepAfter && now.Sub(p.wokeAt) >= s.opts.GracePeriod
	if !idle || !(due || force) {
		p.mu.Unlock()
		return
	}
	p.sleepLocked(p.cfg.SleepMode)
}

// sleepLocked moves a Running project to Stopping, unlocks, and calls the
// backend. p.mu must be held; it is released.
func (p *project) sleepLocked(mode backend.SleepMode) {
	s := p.srv
	spec := p.cfg.Spec
	done := make(chan struct{})
	p.state = StateStopping
	p.stopDone = done
	p.recordLocked("going to sleep (%s)", mode)
	p.mu.Unlock()
	s.notify(spec.Name)

	s.log.Info("putting project to sleep", "project", spec.Name, "mode", mode)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.baseCtx), s.opts.StopTimeout)
	err := s.opts.Backend.Sleep(ctx, spec, mode)
	cancel()

	p.mu.Lock()
	if err != nil {
		// The server may still run: keep it Running so the sweep tries
		// again; a client finding it gone makes recheck mark it down.
		p.state = StateRunning
		p.lastActive = s.now()
	} else {
		p.state = StateSleeping
		p.addr = ""
	}
	p.stopDone = nil
	if err != nil {
		p.lastErr, p.lastErrAt = err.Error(), s.now()
		p.recordLocked("sleep (%s) failed: %v", mode, err)
	} else {
		p.recordLocked("asleep (%s)", mode)
	}
	waiting := p.active
	p.mu.Unlock()
	close(done)
	if err != nil {
		s.log.Error("sleep failed", "project", spec.Name, "err", err)
	} else {
		s.log.Info("project asleep", "project", spec.Name, "waiting_clients", waiting)
	}
	s.notify(spec.Name)
}

// observe applies a state the backend reported on its own (a container
// stopped, paused or removed by hand). Transitions pgwake itself is making
// win; a stale event is checked against the backend before it is believed.
func (p *project) observe(st backend.State) {
	s := p.srv
	p.mu.Lock()
	spec, cur := p.cfg.Spec, p.state
	p.mu.Unlock()
	if cur != StateRunning && cur != StateSleeping {
		return
	}
	ctx, cancel := context.WithTimeout(s.baseCtx, 10*time.Second)
	status, err := s.opts.Backend.Status(ctx, spec)
	cancel()
	if err != nil {
		return
	}
	p.mu.Lock()
	switch {
	case p.state == StateRunning && status.State != backend.StateRunning:
		p.state, p.addr = StateSleeping, ""
		p.recordLocked("server %s outside pgwake", status.State)
		s.log.Warn("server stopped outside pgwake", "project", spec.Name, "state", status.State)
	case p.state == StateSleeping && p.wake == nil && status.State == backend.StateRunning && st == backend.StateRunning:
		// Started by hand: adopt it and let the idle sweep manage it.
		p.state, p.addr = StateRunning, status.Addr
		p.lastActive, p.wokeAt = s.now(), s.now()
		p.recordLocked("server started outside pgwake; adopted")
		s.log.Info("server started outside pgwake; adopted", "project", spec.Name)
	default:
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	s.notify(spec.Name)
}

// markDown records that the server at addr stopped answering (for example
// it was stopped outside pgwake and the event has not arrived yet), so the
// next awake call wakes it again.
func (p *project) markDown(addr string) {
	p.mu.Lock()
	if p.state == StateRunning && p.addr == addr {
		p.state, p.addr = StateSleeping, ""
	}
	p.mu.Unlock()
}

// Status is a snapshot of one project, for the admin API and the TUI.
type Status struct {
	Name        string          `json:"name"`
	State       State           `json:"state"`
	Active      int             `json:"active"` // includes Queued
	Queued      int             `json:"queued"`
	Pinned      bool            `json:"pinned"`
	SleepAfter  time.Duration   `json:"sleep_after"`
	SleepMode   string          `json:"sleep_mode"`
	Image       string          `json:"image"`
	Wakes       int             `json:"wakes"`
	WakeFails   int             `json:"wake_failures"`
	LastWake    time.Duration   `json:"last_wake"`
	P50Wake     time.Duration   `json:"p50_wake"`
	P95Wake     time.Duration   `json:"p95_wake"`
	MaxWake     time.Duration   `json:"max_wake"`
	LastError   string          `json:"last_error,omitempty"`
	LastErrorAt time.Time       `json:"last_error_at,omitzero"`
	RetryAt     time.Time       `json:"retry_at,omitzero"`
	IdleFor     time.Duration   `json:"idle_for"`
	LastActive  time.Time       `json:"last_active"`  // last connect, disconnect or wake
	SleepsIn    time.Duration   `json:"sleeps_in"`    // zero when not counting down
	Recent      []time.Duration `json:"recent_wakes"` // oldest first
	Events      []Event         `json:"events"`       // oldest first
}

func (p *project) status() Status {
	s := p.srv
	now := s.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Status{
		Name: p.cfg.Spec.Name, State: p.state, Active: p.active, Queued: p.queued, Pinned: p.cfg.Pinned,
		SleepAfter: p.cfg.SleepAfter, SleepMode: string(p.cfg.SleepMode), Image: p.cfg.Spec.Image,
		Wakes: p.wakes, WakeFails: p.wakeFails,
		LastError: p.lastErr, LastErrorAt: p.lastErrAt, LastActive: p.lastActive,
		Recent: append([]time.Duration(nil), p.latencies...),
		Events: append([]Event(nil), p.events...),
	}
	if now.Before(p.retryAt) {
		st.RetryAt = p.retryAt
	}
	if n := len(p.latencies); n > 0 {
		st.LastWake = p.latencies[n-1]
		sorted := append([]time.Duration(nil), p.latencies...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		st.P50Wake = percentile(sorted, 0.50)
		st.P95Wake = percentile(sorted, 0.95)
		st.MaxWake = sorted[n-1]
	}
	if p.state == StateRunning && p.active == 0 {
		st.IdleFor = now.Sub(p.lastActive)
		if !p.cfg.Pinned && p.cfg.SleepAfter > 0 {
			due := p.lastActive.Add(p.cfg.SleepAfter)
			if g := p.wokeAt.Add(s.opts.GracePeriod); g.After(due) {
				due = g
			}
			st.SleepsIn = max(due.Sub(now), 0)
		}
	}
	return st
}

// percentile picks the nearest-rank percentile of sorted values.
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
