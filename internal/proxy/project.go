package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strings"
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
	// StateHeld is a sleeping server kept asleep while its data is
	// copied or restored (a snapshot, a reset): clients park until then.
	StateHeld State = "held"
)

// Project is a project's configuration as the proxy needs it.
type Project struct {
	Spec       backend.Spec
	Backend    backend.Backend // where its server runs
	SleepAfter time.Duration   // zero: never sleep on idle
	SleepMode  backend.SleepMode
	// StopAfter is, for SleepTiered, how long the server stays paused
	// before it is stopped; zero never stops it (it stays paused).
	StopAfter time.Duration
	Pinned    bool
	// PendingPassword is, while a password rotation is under way, the
	// password the server may already have: pgwake's own login to the
	// server tries it when Spec.Password is refused. Clients keep logging
	// in with Spec.Password until the rotation ends.
	PendingPassword string
}

// env is what a project needs from outside, and all it may call: a clock,
// the upstream dialler, hooks and timings. It holds no pointer back to the
// Server, so the state machine can be driven alone (tests script a backend
// under it).
type env struct {
	now      func() time.Time
	log      *slog.Logger
	up       *upstream
	base     context.Context // sleeps and checks run on it, detached from clients
	wakeBase context.Context // wakes run on it: it ends when a shutdown's drain does
	onChange func(project string)
	onWake   func(project string, took time.Duration, err error)

	wakeTimeout  time.Duration
	firstTimeout time.Duration // a first start (initdb); at least wakeTimeout
	stopTimeout  time.Duration
	grace        time.Duration
	readyPoll    time.Duration
	statusEvery  time.Duration // how often a wake asks the runtime whether the server still runs
	maxConns     int
	backoff      func(failures int) time.Duration
}

// target is the server a running project is dialled at: its address, and
// the run of the server that owned that address when the project woke.
type target struct {
	addr string
	id   string
}

// started is what a successful wake brings: where to dial, and whether it
// was the server's first start (initdb), kept out of cold-start statistics.
type started struct {
	target
	first  bool
	phases WakePhases
}

// WakePhases is where a wake's time went, in order: the runtime's start
// (or unpause) call, the server's process start until it first accepted a
// TCP connection, Postgres's own start-up until it answered a startup
// packet (the probes it refused with 57P03 or a close meanwhile counted in
// Retries), and the runtime check that the server which answered is the
// one started. A client's own authentication and query come after.
type WakePhases struct {
	Engine  time.Duration `json:"engine"`
	Accept  time.Duration `json:"accept"`
	Ready   time.Duration `json:"ready"`
	Confirm time.Duration `json:"confirm"`
	Retries int           `json:"retries"`
}

// wakeCall is one in-flight wake shared by every client that arrives while
// it runs (single flight). err is written before done is closed.
type wakeCall struct {
	done chan struct{}
	err  error
}

// project is the runtime state of one project and owns its whole life:
// adoption, wake, readiness, connect, sleep, recheck and shutdown. Every
// field below mu is guarded by it; no I/O happens while it is held.
type project struct {
	name string
	be   backend.Backend
	env  *env
	log  *slog.Logger
	// kick wakes a wake's readiness loop early when the runtime reports a
	// change (the server died), so it checks now instead of at its next poll.
	kick chan struct{}
	// shared is the backend when other pgwake processes may serve the
	// same server (replicas in a cluster): this one's use is published to
	// them, and theirs is asked before any sleep.
	shared backend.Shared
	// pubMu keeps what is published in the order it was read: two notifies
	// racing must not leave an older count as the last word.
	pubMu sync.Mutex

	mu         sync.Mutex
	cfg        Project
	state      State
	target     target
	active     int           // connections holding a slot: parked or piping
	queued     int           // of those, parked waiting for a wake or a sleep to end
	idle       chan struct{} // closed when active drops to 0; made by waitIdle
	wake       *wakeCall
	stopDone   chan struct{} // closed when an in-flight sleep ends
	heldFor    string        // while StateHeld: why (a branch, a reset)
	heldSince  time.Time
	lastActive time.Time
	wokeAt     time.Time
	failures   int
	retryAt    time.Time
	lastErr    string
	lastErrAt  time.Time
	wakes      int
	wakeFails  int
	latencies  []time.Duration // recent cold starts, oldest first
	lastPhases WakePhases      // of the last wake in latencies
	// serverLogin is the server's last login of a client by pgwake while
	// awake: the time a wrong password is answered in.
	serverLogin time.Duration
	firstStart  time.Duration // how long the first start (initdb) took, if pgwake saw it
	events      []Event       // recent state changes, oldest first
	removed     bool
	closed      bool // shut down with pgwake: no wake starts any more
	// asleep is what the server is in while the project is Sleeping, as
	// far as pgwake knows: SleepPause or SleepStop, "" when it cannot
	// tell (after a failed wake, a server gone, a runtime that did not
	// answer). asleepAt is since when. asleepGen counts pgwake's own
	// changes of it, so observe does not apply a status read before one.
	asleep    backend.SleepMode
	asleepAt  time.Time
	asleepGen int
	// deepenFails counts the consecutive failed stops of a paused tiered
	// project; the sweep tries again from deepenAt.
	deepenFails int
	deepenAt    time.Time
	// creds is what clients of the project's user are verified against,
	// derived from cfg's passwords (nil: not yet, or pass-through).
	creds         *credentials
	authFailures  int // failed logins at the proxy (or the server's 28P01 in pass-through)
	authThrottled int // attempts delayed or refused by the failed-login limit
	// askingPeers is set while a sweep asks the peers (one at a time);
	// peersAgain is when a sweep may ask again after they said busy, and
	// peersBusy what they said, for the status.
	askingPeers bool
	peersAgain  time.Time
	peersBusy   string
}

func newProject(cfg Project, e *env) *project {
	if cfg.SleepMode == "" {
		cfg.SleepMode = backend.SleepStop
	}
	p := &project{
		name: cfg.Spec.Name, be: cfg.Backend, env: e,
		log:  e.log.With("project", cfg.Spec.Name),
		kick: make(chan struct{}, 1),
		cfg:  cfg, state: StateSleeping, lastActive: e.now(),
	}
	p.shared, _ = cfg.Backend.(backend.Shared)
	return p
}

// Event is one entry of a project's recent history, for the TUI.
type Event struct {
	At  time.Time `json:"at"`
	Msg string    `json:"msg"`
}

// maxEvents bounds the history kept per project.
const maxEvents = 20

// maxLatencies bounds the cold-start history kept per project.
const maxLatencies = 100

// recordLocked appends to the project's history; p.mu must be held.
func (p *project) recordLocked(format string, args ...any) {
	p.events = append(p.events, Event{At: p.env.now(), Msg: fmt.Sprintf(format, args...)})
	if len(p.events) > maxEvents {
		p.events = p.events[len(p.events)-maxEvents:]
	}
}

