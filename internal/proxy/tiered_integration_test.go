package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
)

// TestIntegrationTieredSleep: a tiered project is paused after
// sleep_after, stopped after stop_after more, and a real client wakes it
// from each step with its data intact.
func TestIntegrationTieredSleep(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		if !k.canPause() {
			t.Skipf("the %s backend cannot pause, so it cannot sleep tiered", k.name())
		}
		h := newHarness(t, k, harnessOptions{})
		const name = "tiered"
		spec := h.newSpec(name)
		if err := h.be.Ensure(t.Context(), spec); err != nil {
			t.Fatal(err)
		}
		// No stop within the first step: the client must find it paused.
		// The second step is shortened once the first is proven.
		if err := h.srv.AddProject(t.Context(), proxy.Project{
			Spec: spec, Backend: h.be, SleepMode: backend.SleepTiered,
			SleepAfter: 500 * time.Millisecond, StopAfter: time.Hour,
		}); err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		h.seed(spec, "create table notes(n int); insert into notes values (1)")

		asleep := func(step string) proxy.Status {
			t.Helper()
			return h.waitFor(name, "asleep ("+step+")", 2*time.Minute, func(st proxy.Status) bool {
				return st.State == proxy.StateSleeping && st.Asleep == step
			})
		}
		runtimeState := func() backend.State {
			t.Helper()
			rs, err := h.be.Status(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			return rs.State
		}
		wokeFrom := func(step string) {
			t.Helper()
			st := h.status(name)
			msg := st.Events[len(st.Events)-1].Msg
			if st.State != proxy.StateRunning || !strings.Contains(msg, "(from "+step+")") {
				t.Fatalf("state %s, last event %q; want woken from the %s", st.State, msg, step)
			}
		}

		// Step one: paused after sleep_after, its stop counting down.
		st := asleep("pause")
		if rs := runtimeState(); rs != backend.StatePaused {
			t.Fatalf("the %s runtime reports %s; want paused", k.name(), rs)
		}
		if st.NextSleep <= 0 || st.NextSleep > time.Hour {
			t.Fatalf("paused: next step in %v; want the stop within stop_after (1h)", st.NextSleep)
		}
		conn := h.connect(ctx, spec)
		wantRow(t, conn, int64(1), "select count(*) from notes")
		wokeFrom("pause")
		if _, err := conn.Exec(ctx, "insert into notes values (2)"); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)

		// Step two: paused again, then stopped after stop_after.
		if err := h.srv.SetStopAfter(name, time.Second); err != nil {
			t.Fatal(err)
		}
		st = asleep("stop")
		// Paused first, then stopped (the pause may be over before the
		// test looks: the events tell).
		var steps []string
		for _, ev := range st.Events {
			for _, m := range []string{"asleep (pause)", "stopping it", "asleep (stop)"} {
				if strings.Contains(ev.Msg, m) {
					steps = append(steps, m)
				}
			}
		}
		if got := strings.Join(steps, ", "); !strings.HasSuffix(got, "asleep (pause), stopping it, asleep (stop)") {
			t.Fatalf("steps %q; want a pause, then the stop", got)
		}
		if rs := runtimeState(); rs != backend.StateStopped {
			t.Fatalf("the %s runtime reports %s after the stop; want stopped", k.name(), rs)
		}
		if st.NextSleep != 0 || st.LastError != "" {
			t.Fatalf("stopped: next step in %v, last error %q; want none", st.NextSleep, st.LastError)
		}
		conn = h.connect(ctx, spec)
		wantRow(t, conn, int64(2), "select count(*) from notes")
		wokeFrom("stop")
		wantRow(t, conn, int64(3), "select sum(n) from notes")
	})
}
