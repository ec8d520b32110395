package proxy_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
)

// fakeClock is the time the proxy's projects read in these tests: it moves
// only when the test moves it, and the test sweeps (Server.Sweep) itself,
// so every idle step happens at a point the test chose.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// tieredScript is a scripted runtime whose Start unpauses a paused server
// (the same run, already serving, as Docker's unpause) and starts a
// stopped one as a new run at u.
func tieredScript(u *scriptedUpstream) *scriptBackend {
	be := &scriptBackend{}
	addr := u.ln.Addr().String()
	be.start = func() (backend.Endpoint, error) {
		if be.status.State == backend.StatePaused {
			be.status.State = backend.StateRunning
			return backend.Endpoint{Addr: be.status.Addr, ID: be.status.ID, Serving: true}, nil
		}
		id := fmt.Sprintf("run-%d", be.starts)
		be.status = backend.Status{State: backend.StateRunning, Addr: addr, ID: id}
		return backend.Endpoint{Addr: addr, ID: id}, nil
	}
	return be
}

const (
	tierSleepAfter = 10 * time.Second
	tierStopAfter  = 30 * time.Minute
)

// tieredProxy is a proxy with one tiered project "app" on be, on a fake
// clock, with no sweep but the test's own.
type tieredProxy struct {
	srv     *proxy.Server
	addr    string
	clk     *fakeClock
	changed chan struct{}
}

func serveTiered(t *testing.T, be backend.Backend, opts proxy.Options) *tieredProxy {
	t.Helper()
	tp := &tieredProxy{clk: &fakeClock{t: time.Now()}, changed: make(chan struct{}, 1)}
	opts.SweepInterval = time.Hour
	opts.OnChange = func(string) {
		select {
		case tp.changed <- struct{}{}:
		default:
		}
	}
	tp.srv, tp.addr = serveProject(t, proxy.Project{
		Spec: backend.Spec{Name: "app", User: "u", Database: "app"}, Backend: be,
		SleepMode: backend.SleepTiered, SleepAfter: tierSleepAfter, StopAfter: tierStopAfter,
	}, opts, func(s *proxy.Server) { s.SetClock(tp.clk.now) })
	return tp
}

func (tp *tieredProxy) status(t *testing.T) proxy.Status {
	t.Helper()
	st, err := tp.srv.ProjectStatus("app")
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitFor waits, on the proxy's change notifications, until cond holds.
func (tp *tieredProxy) waitFor(t *testing.T, what string, cond func(proxy.Status) bool) proxy.Status {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		st := tp.status(t)
		if cond(st) {
			return st
		}
		select {
		case <-tp.changed:
		case <-deadline:
			t.Fatalf("%s not reached; status %+v", what, st)
		}
	}
}

// wantAsleep fails the test unless the project sleeps in the given step
// with next until its next one.
func wantAsleep(t *testing.T, st proxy.Status, asleep string, next time.Duration) {
	t.Helper()
	if st.State != proxy.StateSleeping || st.Asleep != asleep || st.NextSleep != next {
		t.Fatalf("state %s, asleep %q, next step in %v; want sleeping, %q, %v", st.State, st.Asleep, st.NextSleep, asleep, next)
	}
}

func lastEvent(st proxy.Status) string {
	if len(st.Events) == 0 {
		return ""
	}
	return st.Events[len(st.Events)-1].Msg
}

// pauseIdle wakes the project, lets it run idle for sleep_after and sweeps:
// it is paused.
func (tp *tieredProxy) pauseIdle(t *testing.T) {
	t.Helper()
	if err := tp.srv.Wake(t.Context(), "app"); err != nil {
		t.Fatal(err)
	}
	st := tp.status(t)
	if st.SleepsIn != tierSleepAfter || st.NextSleep != tierSleepAfter || st.StopAfter != tierStopAfter {
		t.Fatalf("awake and idle: sleeps in %v, next step in %v, stop after %v; want %v, %v, %v",
			st.SleepsIn, st.NextSleep, st.StopAfter, tierSleepAfter, tierSleepAfter, tierStopAfter)
	}
	tp.clk.add(tierSleepAfter)
	tp.srv.Sweep()
	wantAsleep(t, tp.status(t), "pause", tierStopAfter)
}