func (p *project) notify() {
	if p.shared != nil {
		p.pubMu.Lock()
		p.mu.Lock()
		u := backend.Use{Conns: p.active, Waking: p.state == StateWaking, LastActive: p.lastActive}
		p.mu.Unlock()
		p.shared.Use(p.name, u) // does not block
		p.pubMu.Unlock()
	}
	if p.env.onChange != nil {
		p.env.onChange(p.name)
	}
}

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

// HeldError is a client's wake that waited the wake timeout for a hold
// (a copy of the project's data) to end: the client is told to try again
// (57P03) rather than kept parked for as long as a large copy takes.
type HeldError struct {
	Project string
	For     string // why the project is held
	Since   time.Time
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("project %q is held for %s (since %s): try again shortly",
		e.Project, e.For, e.Since.Format(time.TimeOnly))
}

// errHeldTooLong ends a client's wait for a hold.
var errHeldTooLong = errors.New("held for longer than the wake timeout")

// errRemoved is returned to clients of a project removed while they waited.
var errRemoved = errors.New("project was removed")

// errNotOurServer means the address a project was dialled at no longer
// belongs to the server pgwake started for it (it moved, or was replaced):
// whatever answers there is somebody else's, and is never relayed to.
// errServerGone is the plainer case: the server stopped. Both end a wake,
// and make a running project be woken again.
var (
	errNotOurServer = errors.New("not the server pgwake started for this project")
	errServerGone   = errors.New("server gone")
)

// errShuttingDown refuses wakes once pgwake has put the project to sleep
// for good.
var errShuttingDown = errors.New("pgwake is shutting down")

// gone reports whether err says the project's server is not the one it
// was dialled at any more.
func gone(err error) bool { return errors.Is(err, errNotOurServer) || errors.Is(err, errServerGone) }

// adopt takes over the project's server in whatever state the runtime
// reports: a running server is Running (idle accounting starts now),
// anything else is Sleeping. A runtime that cannot answer leaves the
// project Sleeping with the error recorded: its clients get that error
// when they connect, and nothing is ever started elsewhere.
func (p *project) adopt(ctx context.Context) {
	st, err := p.be.Status(ctx, p.cfg.Spec)
	p.mu.Lock()
	if err != nil {
		p.lastErr, p.lastErrAt = err.Error(), p.env.now()
		p.setAsleepLocked("")
		p.recordLocked("cannot reach its server: %v", err)
	} else if st.State == backend.StateRunning {
		p.state, p.target, p.wokeAt = StateRunning, target{addr: st.Addr, id: st.ID}, p.env.now()
	} else {
		// Paused since now, as far as the idle steps count: pgwake cannot
		// know since when.
		p.setAsleepLocked(asleepFrom(st.State))
	}
	state := p.state
	p.mu.Unlock()
	if err != nil {
		p.log.Warn("project registered; its backend does not answer", "backend", p.be.Name(), "err", err)
		return
	}
	p.log.Info("project registered", "state", state, "backend", p.be.Name(), "backend_state", st.State)
}

// asleepFrom is the sleep a server the runtime reports in state st is
// in: paused, or stopped (a missing server is as good as stopped).
func asleepFrom(st backend.State) backend.SleepMode {
	switch st {
	case backend.StatePaused:
		return backend.SleepPause
	case backend.StateStopped, backend.StateMissing:
		return backend.SleepStop
	}
	return ""
}

// setAsleepLocked records what the server of a Sleeping project is in,
// from now. p.mu must be held.
func (p *project) setAsleepLocked(m backend.SleepMode) {
	p.asleep, p.asleepAt = m, p.env.now()
	p.asleepGen++
}

// firstSleep is the mode of the project's first sleep on idle (or on
// request): tiered pauses first and stops later (see deepenDueLocked).
// p.mu must be held.
func (p *project) firstSleep() backend.SleepMode {
	if p.cfg.SleepMode == backend.SleepTiered {
		return backend.SleepPause
	}
	return p.cfg.SleepMode
}

// acquire takes a connection slot on the project (and counts it as active,
// which keeps the project from being put to sleep). The slot must be given
// back with release exactly once.
func (p *project) acquire() (ok, removed bool) {
	p.mu.Lock()
	if p.removed || p.active >= p.env.maxConns {
		removed = p.removed
		p.mu.Unlock()
		return false, removed
	}
	p.active++
	p.lastActive = p.env.now()
	p.mu.Unlock()
	p.notify()
	return true, false
}

func (p *project) release() {
	p.mu.Lock()
	p.active--
	p.lastActive = p.env.now()
	if p.active == 0 && p.idle != nil {
		close(p.idle)
		p.idle = nil
	}
	p.mu.Unlock()
	p.notify()
}

// running reports whether the project's server is up right now.
func (p *project) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state == StateRunning
}

// spec returns the project's current spec.
// authMode is AuthSCRAM when pgwake holds the project's password. p.mu
// must be held.
func (p *project) authMode() string {
	if p.cfg.Spec.Password == "" {
		return AuthPassThrough
	}
	return AuthSCRAM
}

// credentials returns what a client of the project's user is verified
// against, or nil when the server authenticates (pgwake holds no
// password). The keys are derived once per password.
func (p *project) credentials() (*credentials, error) {
	p.mu.Lock()
	spec, pending, c := p.cfg.Spec, p.cfg.PendingPassword, p.creds
	p.mu.Unlock()
	if spec.Password == "" {
		return nil, nil
	}
	if c == nil || c.user != spec.User || c.password != spec.Password {
		var err error
		// Outside the lock: 4096 rounds of PBKDF2 take milliseconds.
		if c, err = newCredentials(spec.User, spec.Password); err != nil {
			return nil, err
		}
	} else {
		c = &credentials{user: c.user, password: c.password, stored: c.stored, logins: c.logins}
	}
	c.passwords = []string{spec.Password}
	if pending != "" && pending != spec.Password {
		c.passwords = append(c.passwords, pending)
	}
	p.mu.Lock()
	p.creds = c
	p.mu.Unlock()
	return c, nil
}

// defaultLoginTime is how long a server takes to log a client in until
// pgwake has timed one: Postgres 15 in a container here, a backend's fork
// and its side of SCRAM, took 11-12 ms more than pgwake's own check.
const defaultLoginTime = 10 * time.Millisecond

// loginTime is how long the project's server took for its last login by
// pgwake on an awake server (connect, startup, SCRAM, AuthenticationOk):
// what a client waits for the server's own answer.
func (p *project) loginTime() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.serverLogin == 0 {
		return defaultLoginTime
	}
	return p.serverLogin
}

// maxLoginTime bounds a login sample: one slowed by a retry or a busy
// moment must not make every wrong password wait seconds.
const maxLoginTime = 500 * time.Millisecond

// noteLogin records a login of pgwake's to the server that took d, if no
// wake happened meanwhile (wakes still w0): only then was it the
// server's own time.
func (p *project) noteLogin(d time.Duration, w0 int) {
	p.mu.Lock()
	if p.wakes == w0 && p.state == StateRunning {
		p.serverLogin = min(d, maxLoginTime)
	}
	p.mu.Unlock()
}

// wakeCount is the number of wakes so far.
func (p *project) wakeCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.wakes
}

