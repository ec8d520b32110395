package tui

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/exp/teatest/v2"

	"github.com/pgwake/pgwake/internal/admin"
)

// These tests run the real Model in a teatest program at 80x24 and drive it
// with keys, against fakeSource: a scripted stand-in for the daemon, so no
// daemon runs here. TestIntegrationStatusTmux in cmd/pgwake drives the
// same dashboard against a real daemon.

// fakeSource is a scripted daemon. It is "up" or "down"; while up, Events
// streams the current projects and then whatever the test sends.
type fakeSource struct {
	mu       sync.Mutex
	up       bool
	projects []admin.Project
	streams  []*fakeStream
	actions  []string // "wake app", in call order
	logTails []int    // the tail of each Logs call
	log      string
}

type fakeStream struct {
	ch   chan admin.StreamEvent
	once sync.Once
}

func (s *fakeStream) close() { s.once.Do(func() { close(s.ch) }) }

var _ Source = (*fakeSource)(nil)

func newFakeSource(up bool, ps ...admin.Project) *fakeSource {
	return &fakeSource{up: up, projects: ps}
}

func errNotRunning() error {
	return fmt.Errorf("%w (no daemon on /tmp/x/pgwake.sock; start it with: pgwake up)", admin.ErrNotRunning)
}

func (f *fakeSource) Projects(ctx context.Context) ([]admin.Project, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.up {
		return nil, errNotRunning()
	}
	return slices.Clone(f.projects), nil
}

func (f *fakeSource) Events(ctx context.Context) (<-chan admin.StreamEvent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.up {
		return nil, errNotRunning()
	}
	s := &fakeStream{ch: make(chan admin.StreamEvent, 64)}
	for _, p := range f.projects {
		s.ch <- admin.StreamEvent{Type: "project", Project: p}
	}
	f.streams = append(f.streams, s)
	go func() {
		<-ctx.Done()
		s.close()
	}()
	return s.ch, nil
}

func (f *fakeSource) Action(ctx context.Context, name, action string) (admin.Project, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actions = append(f.actions, action+" "+name)
	i := slices.IndexFunc(f.projects, func(p admin.Project) bool { return p.Name == name })
	if i < 0 {
		return admin.Project{}, &admin.APIError{Status: 404, Msg: fmt.Sprintf("project %q not found", name)}
	}
	p := &f.projects[i]
	switch action {
	case "wake":
		p.State, p.Wakes, p.LastWakeMS = "running", p.Wakes+1, 1234
		p.RecentWakesMS = append(p.RecentWakesMS, 1234)
	case "sleep":
		if p.Active > 0 {
			return *p, &admin.APIError{Status: 409, Msg: fmt.Sprintf("%s has %d open connections", name, p.Active)}
		}
		p.State = "sleeping"
	case "pin", "unpin":
		p.Pinned = action == "pin"
	}
	f.sendLocked(admin.StreamEvent{Type: "project", Project: *p})
	return *p, nil
}

func (f *fakeSource) Logs(ctx context.Context, name string, follow bool, tail int) (io.ReadCloser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logTails = append(f.logTails, tail)
	lines := strings.Split(strings.TrimSuffix(f.log, "\n"), "\n")
	if tail > 0 && len(lines) > tail {
		lines = lines[len(lines)-tail:]
	}
	return io.NopCloser(strings.NewReader(strings.Join(lines, "\n") + "\n")), nil
}

// send delivers ev to every open stream.
func (f *fakeSource) send(ev admin.StreamEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sendLocked(ev)
}

func (f *fakeSource) sendLocked(ev admin.StreamEvent) {
	for _, s := range f.streams {
		select {
		case s.ch <- ev:
		default: // a closed or abandoned stream; buffers never fill here
		}
	}
	if ev.Type == "removed" {
		f.projects = slices.DeleteFunc(f.projects, func(p admin.Project) bool { return p.Name == ev.Project.Name })
	}
}

// stop takes the daemon away: every stream closes, new calls fail.
func (f *fakeSource) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.up = false
	for _, s := range f.streams {
		s.close()
	}
	f.streams = nil
}

// start brings the daemon back with projects ps.
func (f *fakeSource) start(ps ...admin.Project) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.up, f.projects = true, ps
}

