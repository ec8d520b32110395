package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgwake/pgwake/internal/admin"
)

// TestIntegrationTiered: through the daemon, a project created with
// --sleep-mode tiered is paused after its sleep_after and stopped after its
// stop_after, the API and ls show each step, a client finds its data after
// both, and its settings survive a restart.
func TestIntegrationTiered(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.env = append(h.env, "PGWAKE_GRACE_PERIOD=0s")
	h.up(t)
	r := h.run(t, "create", "app", "--sleep-mode", "tiered", "--sleep-after", "2s", "--stop-after", "4s")
	if r.code != 0 || !strings.Contains(r.stderr, "mode tiered: paused, then stopped after 4s") {
		t.Fatalf("create: exit %d, stderr %q", r.code, r.stderr)
	}
	if p := h.mustProject(t, "app"); p.SleepMode != "tiered" || p.StopAfterMS != 4000 {
		t.Fatalf("created: sleep mode %q, stop after %d ms; want tiered, 4000", p.SleepMode, p.StopAfterMS)
	}
	if r := h.fail(t, "create", "bad", "--sleep-mode", "tiered", "--stop-after", "0s"); !strings.Contains(r.stderr, "stop_after") {
		t.Errorf("create --stop-after 0s: %q", r.stderr)
	}
	h.writeNote(t, "app", "before the pause")

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events, err := h.admin().Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The event stream coalesces: a slow reader may see the stop without
	// the pause before it, which the project's events then tell.
	asleep := func(steps ...string) admin.Project {
		t.Helper()
		var got admin.Project
		if !watchProjects(t, events, 2*time.Minute, func(p admin.Project) bool {
			got = p
			return p.Name == "app" && p.State == "sleeping" && slices.Contains(steps, p.Asleep)
		}) {
			t.Fatalf("app not asleep (%s) within 2 minutes; last seen %s, asleep %q", strings.Join(steps, " or "), got.State, got.Asleep)
		}
		return got
	}

	if p := asleep("pause", "stop"); p.Asleep == "pause" {
		if p.NextSleepMS < 0 || p.NextSleepMS > 4000 {
			t.Errorf("paused: next step in %d ms; want the stop within 4 s", p.NextSleepMS)
		}
		// The container is paused and ls shows the stop counting down,
		// unless the stop is done already (a slow machine took 4 s to look).
		stoppedMeanwhile := func() bool { return h.mustProject(t, "app").Asleep == "stop" }
		if c := h.mustContainer(t, "app"); !c.State.Paused && !stoppedMeanwhile() {
			t.Errorf("paused: the container is %s, want paused", c.State.Status)
		}
		if ls := h.ok(t, "ls"); !strings.Contains(ls, " stop ") && !stoppedMeanwhile() {
			t.Errorf("ls while paused lacks the stop's countdown:\n%s", ls)
		}
	}

	p := asleep("stop")
	if p.NextSleepMS != 0 || p.LastError != "" {
		t.Errorf("stopped: next step in %d ms, last error %q; want none", p.NextSleepMS, p.LastError)
	}
	var steps []string
	for _, ev := range p.Events {
		for _, m := range []string{"asleep (pause)", "stopping it", "asleep (stop)"} {
			if strings.Contains(ev.Msg, m) {
				steps = append(steps, m)
			}
		}
	}
	if got := strings.Join(steps, ", "); got != "asleep (pause), stopping it, asleep (stop)" {
		t.Errorf("steps %q; want a pause, then the stop", got)
	}
	if c := h.mustContainer(t, "app"); c.State.Running || c.State.Paused {
		t.Errorf("stopped: the container is %s, want exited", c.State.Status)
	}
	h.wantNotes(t, "app", "before the pause")
	last := h.mustProject(t, "app").Events
	if msg := last[len(last)-1].Msg; !strings.Contains(msg, "(from stop)") {
		t.Errorf("last event %q; want a wake from the stop", msg)
	}

	h.ok(t, "down")
	h.waitLockFree(t)
	h.up(t)
	if p := h.mustProject(t, "app"); p.SleepMode != "tiered" || p.StopAfterMS != 4000 {
		t.Errorf("after a restart: sleep mode %q, stop after %d ms; want tiered, 4000", p.SleepMode, p.StopAfterMS)
	}
	h.ok(t, "down")
}