func TestTieredPausesThenStops(t *testing.T) {
	t.Parallel()
	be := tieredScript(newScriptedUpstream(t))
	tp := serveTiered(t, be, proxy.Options{})
	tp.pauseIdle(t)
	if got := be.sleepModes(); !slices.Equal(got, []backend.SleepMode{backend.SleepPause}) {
		t.Fatalf("sleep calls %v after sleep_after; want one pause", got)
	}

	tp.clk.add(tierStopAfter - time.Minute)
	tp.srv.Sweep()
	wantAsleep(t, tp.status(t), "pause", time.Minute)

	tp.clk.add(time.Minute)
	tp.srv.Sweep()
	wantAsleep(t, tp.status(t), "stop", 0)
	if got := be.sleepModes(); !slices.Equal(got, []backend.SleepMode{backend.SleepPause, backend.SleepStop}) {
		t.Fatalf("sleep calls %v; want a pause, then a stop after stop_after", got)
	}
	if st, _ := be.Status(t.Context(), backend.Spec{}); st.State != backend.StateStopped {
		t.Fatalf("server %s; want stopped", st.State)
	}

	// Stopped is the last step: nothing more happens however long it sleeps.
	tp.clk.add(24 * time.Hour)
	tp.srv.Sweep()
	if got := be.sleepModes(); len(got) != 2 {
		t.Fatalf("sleep calls %v; a stopped project must not be slept again", got)
	}
}

func TestTieredWakesFromEachStep(t *testing.T) {
	t.Parallel()
	for _, step := range []string{"pause", "stop"} {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			be := tieredScript(newScriptedUpstream(t))
			tp := serveTiered(t, be, proxy.Options{})
			tp.pauseIdle(t)
			if step == "stop" {
				tp.clk.add(tierStopAfter)
				tp.srv.Sweep()
				wantAsleep(t, tp.status(t), "stop", 0)
			}
			if v := connectVersion(t, tp.addr); v != "15-scripted" {
				t.Fatalf("client reached %q", v)
			}
			st := tp.status(t)
			if st.State != proxy.StateRunning || st.Asleep != "" || be.startCount() != 2 || st.Wakes != 2 {
				t.Fatalf("after the client: state %s, asleep %q, starts %d, wakes %d; want running, none, 2, 2", st.State, st.Asleep, be.startCount(), st.Wakes)
			}
			want := "(from " + step + ")"
			if !strings.Contains(lastEvent(st), want) {
				t.Fatalf("last event %q lacks %q", lastEvent(st), want)
			}
			// Unpaused, it is the same run; started, a new one.
			rs, _ := be.Status(t.Context(), backend.Spec{})
			if wantID := map[string]string{"pause": "run-1", "stop": "run-2"}[step]; rs.ID != wantID {
				t.Fatalf("server run %q; want %q", rs.ID, wantID)
			}
			// Idle again, the steps start over: a pause first.
			tp.waitFor(t, "the client gone", func(st proxy.Status) bool { return st.Active == 0 })
			tp.clk.add(tierSleepAfter)
			tp.srv.Sweep()
			wantAsleep(t, tp.status(t), "pause", tierStopAfter)
		})
	}
}

func TestTieredClientDuringTheStopWaitsAndWakesIt(t *testing.T) {
	t.Parallel()
	be := tieredScript(newScriptedUpstream(t))
	tp := serveTiered(t, be, proxy.Options{})
	tp.pauseIdle(t)

	// The next Sleep call (the stop) holds until the test lets it go.
	be.inSleep, be.sleepGate = make(chan struct{}), make(chan struct{})
	tp.clk.add(tierStopAfter)
	swept := make(chan struct{})
	go func() { defer close(swept); tp.srv.Sweep() }()
	<-be.inSleep
	if st := tp.status(t); st.State != proxy.StateStopping {
		t.Fatalf("state %s during the stop; want stopping", st.State)
	}

	got := make(chan string, 1)
	go func() { got <- connectVersion(t, tp.addr) }()
	tp.waitFor(t, "the client parked behind the stop", func(st proxy.Status) bool { return st.Queued == 1 })
	if n := be.startCount(); n != 1 {
		t.Fatalf("%d starts while the stop runs; the client must wait for it", n)
	}
	close(be.sleepGate)
	<-swept
	if v := <-got; v != "15-scripted" {
		t.Fatalf("client reached %q", v)
	}
	st := tp.status(t)
	if st.State != proxy.StateRunning || be.startCount() != 2 || !strings.Contains(lastEvent(st), "(from stop)") {
		t.Fatalf("state %s, starts %d, last event %q; want it woken again from the stop", st.State, be.startCount(), lastEvent(st))
	}
}