// waitUntil waits until t or until ctx ends.
func waitUntil(ctx context.Context, t time.Time) {
	d := time.Until(t)
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
}

// countAuth records a failed login (failed) or a throttled attempt.
func (p *project) countAuth(failed, throttled bool) {
	p.mu.Lock()
	if failed {
		p.authFailures++
	}
	if throttled {
		p.authThrottled++
	}
	p.mu.Unlock()
	p.notify()
}

func (p *project) spec() backend.Spec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.Spec
}

// awake returns the project's running server, waking it if needed. The
// caller holds a slot (acquire) before calling, so the project cannot be
// put to sleep between this check and its use: that is the "register
// before checking state" rule that prevents lost wake-ups.
func (p *project) awake(ctx context.Context) (target, error) {
	// A wait for a hold is bounded like a wake, from when it began.
	var heldCtx context.Context
	for {
		p.mu.Lock()
		if p.removed {
			p.mu.Unlock()
			return target{}, &WakeError{Project: p.name, Err: errRemoved}
		}
		if p.closed {
			p.mu.Unlock()
			return target{}, &WakeError{Project: p.name, Err: errShuttingDown}
		}
		switch p.state {
		case StateRunning:
			t := p.target
			p.mu.Unlock()
			return t, nil
		case StateStopping, StateHeld:
			ch := p.stopDone
			pctx := ctx
			heldFor, heldSince := p.heldFor, p.heldSince
			if p.state == StateHeld {
				if heldCtx == nil {
					var cancel context.CancelFunc
					heldCtx, cancel = context.WithTimeoutCause(ctx, p.env.wakeTimeout, errHeldTooLong)
					defer cancel()
				}
				pctx = heldCtx
			}
			p.queued++
			p.mu.Unlock()
			if err := p.park(pctx, ch); err != nil {
				if ctx.Err() == nil && errors.Is(context.Cause(pctx), errHeldTooLong) {
					return target{}, &HeldError{Project: p.name, For: heldFor, Since: heldSince}
				}
				return target{}, err
			}
			continue // it is asleep now; wake it again
		case StateSleeping:
			if now := p.env.now(); now.Before(p.retryAt) {
				err := &WakeError{Project: p.name, Err: errors.New(p.lastErr), RetryAt: p.retryAt}
				p.mu.Unlock()
				return target{}, err
			}
			p.beginWakeLocked("waking")
		}
		c := p.wake
		p.queued++
		p.mu.Unlock()
		if err := p.park(ctx, c.done); err != nil {
			return target{}, err
		}
		if c.err != nil {
			return target{}, c.err
		}
	}
}

// beginWakeLocked moves a Sleeping project to Waking and starts the wake.
// p.mu must be held.
func (p *project) beginWakeLocked(event string) {
	p.wake = &wakeCall{done: make(chan struct{})}
	p.state = StateWaking
	p.recordLocked("%s", event)
	go p.runWake(p.wake, p.cfg.Spec)
}

// inFlight returns the channel closed when the wake or sleep in progress
// ends, or nil when none is (the two never overlap: a wake starts from
// Sleeping, a sleep from Running or, to stop a paused tiered project,
// from Sleeping with no wake in flight). p.mu must be held.
func (p *project) inFlight() chan struct{} {
	if p.wake != nil {
		return p.wake.done
	}
	return p.stopDone
}

// park waits for done with the connection counted as queued; p.queued was
// incremented by the caller under the lock.
func (p *project) park(ctx context.Context, done <-chan struct{}) error {
	p.notify()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	p.mu.Lock()
	p.queued--
	p.mu.Unlock()
	p.notify()
	return err
}

// runWake starts the server and waits until Postgres serves. It runs on a
// context detached from the client that triggered it, so a client giving up
// does not abort a wake other clients are waiting for.
func (p *project) runWake(c *wakeCall, spec backend.Spec) {
	e := p.env
	start := e.now()
	budget := e.wakeTimeout
	if backend.WillInitialize(e.wakeBase, p.be, spec) {
		budget = e.firstTimeout // initdb: seconds, or minutes on a loaded machine
	}
	ctx, cancel := context.WithTimeout(e.wakeBase, budget)
	defer cancel()

	p.mu.Lock()
	from := p.asleep
	p.mu.Unlock()
	p.log.Info("waking project", "from", from)
	st, err := p.startAndWait(ctx, spec)
	t := st.target
	took := e.now().Sub(start)

	p.mu.Lock()
	if err != nil {
		p.state = StateSleeping
		p.failures++
		p.wakeFails++
		p.retryAt = e.now().Add(e.backoff(p.failures))
		p.lastErr, p.lastErrAt = err.Error(), e.now()
		p.setAsleepLocked("") // whatever the failed start left
		p.recordLocked("wake failed after %s: %v", took.Round(time.Millisecond), err)
		c.err = &WakeError{Project: p.name, Err: err}
	} else {
		p.state = StateRunning
		p.target = t
		p.failures = 0
		p.retryAt = time.Time{}
		p.wokeAt = e.now()
		p.lastActive = p.wokeAt
		p.setAsleepLocked("")
		p.deepenFails, p.deepenAt = 0, time.Time{}
		p.wakes++
		if st.first {
			// initdb, not a wake: it would skew every latency figure.
			p.firstStart = took
			p.recordLocked("first start (initdb) in %s", took.Round(time.Millisecond))
		} else {
			if from != "" {
				p.recordLocked("awake in %s (from %s)", took.Round(time.Millisecond), from)
			} else {
				p.recordLocked("awake in %s", took.Round(time.Millisecond))
			}
			p.latencies = append(p.latencies, took)
			p.lastPhases = st.phases
			if len(p.latencies) > maxLatencies {
				p.latencies = p.latencies[1:]
			}
		}
	}
	p.wake = nil
	close(c.done)
	p.mu.Unlock()

	if e.onWake != nil {
		e.onWake(p.name, took, err)
	}
	if err != nil {
		p.log.Error("wake failed", "after", took.Round(time.Millisecond), "err", err)
	} else {
		p.log.Info("project awake", "took", took.Round(time.Millisecond), "addr", t.addr, "from", from)
	}
	p.notify()
}

// startAndWait starts the server, waits until Postgres serves, and then
// confirms that the server that answered is the one it started.
func (p *project) startAndWait(ctx context.Context, spec backend.Spec) (started, error) {
	// Phases are measured on the real clock, whatever clock the
	// project's timers read.
	var ph WakePhases
	t0 := time.Now()
	ep, err := p.be.Start(ctx, spec)
	if err != nil {
		return started{}, err
	}
	ph.Engine = time.Since(t0)
	t := target{addr: ep.Addr, id: ep.ID}
	if ep.Serving {
		// Resumed a server that was serving: nothing answered yet, and
		// every client connection confirms the server anyway.
		return started{target: t, phases: ph}, nil
	}
	if err := p.waitReady(ctx, spec, t, &ph); err != nil {
		return started{}, err
	}
	// The probe's reply proves something serves at the address; the same
	// run still owning it afterwards proves it was this project's server.
	t1 := time.Now()
	if err := p.confirm(ctx, spec, t); err != nil {
		return started{}, err
	}
	ph.Confirm = time.Since(t1)
	return started{target: t, first: ep.First, phases: ph}, nil
}