func (f *fakeSource) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.actions)
}

// screen is the last view the program rendered, escape sequences stripped.
type screen struct {
	mu   sync.Mutex
	text string
}

func (s *screen) set(v string) {
	s.mu.Lock()
	s.text = v
	s.mu.Unlock()
}

func (s *screen) get() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.text
}

// probe wraps the Model so the test sees exactly what it renders.
type probe struct {
	m  Model
	sc *screen
}

func (p probe) Init() tea.Cmd { return p.m.Init() }

func (p probe) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	m, cmd := p.m.Update(msg)
	p.m = m.(Model)
	return p, cmd
}

func (p probe) View() tea.View {
	v := p.m.View()
	p.sc.set(ansi.Strip(v.Content))
	return v
}

// harness is one dashboard under test.
type harness struct {
	t   *testing.T
	tm  *teatest.TestModel
	src *fakeSource
	sc  *screen
}

func startTUI(t *testing.T, src *fakeSource, size ...int) *harness {
	t.Helper()
	w, h := 80, 24
	if len(size) == 2 {
		w, h = size[0], size[1]
	}
	ctx, cancel := context.WithCancel(context.Background())
	sc := &screen{}
	tm := teatest.NewTestModel(t, probe{m: New(ctx, src), sc: sc}, teatest.WithInitialTermSize(w, h))
	t.Cleanup(func() {
		_ = tm.Quit()
		tm.WaitFinished(t, teatest.WithFinalTimeout(5*time.Second))
		cancel()
	})
	return &harness{t: t, tm: tm, src: src, sc: sc}
}