func TestTieredFailedStopStaysPausedAndRetriesWithBackoff(t *testing.T) {
	t.Parallel()
	be := tieredScript(newScriptedUpstream(t))
	var mu sync.Mutex
	failing := true
	be.sleepErr = func(m backend.SleepMode) error {
		mu.Lock()
		defer mu.Unlock()
		if m == backend.SleepStop && failing {
			return errors.New("engine refused the stop")
		}
		return nil
	}
	tp := serveTiered(t, be, proxy.Options{BackoffBase: time.Minute, BackoffMax: 10 * time.Minute})
	tp.pauseIdle(t)
	stops := func() int {
		n := 0
		for _, m := range be.sleepModes() {
			if m == backend.SleepStop {
				n++
			}
		}
		return n
	}

	tp.clk.add(tierStopAfter)
	tp.srv.Sweep()
	st := tp.status(t)
	wantAsleep(t, st, "pause", time.Minute)
	if stops() != 1 || !strings.Contains(st.LastError, "engine refused the stop") {
		t.Fatalf("%d stops, last error %q; want one failed stop, reported", stops(), st.LastError)
	}
	// Not every sweep: the next attempt waits for its backoff.
	tp.srv.Sweep()
	tp.clk.add(59 * time.Second)
	tp.srv.Sweep()
	if stops() != 1 {
		t.Fatalf("%d stops within the backoff; want 1", stops())
	}
	tp.clk.add(time.Second)
	tp.srv.Sweep()
	wantAsleep(t, tp.status(t), "pause", 2*time.Minute) // failed again: the backoff doubled
	if stops() != 2 {
		t.Fatalf("%d stops after the backoff; want 2", stops())
	}

	mu.Lock()
	failing = false
	mu.Unlock()
	tp.clk.add(2 * time.Minute)
	tp.srv.Sweep()
	wantAsleep(t, tp.status(t), "stop", 0)
	if be.startCount() != 1 {
		t.Fatalf("%d starts; a failed stop must never wake the server", be.startCount())
	}
}

func TestTieredFailedStopStillWakesFromThePause(t *testing.T) {
	t.Parallel()
	be := tieredScript(newScriptedUpstream(t))
	be.sleepErr = func(m backend.SleepMode) error {
		if m == backend.SleepStop {
			return errors.New("engine refused the stop")
		}
		return nil
	}
	tp := serveTiered(t, be, proxy.Options{BackoffBase: time.Hour, BackoffMax: time.Hour})
	tp.pauseIdle(t)
	tp.clk.add(tierStopAfter)
	tp.srv.Sweep()
	wantAsleep(t, tp.status(t), "pause", time.Hour)
	// The stop's backoff is not a wake's: a client is served at once.
	if v := connectVersion(t, tp.addr); v != "15-scripted" {
		t.Fatalf("client reached %q", v)
	}
	if st := tp.status(t); st.State != proxy.StateRunning || !strings.Contains(lastEvent(st), "(from pause)") {
		t.Fatalf("state %s, last event %q; want woken from the pause", st.State, lastEvent(st))
	}
}

func TestTieredPinnedProjectIsNotStopped(t *testing.T) {
	t.Parallel()
	be := tieredScript(newScriptedUpstream(t))
	tp := serveTiered(t, be, proxy.Options{})
	tp.pauseIdle(t)
	if err := tp.srv.SetPinned("app", true); err != nil {
		t.Fatal(err)
	}
	tp.clk.add(tierStopAfter)
	tp.srv.Sweep()
	wantAsleep(t, tp.status(t), "pause", 0)
	if got := be.sleepModes(); len(got) != 1 {
		t.Fatalf("sleep calls %v; a pinned project must be left as it is", got)
	}
}

func TestTieredFollowsTheRuntime(t *testing.T) {
	t.Parallel()
	// Found paused at start: paused since now, as far as the steps count.
	u := newScriptedUpstream(t)
	be := &watchingScript{scriptBackend: tieredScript(u), events: make(chan backend.Event)}
	be.set(backend.Status{State: backend.StatePaused, Addr: u.ln.Addr().String(), ID: "run-0"})
	tp := serveTiered(t, be, proxy.Options{})
	wantAsleep(t, tp.status(t), "pause", tierStopAfter)

	// Stopped by hand while paused: nothing left for pgwake to stop.
	tp.clk.add(time.Minute)
	be.set(backend.Status{State: backend.StateStopped, Exit: "exited with code 0"})
	be.events <- backend.Event{Project: "app", State: backend.StateStopped}
	tp.waitFor(t, "the outside stop seen", func(st proxy.Status) bool { return st.Asleep == "stop" })
	tp.clk.add(tierStopAfter)
	tp.srv.Sweep()
	wantAsleep(t, tp.status(t), "stop", 0)
	if got := be.sleepModes(); len(got) != 0 {
		t.Fatalf("sleep calls %v; the server was stopped already", got)
	}
	if v := connectVersion(t, tp.addr); v != "15-scripted" || be.startCount() != 1 {
		t.Fatalf("client reached %q after %d starts; want it started from the stop", v, be.startCount())
	}
}

func TestTieredShutdownStopsThePausedServer(t *testing.T) {
	t.Parallel()
	be := tieredScript(newScriptedUpstream(t))
	tp := serveTiered(t, be, proxy.Options{})
	tp.pauseIdle(t)
	if err := tp.srv.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st, _ := be.Status(t.Context(), backend.Spec{}); st.State != backend.StateStopped {
		t.Fatalf("server %s after shutdown; want stopped", st.State)
	}
}