// waitReady probes the server until Postgres accepts a startup packet. The
// poll interval is short so readiness is seen within tens of milliseconds;
// every statusEvery (or at once when the runtime reports a change) it asks
// the runtime whether the server still runs, so a server that died while
// booting ends the wake at once, with its reason, instead of at the wake
// timeout, and an address handed to someone else is never probed further.
func (p *project) waitReady(ctx context.Context, spec backend.Spec, t target, ph *WakePhases) error {
	e := p.env
	packet, err := probePacket(spec.User, spec.Database)
	if err != nil {
		return err
	}
	var lastErr error
	start := time.Now()
	lastCheck := e.now()
	accepted := false
	timeout := probeTimeout
	for {
		at, retry, err := e.up.probe(ctx, t.addr, packet, timeout)
		// A probe the server's process answered (57P03 or a reply)
		// ends the process start: the rest is Postgres's own start-up.
		if !accepted && !at.IsZero() {
			accepted = true
			ph.Accept = at.Sub(start)
		}
		if err == nil {
			ph.Ready = time.Since(start) - ph.Accept
			return nil
		}
		if retry && accepted {
			ph.Retries++
		}
		if !retry && ctx.Err() == nil && !isTimeout(err) {
			return err
		}
		if isTimeout(err) && ctx.Err() == nil {
			timeout = min(2*timeout, maxProbeTimeout)
		}
		lastErr = keepReason(lastErr, err)
		check := false
		select {
		case <-ctx.Done():
			return fmt.Errorf("server did not become ready: %w", lastErr)
		case <-p.kick:
			check = true
		case <-time.After(p.pollWait(accepted)):
			check = e.now().Sub(lastCheck) >= e.statusEvery
		}
		if check {
			lastCheck = e.now()
			if err := p.confirm(ctx, spec, t); err != nil {
				return err
			}
		}
	}
}

// refusedPoll is the readiness poll while nothing accepts at the address
// yet: a refused TCP connect costs the server nothing, so polling it
// tightly sees the postmaster listen within a couple of milliseconds.
// Once it accepts, every probe it refuses (57P03) forks a backend, so the
// poll slows to readyPoll.
const refusedPoll = 2 * time.Millisecond

func (p *project) pollWait(accepted bool) time.Duration {
	if accepted {
		return p.env.readyPoll
	}
	return min(p.env.readyPoll, refusedPoll)
}

// confirm asks the runtime whether the server at t is still the run that
// was started there. Called after a connection to t.addr has been made, a
// nil result proves that connection reached this project's server: the
// address belonged to that run before and after. A server that is gone
// gives its exit reason and the last lines of its log.
func (p *project) confirm(ctx context.Context, spec backend.Spec, t target) error {
	st, err := p.settledStatus(ctx, spec, t)
	if err != nil {
		return fmt.Errorf("check the server is still the one started: %w", err)
	}
	switch {
	case st.State != backend.StateRunning:
		return p.exitError(ctx, spec, st)
	case t.id != "" && st.ID != t.id && st.Exit != "":
		// Restarted in place by its runtime (a Kubernetes Pod's container
		// after a crash): why the run pgwake started ended is the news.
		return fmt.Errorf("%w: the server at %s was restarted outside pgwake: %w", errNotOurServer, t.addr, p.exitError(ctx, spec, st))
	case st.Addr != t.addr:
		return fmt.Errorf("%w: the server moved from %s to %s", errNotOurServer, t.addr, st.Addr)
	case t.id != "" && st.ID != t.id:
		return fmt.Errorf("%w: the server at %s was restarted outside pgwake", errNotOurServer, t.addr)
	}
	return nil
}

// pauseSettle is how long a report that the run pgwake serves is paused
// is read again before it is believed. Docker 20.10 can apply containerd's
// event of a pause after the unpause that followed it: for a moment (until
// the unpause's own event lands) it reports a running container paused.
const pauseSettle = 2 * time.Second

// settledStatus is the runtime's report on the server, where a report that
// t's own run is paused is read again (every readyPoll, for pauseSettle at
// most) until it says otherwise. A server paused for good is believed
// pauseSettle late; a stale report no longer takes a serving server for
// gone and wakes it a second time.
func (p *project) settledStatus(ctx context.Context, spec backend.Spec, t target) (backend.Status, error) {
	st, err := p.be.Status(ctx, spec)
	if err != nil || st.State != backend.StatePaused || t.id == "" || st.ID != t.id {
		return st, err
	}
	deadline := time.NewTimer(pauseSettle)
	defer deadline.Stop()
	for err == nil && st.State == backend.StatePaused {
		select {
		case <-ctx.Done():
			return st, nil
		case <-deadline.C:
			return st, nil
		case <-time.After(p.env.readyPoll):
		}
		st, err = p.be.Status(ctx, spec)
	}
	return st, err
}

// logTailLines is how much of a dead server's log its clients are shown.
const logTailLines = 10

// exitError describes a server that stopped when it should run: the
// runtime's exit reason and the last lines of its log, for the client's
// error message and for `pgwake ls`.
func (p *project) exitError(ctx context.Context, spec backend.Spec, st backend.Status) error {
	msg := "server " + string(st.State)
	if st.State == backend.StateStopped {
		msg = "server exited"
	}
	if st.Exit != "" {
		msg += " (" + st.Exit + ")"
	}
	tail := st.Log
	if tail == "" {
		tail = p.logTail(ctx, spec)
	}
	if tail != "" {
		msg += "; its log ends: " + tail
	}
	return fmt.Errorf("%w: %s", errServerGone, msg)
}