// waitFor waits until the rendered screen satisfies cond.
func (h *harness) waitFor(what string, cond func(screen string) bool) string {
	h.t.Helper()
	// Generous: reconnecting backs off up to backoffMax, and a loaded
	// machine is slow; a passing test waits no longer than it must.
	deadline := time.Now().Add(15 * time.Second)
	for {
		s := h.sc.get()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("waiting for %s; the screen is:\n%s", what, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitText waits until every one of texts is on the screen.
func (h *harness) waitText(texts ...string) string {
	h.t.Helper()
	return h.waitFor(fmt.Sprintf("%q", texts), func(s string) bool {
		for _, t := range texts {
			if !strings.Contains(s, t) {
				return false
			}
		}
		return true
	})
}

// waitGone waits until none of texts is on the screen.
func (h *harness) waitGone(texts ...string) string {
	h.t.Helper()
	return h.waitFor(fmt.Sprintf("%q to go", texts), func(s string) bool {
		for _, t := range texts {
			if strings.Contains(s, t) {
				return false
			}
		}
		return true
	})
}

func (h *harness) press(keys ...tea.KeyPressMsg) {
	for _, k := range keys {
		h.tm.Send(k)
	}
}

func keyRune(r rune) tea.KeyPressMsg { return tea.KeyPressMsg{Code: r, Text: string(r)} }

var (
	keyDown  = tea.KeyPressMsg{Code: tea.KeyDown}
	keyUp    = tea.KeyPressMsg{Code: tea.KeyUp}
	keyEnter = tea.KeyPressMsg{Code: tea.KeyEnter}
	keyEsc   = tea.KeyPressMsg{Code: tea.KeyEscape}
	keyCtrlC = tea.KeyPressMsg{Code: 'c', Mod: tea.ModCtrl}
)

func project(name, state string) admin.Project {
	return admin.Project{
		Name: name, State: state, Image: "postgres:17", Backend: "docker",
		SleepAfterMS: 600_000, SleepMode: "stop",
		URL: "postgres://postgres:s3cret@127.0.0.1:6432/" + name + "?sslmode=disable",
	}
}

func threeProjects() []admin.Project {
	alpha := project("alpha", "sleeping")
	alpha.Wakes, alpha.LastWakeMS, alpha.P95WakeMS = 3, 850, 1400
	alpha.RecentWakesMS = []float64{1400, 900, 850}
	alpha.Events = []admin.Event{{At: time.Date(2026, 1, 2, 10, 0, 0, 0, time.Local), Msg: "slept after 10m idle"}}
	beta := project("beta", "running")
	beta.Active, beta.SleepsInMS, beta.IdleMS = 0, 300_000, 300_000
	gamma := project("gamma", "error")
	gamma.LastError = "start container: no such image"
	gamma.RetryAt = time.Now().Add(time.Minute)
	return []admin.Project{alpha, beta, gamma}
}

// The detail pane's url line tells which project is selected.
func selectedURL(name string) string {
	return "url      postgres://postgres:xxxxx@127.0.0.1:6432/" + name + "?"
}

func TestTUINavigation(t *testing.T) {
	t.Parallel()
	h := startTUI(t, newFakeSource(true, threeProjects()...))
	s := h.waitText("alpha", "beta", "gamma", "○ sleeping", "● running", "✗ error", selectedURL("alpha"))
	for _, want := range []string{"NAME", "STATE", "CONN", "LAST", "P95", "SLEEPS IN", "850ms", "1.40s", "▇▅▅", "3 projects · 1 awake"} {
		if !strings.Contains(s, want) {
			t.Errorf("screen lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "s3cret") {
		t.Errorf("the password is on the screen before u:\n%s", s)
	}

	h.press(keyRune('j'))
	h.waitText(selectedURL("beta"), "conns    none · idle ", " · sleeps in ")
	h.press(keyDown)
	h.waitText(selectedURL("gamma"), "error    start container: no such image")
	h.press(keyDown) // already at the bottom
	h.press(keyRune('k'))
	h.waitText(selectedURL("beta"))
	h.press(keyUp)
	h.waitText(selectedURL("alpha"), "recent events", "slept after 10m idle")
	h.press(keyRune('u'))
	h.waitText("postgres://postgres:s3cret@127.0.0.1:6432/alpha")

	h.press(keyRune('q'))
	h.tm.WaitFinished(t, teatest.WithFinalTimeout(5*time.Second))
}

func TestTUIFilter(t *testing.T) {
	t.Parallel()
	h := startTUI(t, newFakeSource(true, threeProjects()...))
	h.waitText("alpha", "beta", "gamma")

	h.press(keyRune('/'))
	h.tm.Type("GA")
	s := h.waitText("/GA", "1 of 3 projects", selectedURL("gamma"))
	if strings.Contains(s, "alpha") || strings.Contains(s, "beta") {
		t.Errorf("filter GA still shows alpha or beta:\n%s", s)
	}
	h.press(keyEnter)
	h.waitText("filter: GA")
	h.press(keyRune('w')) // keys act again once the filter is set
	h.waitText("gamma is awake")

	h.press(keyRune('/'))
	h.tm.Type("zzz")
	h.waitText("No project matches \"GAzzz\"")
	h.press(keyEsc)
	h.waitText("alpha", "beta", "gamma", "3 projects")
	if got := h.src.calls(); !slices.Equal(got, []string{"wake gamma"}) {
		t.Errorf("actions = %q, want [wake gamma]", got)
	}
}

func TestTUIHelp(t *testing.T) {
	t.Parallel()
	h := startTUI(t, newFakeSource(true, threeProjects()...))
	s := h.waitText("alpha", "q quit", "? help")
	if strings.Contains(s, "show/hide password") {
		t.Fatalf("full help shown before ?:\n%s", s)
	}
	h.press(keyRune('?'))
	h.waitText("keys", "show/hide password", "pin/unpin", "G/end", "clear filter")
	h.press(keyRune('?'))
	h.waitGone("show/hide password")
	h.press(keyRune('?'))
	h.waitText("show/hide password")
	h.press(keyEsc)
	h.waitGone("show/hide password")
}

func TestTUIDisconnected(t *testing.T) {
	t.Parallel()
	const banner = "pgwake is not running — reconnecting…"
	src := newFakeSource(false)
	h := startTUI(t, src)
	h.waitText(banner, "disconnected", "pgwake up")

	src.start(threeProjects()...)
	s := h.waitText("alpha", "beta", "gamma", "3 projects")
	if strings.Contains(s, banner) {
		t.Errorf("banner still up after connecting:\n%s", s)
	}

	// The daemon goes away: the last snapshot stays under the banner.
	src.stop()
	h.waitText(banner, "disconnected", "alpha", "gamma")
	h.press(keyRune('w'))
	h.waitText("wake alpha: not connected to pgwake")

	// It comes back with other projects: gone ones disappear.
	delta := project("delta", "running")
	src.start(delta)
	s = h.waitText("delta", "1 project · 1 awake")
	if strings.Contains(s, banner) {
		t.Errorf("banner still up after reconnecting:\n%s", s)
	}
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, " alpha ") || strings.HasPrefix(l, " gamma ") {
			t.Errorf("after reconnecting, a project the daemon no longer has is still in the table:\n%s", s)
		}
	}
	if got := src.calls(); len(got) != 0 {
		t.Errorf("actions while disconnected reached the daemon: %q", got)
	}
}

func TestTUIWake(t *testing.T) {
	t.Parallel()
	src := newFakeSource(true, threeProjects()...)
	h := startTUI(t, src)
	h.waitText(selectedURL("alpha"), "○ sleeping")

	h.press(keyRune('w'))
	h.waitText("alpha is awake", "● running", "2 awake", "1.23s")
	if got := src.calls(); !slices.Equal(got, []string{"wake alpha"}) {
		t.Errorf("actions = %q, want [wake alpha]", got)
	}
}

func TestTUIActions(t *testing.T) {
	t.Parallel()
	ps := threeProjects()
	ps[1].Active = 2
	src := newFakeSource(true, ps...)
	h := startTUI(t, src)
	h.waitText(selectedURL("alpha"))

	h.press(keyRune('p'))
	h.waitText("alpha is pinned", "· pinned")
	h.press(keyRune('p'))
	h.waitText("alpha is unpinned")
	h.press(keyRune('j'), keyRune('s'))
	h.waitText("sleep beta: beta has 2 open connections", "in use")
	h.press(keyRune('k'), keyRune('s'))
	h.waitText("alpha is asleep")
	want := []string{"pin alpha", "unpin alpha", "sleep beta", "sleep alpha"}
	if got := src.calls(); !slices.Equal(got, want) {
		t.Errorf("actions = %q, want %q", got, want)
	}
}

func TestTUILogs(t *testing.T) {
	t.Parallel()
	src := newFakeSource(true, threeProjects()...)
	var log strings.Builder
	for i := 1; i <= 50; i++ {
		fmt.Fprintf(&log, "2026-01-02 10:00:%02d UTC LOG:  line %d\x1b[31m\tred\n", i%60, i)
	}
	src.log = log.String()
	h := startTUI(t, src)
	h.waitText(selectedURL("alpha"))

	h.press(keyRune('l'))
	s := h.waitText("alpha · log", "line 50    red")
	if strings.Contains(s, "line 30 ") {
		t.Errorf("more than 20 lines of log:\n%s", s)
	}
	h.press(keyRune('j'))
	h.waitText("beta · log")
	h.press(keyRune('l'))
	h.waitText(selectedURL("beta"))
	src.mu.Lock()
	defer src.mu.Unlock()
	for _, tail := range src.logTails {
		if tail != 20 {
			t.Errorf("Logs called with tail %d, want 20", tail)
		}
	}
}

func TestTUICountdown(t *testing.T) {
	t.Parallel()
	p := project("app", "running")
	p.SleepsInMS = 90_000
	h := startTUI(t, newFakeSource(true, p))
	h.waitText("sleeps in 1m30s")
	// The 1s tick counts down, with no event from the daemon. (Any value
	// below 1m30s will do: a loaded machine may not look within a second.)
	re := regexp.MustCompile(`sleeps in (\S+)`)
	h.waitFor("the countdown to move", func(s string) bool {
		m := re.FindStringSubmatch(s)
		if m == nil {
			return false
		}
		d, err := time.ParseDuration(m[1])
		return err == nil && d > 0 && d < 90*time.Second && strings.Contains(s, " "+m[1]+" ")
	})
	p.SleepsInMS, p.Active = 0, 1
	h.src.send(admin.StreamEvent{Type: "project", Project: p})
	h.waitText("in use")
}

// A tiered project's countdown shows both steps: the pause and the stop
// after it while it runs idle, then the stop while it is paused.
func TestTUICountdownTiered(t *testing.T) {
	t.Parallel()
	p := project("app", "running")
	p.SleepMode, p.SleepAfterMS, p.StopAfterMS = "tiered", 10_000, 1_800_000
	p.SleepsInMS, p.NextSleepMS = 4_000, 4_000
	h := startTUI(t, newFakeSource(true, p))
	// The countdowns run on with the 1s tick: any value of them will do.
	h.waitText("pauses after 10s idle, stops 30m later (tiered)", "then stops 30m later")
	if s := h.waitText("then stops 30m later"); !regexp.MustCompile(`pauses in [0-4]s, then stops 30m later`).MatchString(s) {
		t.Errorf("running idle, the countdown does not show the pause:\n%s", s)
	}

	p.State, p.Asleep, p.SleepsInMS, p.NextSleepMS = "sleeping", "pause", 0, 29*60_000
	h.src.send(admin.StreamEvent{Type: "project", Project: p})
	s := h.waitText("paused; stops in 2", "stop 29m")
	if !regexp.MustCompile(`paused; stops in 2[89]m`).MatchString(s) {
		t.Errorf("paused, the countdown does not show the stop:\n%s", s)
	}

	p.Asleep, p.NextSleepMS = "stop", 0
	h.src.send(admin.StreamEvent{Type: "project", Project: p})
	h.waitText("conns    none · stopped")
}

// A branch's detail pane names its parent and when it was copied.
func TestTUIBranchParent(t *testing.T) {
	t.Parallel()
	p := project("job1", "sleeping")
	p.Parent, p.BranchedAt = "seed", time.Date(2026, 12, 2, 13, 0, 0, 0, time.Local)
	h := startTUI(t, newFakeSource(true, p))
	h.waitText("branch   of seed, copied 2026-12-02 13:00:00")
}

func TestTUIRemoved(t *testing.T) {
	t.Parallel()
	src := newFakeSource(true, threeProjects()...)
	h := startTUI(t, src)
	h.waitText(selectedURL("alpha"))
	src.send(admin.StreamEvent{Type: "removed", Project: admin.Project{Name: "alpha"}})
	s := h.waitText(selectedURL("beta"), "2 projects")
	if strings.Contains(s, "alpha") {
		t.Errorf("removed project still shown:\n%s", s)
	}
}

func TestTUIResize(t *testing.T) {
	t.Parallel()
	var many []admin.Project
	for i := range 30 {
		many = append(many, project(fmt.Sprintf("project-%02d", i), "sleeping"))
	}
	h := startTUI(t, newFakeSource(true, many...))
	check := func(w, hgt int, want ...string) {
		t.Helper()
		s := h.waitFor(fmt.Sprintf("a %dx%d screen", w, hgt), func(s string) bool {
			lines := strings.Split(s, "\n")
			for _, l := range lines {
				if ansi.StringWidth(l) > w {
					return false
				}
			}
			for _, x := range want {
				if row, ok := strings.CutPrefix(x, "^"); ok { // a table row
					if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, row) }) {
						return false
					}
				} else if !strings.Contains(s, x) {
					return false
				}
			}
			return len(lines) <= hgt
		})
		if n := len(strings.Split(s, "\n")); n != hgt {
			t.Errorf("%dx%d: %d lines, want the whole screen:\n%s", w, hgt, n, s)
		}
	}
	check(80, 24, "RECENT", "q quit", "^ project-00 ")
	h.tm.Send(tea.WindowSizeMsg{Width: 60, Height: 15})
	check(60, 15, "SLEEPS IN")
	h.tm.Send(tea.WindowSizeMsg{Width: 120, Height: 40})
	check(120, 40, "RECENT", "project-00")
	// Moving past the screen's rows scrolls the table.
	h.tm.Send(tea.WindowSizeMsg{Width: 80, Height: 24})
	h.press(keyRune('G'))
	check(80, 24, "^ project-29 ", selectedURL("project-29"))
	h.press(keyUp, keyUp)
	check(80, 24, "^ project-27 ", selectedURL("project-27"))
	h.press(keyRune('g'))
	check(80, 24, "^ project-00 ", selectedURL("project-00"))
}

func TestTUIQuitCtrlC(t *testing.T) {
	t.Parallel()
	h := startTUI(t, newFakeSource(true, threeProjects()...))
	h.waitText("alpha")
	h.press(keyRune('/'), keyCtrlC) // even while typing a filter
	h.tm.WaitFinished(t, teatest.WithFinalTimeout(5*time.Second))
}