// logTail returns the last lines of the server's log joined on one line,
// or "" when the backend keeps no log.
func (p *project) logTail(ctx context.Context, spec backend.Spec) string {
	lg, ok := p.be.(backend.Logger)
	if !ok {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rc, err := lg.Logs(ctx, spec, false, logTailLines)
	if err != nil {
		return ""
	}
	defer rc.Close()
	var lines []string
	sc := bufio.NewScanner(io.LimitReader(rc, 64<<10))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return strings.Join(lines, " | ")
}

// connect reaches the project's server for a client: it wakes the project
// if needed, dials, replays the startup packet and peeks at the first
// reply. A server that is still starting (57P03) or that closes without a
// byte (booting, shutting down, a port proxy with no server behind it yet)
// is retried until the wake deadline, so the client never sees either.
// Every connection is confirmed to have reached the server this project
// started before a byte of it is relayed. It returns the upstream
// connection and the bytes of the first reply to pass on.
func (p *project) connect(ctx context.Context, packet []byte) (net.Conn, []byte, error) {
	// Waiting for a wake is bounded by the wake's own deadline; the retry
	// budget starts once the project is awake, so a slow wake does not eat
	// it.
	t, err := p.awake(ctx)
	if err != nil {
		return nil, nil, err
	}
	retryCtx, cancel := context.WithTimeout(ctx, p.env.wakeTimeout)
	defer cancel()
	var lastErr error
	for attempt := 0; ; attempt++ {
		up, first, retry, err := p.try(retryCtx, t, packet)
		if err == nil {
			return up, first, nil
		}
		lastErr = keepReason(lastErr, err)
		var de *dialError
		switch {
		case gone(err):
			// Whatever answers there is not ours: forget the address and
			// let awake start the project's own server again.
			p.markDown(t, err)
		case !retry && retryCtx.Err() == nil:
			return nil, nil, err
		case attempt >= 2 && errors.As(err, &de):
			// Repeated refused connects never reached a check: the server
			// may have been stopped behind our back. Let awake re-check.
			p.recheck(retryCtx, t)
		}
		select {
		case <-retryCtx.Done():
			return nil, nil, fmt.Errorf("timed out waiting for project %q to serve: %w", p.name, lastErr)
		case <-time.After(p.env.readyPoll):
		}
		if t, err = p.awake(retryCtx); err != nil {
			return nil, nil, err
		}
	}
}

// try makes one connection to t for a client. The runtime is asked whether
// t is still this project's server once the TCP connection exists, while
// the startup exchange runs, so the check costs no round trip of its own.
func (p *project) try(ctx context.Context, t target, packet []byte) (net.Conn, []byte, bool, error) {
	e := p.env
	c, err := e.up.dial(ctx, t.addr)
	if err != nil {
		return nil, nil, true, err
	}
	spec := p.spec()
	// A failed check also ends the exchange: a foreign server that accepts
	// and never answers must not hold the client until its deadline.
	xctx, cancel := context.WithCancel(ctx)
	defer cancel()
	confirmed := make(chan error, 1)
	go func() {
		err := p.confirm(ctx, spec, t)
		if err != nil {
			cancel()
		}
		confirmed <- err
	}()
	up, first, retry, err := e.up.exchange(xctx, c, t.addr, packet)
	if cerr := <-confirmed; cerr != nil {
		if up != nil {
			up.Close()
		}
		return nil, nil, true, cerr
	}
	return up, first, retry, err
}

// recheck asks the backend whether the server at t still runs and marks
// the project down if not.
func (p *project) recheck(ctx context.Context, t target) {
	if err := p.confirm(ctx, p.spec(), t); gone(err) {
		p.markDown(t, err)
	}
}

// markDown records that the server at t is gone (stopped outside pgwake,
// crashed, its address reused), so the next awake call wakes it again.
func (p *project) markDown(t target, why error) {
	p.mu.Lock()
	if p.state != StateRunning || p.target != t {
		p.mu.Unlock()
		return
	}
	p.state, p.target = StateSleeping, target{}
	p.setAsleepLocked("")
	p.lastErr, p.lastErrAt = why.Error(), p.env.now()
	p.recordLocked("server gone: %v", why)
	p.mu.Unlock()
	p.log.Warn("server gone; the next client wakes it again", "err", why)
	p.notify()
}

// maybeSleep puts the project to sleep if it has been idle long enough. The
// counts are checked under the lock right before the state moves to
// Stopping; clients arriving after that wait for the stop and wake it again.
// A project other pgwake processes serve too sleeps only when none of them
// uses it either, and is checked again right after (see asleepChecked).
// A tiered project that has been paused for stop_after is stopped (see
// deepenLocked).
func (p *project) maybeSleep() {
	p.mu.Lock()
	if p.deepenDueLocked() {
		p.deepenLocked()
		return
	}
	if !p.sleepDueLocked(time.Time{}) {
		p.mu.Unlock()
		return
	}
	if p.shared == nil {
		p.sleepLocked(p.firstSleep())
		return
	}
	if p.askingPeers || p.env.now().Before(p.peersAgain) {
		p.mu.Unlock()
		return
	}
	p.askingPeers = true
	p.mu.Unlock()

	pu, why := p.askPeers()

	p.mu.Lock()
	p.askingPeers = false
	p.peersBusy = why
	if why != "" {
		p.peersAgain = p.env.now().Add(peersAgainAfter)
		p.mu.Unlock()
		p.log.Debug("staying awake for peers", "why", why)
		p.notify()
		return
	}
	// Asking took a while: the local counts, and the peers' last use, decide
	// now.
	if !p.sleepDueLocked(pu.LastActive) {
		// Not due for the peers' sake: not worth asking again before it can be.
		p.peersAgain = p.env.now().Add(peersAgainAfter)
		if due := pu.LastActive.Add(p.cfg.SleepAfter); due.After(p.peersAgain) {
			p.peersAgain = due
		}
		p.mu.Unlock()
		return
	}
	if p.sleepLocked(p.firstSleep()) == nil {
		p.asleepChecked()
	}
}

// peersAgainAfter is how soon a sweep asks the peers again after they said
// a project is in use: their answer is a list call to the runtime.
const peersAgainAfter = 2 * time.Second

// sleepDueLocked reports whether a Running project is idle here and has
// been for sleep_after, counting peerActive (the peers' latest use) as
// activity too. p.mu must be held.
func (p *project) sleepDueLocked(peerActive time.Time) bool {
	now := p.env.now()
	last := p.lastActive
	if peerActive.After(last) {
		last = peerActive
	}
	idle := p.state == StateRunning && p.active == 0 && !p.removed
	return idle && !p.cfg.Pinned && p.cfg.SleepAfter > 0 &&
		now.Sub(last) >= p.cfg.SleepAfter && now.Sub(p.wokeAt) >= p.env.grace
}

// deepenDueLocked reports whether a tiered project's paused server is due
// to be stopped: Sleeping (nothing in flight), paused (or in a state
// pgwake cannot tell, which a stop settles) for stop_after, with no
// client, not pinned, removed or shut down, and not backing off after a
// failed stop. p.mu must be held.
func (p *project) deepenDueLocked() bool {
	now := p.env.now()
	return p.cfg.SleepMode == backend.SleepTiered && p.cfg.StopAfter > 0 && !p.cfg.Pinned &&
		p.state == StateSleeping && p.asleep != backend.SleepStop && p.wake == nil &&
		p.active == 0 && !p.removed && !p.closed &&
		now.Sub(p.asleepAt) >= p.cfg.StopAfter && !now.Before(p.deepenAt)
}

// deepenLocked stops a tiered project's paused server: tiered sleep's
// second step, which frees the memory a paused server holds. The project
// is Stopping meanwhile, so clients arriving wait for the stop and wake it
// again. A failed stop leaves it Sleeping (still paused, as far as pgwake
// knows; a wake unpauses or starts it, whatever the stop left) and is
// tried again after a backoff. p.mu must be held; it is released.
func (p *project) deepenLocked() {
	e := p.env
	spec := p.cfg.Spec
	done := make(chan struct{})
	p.state = StateStopping
	p.stopDone = done
	p.recordLocked("paused for %s; stopping it", e.now().Sub(p.asleepAt).Round(time.Second))
	p.mu.Unlock()
	p.notify()

	p.log.Info("stopping paused project", "stop_after", p.cfg.StopAfter)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.base), e.stopTimeout)
	err := p.be.Sleep(ctx, spec, backend.SleepStop)
	cancel()

	p.mu.Lock()
	p.state = StateSleeping
	var retry time.Duration
	if err != nil {
		p.deepenFails++
		retry = e.backoff(p.deepenFails)
		p.deepenAt = e.now().Add(retry)
		p.lastErr, p.lastErrAt = err.Error(), e.now()
		p.recordLocked("stop of the paused server failed (next attempt in %s): %v", retry, err)
	} else {
		p.deepenFails, p.deepenAt = 0, time.Time{}
		p.setAsleepLocked(backend.SleepStop)
		p.recordLocked("asleep (stop)")
	}
	p.stopDone = nil
	waiting := p.active
	p.mu.Unlock()
	close(done)
	if err != nil {
		p.log.Error("stop of the paused server failed; it stays asleep", "retry_in", retry, "err", err)
	} else {
		p.log.Info("project stopped after its pause", "waiting_clients", waiting)
	}
	p.notify()
}

// askPeers asks the other pgwake processes serving the project's server
// how they use it. It returns why not to sleep it ("" when nothing speaks
// against it): their connections, a wake of theirs, or doubt (their use
// could not be read).
func (p *project) askPeers() (backend.PeerUse, string) {
	ctx, cancel := context.WithTimeout(p.env.base, 10*time.Second)
	defer cancel()
	pu, err := p.shared.PeerUse(ctx, p.name)
	switch {
	case err != nil:
		return pu, "cannot tell whether other pgwake processes use it: " + err.Error()
	case pu.Conns > 0:
		return pu, fmt.Sprintf("%d connection(s) on other pgwake processes (%s)", pu.Conns, strings.Join(pu.Peers, ", "))
	case pu.Waking:
		return pu, fmt.Sprintf("another pgwake process is waking it (%s)", strings.Join(pu.Peers, ", "))
	}
	return pu, ""
}

// asleepChecked closes the gap between asking the peers and the sleep: a
// peer's client that arrived meanwhile shows in their use now, and the
// project is woken again at once rather than left to that client's retries.
func (p *project) asleepChecked() {
	pu, why := p.askPeers()
	if pu.Conns == 0 && !pu.Waking {
		return // idle everywhere, or in doubt: nothing proves a client is waiting
	}
	p.mu.Lock()
	if p.state != StateSleeping || p.wake != nil || p.removed || p.closed {
		p.mu.Unlock()
		return
	}
	p.log.Info("waking again: a peer's client arrived during the sleep", "why", why)
	p.beginWakeLocked("waking again: " + why)
	p.mu.Unlock()
	p.notify()
}

// sleepLocked moves a Running project to Stopping, unlocks, and calls the
// backend. p.mu must be held; it is released.
func (p *project) sleepLocked(mode backend.SleepMode) error {
	e := p.env
	spec := p.cfg.Spec
	done := make(chan struct{})
	p.state = StateStopping
	p.stopDone = done
	p.recordLocked("going to sleep (%s)", mode)
	p.mu.Unlock()
	p.notify()

	p.log.Info("putting project to sleep", "mode", mode)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.base), e.stopTimeout)
	err := p.be.Sleep(ctx, spec, mode)
	cancel()

	p.mu.Lock()
	if err != nil {
		// The server may still run: keep it Running so the sweep tries
		// again; a client finding it gone makes recheck mark it down.
		p.state = StateRunning
		p.lastActive = e.now()
		p.lastErr, p.lastErrAt = err.Error(), e.now()
		p.recordLocked("sleep (%s) failed: %v", mode, err)
	} else {
		p.state = StateSleeping
		p.target = target{}
		p.setAsleepLocked(mode)
		p.deepenFails, p.deepenAt = 0, time.Time{}
		p.recordLocked("asleep (%s)", mode)
	}
	p.stopDone = nil
	waiting := p.active
	p.mu.Unlock()
	close(done)
	if err != nil {
		p.log.Error("sleep failed", "err", err)
	} else {
		p.log.Info("project asleep", "waiting_clients", waiting)
	}
	p.notify()
	return err
}

// idleGrace is how long an explicit sleep, or a hold that stops the
// server, waits for the project's connections to end before it refuses. A
// client that has just disconnected is counted until its relay has read
// its Terminate and end of stream, which on a loaded machine can come
// after the client process itself has exited (`psql -c ...; pgwake sleep
// app` was refused so).
const idleGrace = 2 * time.Second

// waitIdle waits until no connection holds a slot, for at most idleGrace.
// Called without p.mu; the error is the context's.
func (p *project) waitIdle(ctx context.Context) error {
	t := time.NewTimer(idleGrace)
	defer t.Stop()
	for {
		p.mu.Lock()
		if p.active == 0 {
			p.mu.Unlock()
			return nil
		}
		if p.idle == nil {
			p.idle = make(chan struct{})
		}
		ch := p.idle
		p.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// sleepNow puts a running project to sleep unless clients are connected,
// first letting a wake or sleep in flight finish.
func (p *project) sleepNow(ctx context.Context) error {
	graced := false
	for {
		p.mu.Lock()
		switch {
		case p.state == StateSleeping:
			p.mu.Unlock()
			return nil
		case p.state == StateRunning && p.active > 0:
			n := p.active
			p.mu.Unlock()
			if graced {
				return fmt.Errorf("project %q has %d open connection(s)", p.name, n)
			}
			graced = true
			if err := p.waitIdle(ctx); err != nil {
				return err
			}
			continue
		case p.state == StateRunning && p.shared != nil:
			p.mu.Unlock()
			// A peer's client that just left may not be published yet
			// (its Lease is written at most every 100 ms): give a few
			// seconds before refusing.
			if why := p.peersStillBusy(); why != "" {
				return fmt.Errorf("project %q stays awake: %s", p.name, why)
			}
			p.mu.Lock()
			if p.state != StateRunning || p.active > 0 {
				p.mu.Unlock()
				continue // changed while the peers were asked
			}
			err := p.sleepLocked(p.firstSleep())
			if err == nil {
				p.asleepChecked()
			}
			return err
		case p.state == StateRunning:
			// A failed sleep leaves it running (the sweep tries again);
			// the caller is told. A tiered project pauses, as on idle.
			return p.sleepLocked(p.firstSleep())
		}
		ch := p.inFlight()
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// observe applies a state the backend reported on its own (a container
// stopped, paused or removed by hand). Transitions pgwake itself is making
// win; a stale event is checked against the backend before it is believed.
// A wake in progress is only nudged: its readiness loop checks at once.
func (p *project) observe(st backend.State) {
	p.mu.Lock()
	spec, cur, t0, w0, g0 := p.cfg.Spec, p.state, p.target, p.wakes, p.asleepGen
	p.mu.Unlock()
	if cur == StateWaking {
		select {
		case p.kick <- struct{}{}:
		default:
		}
		return
	}
	if cur != StateRunning && cur != StateSleeping {
		return
	}
	ctx, cancel := context.WithTimeout(p.env.base, 10*time.Second)
	status, err := p.settledStatus(ctx, spec, t0)
	cancel()
	if err != nil {
		return
	}
	p.mu.Lock()
	switch {
	case p.state == StateRunning && p.target == t0 && p.wakes == w0 &&
		(status.State != backend.StateRunning || (t0.id != "" && status.ID != t0.id)):
		// Only the run seen before the check is marked down: after a sleep
		// and a wake meanwhile (a pause and unpause keep the run's ID, so
		// the wake count tells) the status may be of the sleep.
		p.state, p.target = StateSleeping, target{}
		p.setAsleepLocked(asleepFrom(status.State))
		if status.Exit != "" {
			p.lastErr, p.lastErrAt = "server "+string(status.State)+" outside pgwake ("+status.Exit+")", p.env.now()
		}
		p.recordLocked("server %s outside pgwake", status.State)
		p.log.Warn("server stopped outside pgwake", "state", status.State, "exit", status.Exit)
	case p.state == StateSleeping && p.wake == nil && status.State == backend.StateRunning && st == backend.StateRunning:
		// Started by hand: adopt it and let the idle sweep manage it.
		p.state, p.target = StateRunning, target{addr: status.Addr, id: status.ID}
		p.lastActive, p.wokeAt = p.env.now(), p.env.now()
		p.recordLocked("server started outside pgwake; adopted")
		p.log.Info("server started outside pgwake; adopted")
	case p.state == StateSleeping && p.wake == nil && p.asleepGen == g0 &&
		asleepFrom(status.State) != "" && asleepFrom(status.State) != p.asleep:
		// Paused, stopped or removed by hand while asleep: a paused server
		// stopped outside pgwake needs no stop any more, and a wake from it
		// is a start. Only when pgwake changed nothing meanwhile (a status
		// read before its own stop would undo it).
		m := asleepFrom(status.State)
		p.setAsleepLocked(m)
		p.recordLocked("server %s outside pgwake", status.State)
		p.log.Info("server changed outside pgwake while asleep", "state", status.State)
	default:
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	p.notify()
}

// remove marks the project removed, so no new wake or sleep starts, and
// returns the channel of the one in flight (nil if none).
func (p *project) remove() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removed = true
	return p.inFlight()
}

// shutdown puts the project's server to sleep for a pgwake that exits. No
// wake starts from here; one in flight ends (its context ends with the
// drain) before the server is stopped. A server that is not Running is
// stopped too: a paused one would hold its memory with nobody to wake it,
// and a failed wake can leave one running. Stopping a stopped server is a
// no-op.
func (p *project) shutdown() error {
	p.mu.Lock()
	p.closed = true
	for p.state == StateWaking || p.state == StateStopping || p.state == StateHeld {
		ch := p.inFlight()
		p.mu.Unlock()
		<-ch
		p.mu.Lock()
	}
	if p.removed {
		p.mu.Unlock()
		return nil // its remover stops it
	}
	if p.shared != nil {
		// Other pgwake processes may serve it still (a rolling restart of
		// replicas): their clients keep it awake, as any doubt does. Also
		// when it is not Running here: a peer may have woken it since this
		// process last heard.
		p.mu.Unlock()
		if why := p.peersStillBusy(); why != "" {
			p.log.Info("left running for other pgwake processes", "why", why)
			return nil
		}
		p.mu.Lock()
		// A sweep's sleep may have begun meanwhile: let it end first.
		for p.state == StateWaking || p.state == StateStopping || p.state == StateHeld {
			ch := p.inFlight()
			p.mu.Unlock()
			<-ch
			p.mu.Lock()
		}
	}
	if p.state == StateRunning {
		p.sleepLocked(backend.SleepStop)
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.state == StateRunning {
			return errors.New(p.lastErr)
		}
		return nil
	}
	spec := p.cfg.Spec
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), p.env.stopTimeout)
	defer cancel()
	err := p.be.Sleep(ctx, spec, backend.SleepStop)
	if errors.Is(err, backend.ErrUnavailable) || errors.Is(err, backend.ErrNotFound) {
		return nil // nothing of it can be running where pgwake could stop it
	}
	return err
}

// peersStillBusy asks the peers, for a pgwake that shuts down, whether
// they still use the project; while they do it asks again for a few
// seconds, so that replicas all shutting down at once (each waiting for
// the others' last connections to be published as gone) still leave the
// server asleep, not running with nobody to put it to sleep.
//
// Idle means idle twice, peersSettle apart, with the same last activity:
// a peer publishes at most every 100 ms, so one idle answer can fall
// between its client leaving and its next client's publish (seen: a
// client that connected through a peer right after a wake there was cut
// by an explicit sleep here).
func (p *project) peersStillBusy() string {
	deadline := p.env.now().Add(3 * time.Second)
	var (
		idle bool
		last time.Time
	)
	for {
		pu, why := p.askPeers()
		switch {
		case why != "":
			idle = false
		case idle && pu.LastActive.Equal(last):
			return ""
		default:
			idle, last = true, pu.LastActive
		}
		if p.env.now().After(deadline) {
			if why == "" {
				why = "other pgwake processes' use of it keeps changing"
			}
			return why
		}
		time.Sleep(peersSettle)
	}
}

// peersSettle spaces the two reads that find the peers idle: several of a
// peer's publish intervals.
const peersSettle = 500 * time.Millisecond

// Status is a snapshot of one project, for the admin API and the TUI.
type Status struct {
	Name       string        `json:"name"`
	State      State         `json:"state"`
	Active     int           `json:"active"` // includes Queued
	Queued     int           `json:"queued"`
	Pinned     bool          `json:"pinned"`
	SleepAfter time.Duration `json:"sleep_after"`
	SleepMode  string        `json:"sleep_mode"`
	Image      string        `json:"image"`
	Backend    string        `json:"backend"`
	Wakes      int           `json:"wakes"`
	WakeFails  int           `json:"wake_failures"`
	LastWake   time.Duration `json:"last_wake"`
	// LastPhases is where the last wake's time went.
	LastPhases  WakePhases    `json:"last_wake_phases"`
	P50Wake     time.Duration `json:"p50_wake"`
	P95Wake     time.Duration `json:"p95_wake"`
	MaxWake     time.Duration `json:"max_wake"`
	LastError   string        `json:"last_error,omitempty"`
	LastErrorAt time.Time     `json:"last_error_at,omitzero"`
	RetryAt     time.Time     `json:"retry_at,omitzero"`
	IdleFor     time.Duration `json:"idle_for"`
	LastActive  time.Time     `json:"last_active"` // last connect, disconnect or wake
	SleepsIn    time.Duration `json:"sleeps_in"`   // zero when not counting down
	// StopAfter is a tiered project's time paused before it is stopped.
	StopAfter time.Duration `json:"stop_after"`
	// Asleep is what the server of a sleeping project is in: "pause" or
	// "stop"; empty while it is not asleep, or when pgwake cannot tell.
	Asleep string `json:"asleep,omitempty"`
	// NextSleep is the time until the project's next idle step: the
	// sleep while it runs idle (SleepsIn), for a paused tiered project
	// the stop; zero when none is counting down or it is due now.
	NextSleep  time.Duration   `json:"next_sleep"`
	Recent     []time.Duration `json:"recent_wakes"` // oldest first
	FirstStart time.Duration   `json:"first_start"`  // the first start (initdb), not in the wake figures
	Events     []Event         `json:"events"`       // oldest first
	// Auth is who authenticates the project's clients: AuthSCRAM
	// (pgwake, before any wake) or AuthPassThrough (the server).
	Auth          string `json:"auth"`
	AuthFailures  int    `json:"auth_failures"`
	AuthThrottled int    `json:"auth_throttled"`
	// PeersBusy says why other pgwake processes serving the same server
	// keep it awake (their connections, a wake of theirs, or doubt), as
	// the last idle check found; empty when none did.
	PeersBusy string `json:"peers_busy,omitempty"`
}

func (p *project) status() Status {
	now := p.env.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Status{
		Name: p.name, State: p.state, Active: p.active, Queued: p.queued, Pinned: p.cfg.Pinned,
		SleepAfter: p.cfg.SleepAfter, SleepMode: string(p.cfg.SleepMode), StopAfter: p.cfg.StopAfter,
		Image:   p.cfg.Spec.Image,
		Backend: p.be.Name(), Wakes: p.wakes, WakeFails: p.wakeFails,
		LastError: p.lastErr, LastErrorAt: p.lastErrAt, LastActive: p.lastActive,
		Recent:     append([]time.Duration(nil), p.latencies...),
		FirstStart: p.firstStart,
		Events:     append([]Event(nil), p.events...),
		Auth:       p.authMode(), AuthFailures: p.authFailures, AuthThrottled: p.authThrottled,
	}
	if now.Before(p.retryAt) {
		st.RetryAt = p.retryAt
	}
	if p.state == StateRunning {
		st.PeersBusy = p.peersBusy
	}
	if n := len(p.latencies); n > 0 {
		st.LastWake = p.latencies[n-1]
		st.LastPhases = p.lastPhases
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
			if g := p.wokeAt.Add(p.env.grace); g.After(due) {
				due = g
			}
			st.SleepsIn = max(due.Sub(now), 0)
			st.NextSleep = st.SleepsIn
		}
	}
	if p.state == StateSleeping || p.state == StateStopping {
		st.Asleep = string(p.asleep)
	}
	if p.state == StateSleeping && p.cfg.SleepMode == backend.SleepTiered && p.cfg.StopAfter > 0 &&
		!p.cfg.Pinned && p.asleep != backend.SleepStop && p.wake == nil && p.active == 0 {
		due := p.asleepAt.Add(p.cfg.StopAfter)
		if p.deepenAt.After(due) {
			due = p.deepenAt
		}
		st.NextSleep = max(due.Sub(now), 0)
	}
	return st
}

// percentile picks the nearest-rank percentile of sorted values.
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// BusyError refuses to stop a server that clients are using.
type BusyError struct {
	Project string
	Conns   int
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("project %q has %d open connection(s)", e.Project, e.Conns)
}

// ErrAwake is returned by a hold that needs the server asleep and may not
// stop it, when it is awake.
var ErrAwake = errors.New("its server is awake")

// holdAsleep runs fn with the project's server asleep and held so (state
// Held): clients that connect meanwhile park, and wake the server once fn
// is done, with whatever data fn left. A wake or sleep in flight ends
// first. An awake server is ErrAwake with HoldNoStop; with
// HoldStopDiscard it is shut down first (at once, or fast when it has
// clients), which a server with clients is only with force: their
// sessions then end with Postgres's own FATAL 57P01.
func (p *project) holdAsleep(ctx context.Context, how HoldStop, force bool, why string, fn func(context.Context) error) error {
	stop := how != HoldNoStop
	graced := false
	for {
		p.mu.Lock()
		switch {
		case p.removed:
			p.mu.Unlock()
			return errRemoved
		case p.closed:
			p.mu.Unlock()
			return errShuttingDown
		}
		switch p.state {
		case StateWaking, StateStopping, StateHeld:
			ch := p.inFlight()
			p.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		case StateRunning:
			if !stop {
				p.mu.Unlock()
				return ErrAwake
			}
			if n := p.active; n > 0 && !force {
				p.mu.Unlock()
				if graced {
					return &BusyError{Project: p.name, Conns: n}
				}
				graced = true
				if err := p.waitIdle(ctx); err != nil {
					return err
				}
				continue
			}
		}
		wasRunning := p.state == StateRunning
		// Clients forced out learn why (FATAL 57P01) only from a clean
		// shutdown; an immediate one just drops them.
		kill := how == HoldStopDiscard && p.active == 0
		done := make(chan struct{})
		p.state, p.stopDone = StateHeld, done
		p.heldFor, p.heldSince = why, p.env.now()
		p.recordLocked("held: %s", why)
		spec := p.cfg.Spec
		p.mu.Unlock()
		p.notify()
		p.log.Info("holding project asleep", "why", why)

		var stopErr, err error
		if stop {
			// Also when it sleeps already: a paused server must be
			// stopped for its files to be whole, and stopping a stopped
			// one is a no-op.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(p.env.base), p.env.stopTimeout)
			if kill {
				stopErr = backend.Kill(sctx, p.be, spec)
			} else {
				stopErr = p.be.Sleep(sctx, spec, backend.SleepStop)
			}
			cancel()
			err = stopErr
		}
		if err == nil {
			err = fn(ctx)
		}

		p.mu.Lock()
		switch {
		case stopErr != nil && wasRunning:
			// It may still run: as after a failed sleep.
			p.state = StateRunning
			p.lastActive = p.env.now()
			p.recordLocked("stop for %s failed: %v", why, stopErr)
		default:
			p.state, p.target = StateSleeping, target{}
			switch {
			case stop && stopErr == nil:
				p.setAsleepLocked(backend.SleepStop)
				if err == nil {
					// New data (a reset): an earlier wake's failure says
					// nothing of it.
					p.failures, p.retryAt = 0, time.Time{}
				}
			case stop:
				p.setAsleepLocked("") // paused or stopped: unknown
			}
			if err != nil {
				p.recordLocked("%s failed: %v", why, err)
			} else {
				p.recordLocked("%s: done", why)
			}
		}
		p.stopDone = nil
		p.mu.Unlock()
		close(done)
		p.notify()
		return err
	}
}

// withAwake runs fn with the project's server awake (woken first, exactly
// once like any client's wake) and kept so: fn counts as a client.
func (p *project) withAwake(ctx context.Context, fn func(context.Context) error) error {
	if ok, removed := p.acquire(); !ok {
		if removed {
			return errRemoved
		}
		return fmt.Errorf("project %q: too many connections", p.name)
	}
	defer p.release()
	if _, err := p.awake(ctx); err != nil {
		return err
	}
	return fn(ctx)
}
