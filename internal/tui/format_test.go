package tui

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"github.com/pgwake/pgwake/internal/admin"
)

func TestTUIFormat(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ms   float64
		want string
	}{
		{0, "-"}, {0.4, "0ms"}, {12.3, "12ms"}, {999.4, "999ms"}, {999.6, "1.00s"}, {1234, "1.23s"},
		{9994, "9.99s"}, {9996, "10.0s"}, {59_940, "59.9s"}, {59_960, "1m00s"}, {125_000, "2m05s"},
	} {
		if got := compactLatency(c.ms); got != c.want || ansi.StringWidth(got) > wLat {
			t.Errorf("compactLatency(%v) = %q, want %q (at most %d cells)", c.ms, got, c.want, wLat)
		}
	}
	for _, c := range []struct {
		vals []float64
		want string
	}{
		{nil, "-"}, {[]float64{5}, "▇"}, {[]float64{0, 0}, "▁▁"}, {[]float64{100, 50, 0}, "▇▄▁"},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, "▃▃▄▅▅▆▆▇"}, // the last 8
	} {
		if got := sparkline(c.vals, 8); got != c.want {
			t.Errorf("sparkline(%v) = %q, want %q", c.vals, got, c.want)
		}
	}
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"}, {0, "0s"}, {time.Millisecond, "1s"}, {time.Second, "1s"},
		{1500 * time.Millisecond, "2s"}, {10 * time.Minute, "10m0s"},
	} {
		if got := formatCountdown(c.d); got != c.want {
			t.Errorf("formatCountdown(%v) = %q, want %q", c.d, got, c.want)
		}
	}
	var delays []time.Duration
	for n := 1; n <= 7; n++ {
		delays = append(delays, backoff(n))
	}
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	if !equalDurations(delays, want) {
		t.Errorf("backoff 1..7 = %v, want %v", delays, want)
	}
	if got := sanitize("a\tb\x1b[31mred\x1b[0m\r\x07"); got != "a    bred  " {
		t.Errorf("sanitize = %q", got)
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The columns never need more than the terminal's width.
func TestTUIColumns(t *testing.T) {
	t.Parallel()
	for _, w := range []int{40, 60, 66, 76, 80, 100, 200} {
		total := 0
		for _, c := range columns(w) {
			if c.Width > 0 {
				total += c.Width + pad
			}
		}
		if total > w && w >= 60 {
			t.Errorf("width %d: columns take %d", w, total)
		}
	}
	if cols := columns(80); cols[6].Width == 0 || cols[0].Width < 12 {
		t.Errorf("at 80 columns: %+v, want the sparkline and a name of 12 or more", cols)
	}
}

// sgrColor matches an SGR sequence that sets a foreground or background
// colour.
var sgrColor = regexp.MustCompile(`\x1b\[[0-9;]*(3[0-9]|4[0-9]|9[0-7]|10[0-7])[;m]`)

// With no colour to use (NO_COLOR: the program reports the ASCII profile),
// the view has no colour at all, and the states still read apart.
func TestTUINoColor(t *testing.T) {
	t.Parallel()
	m := tea.Model(New(context.Background(), newFakeSource(true)))
	for _, msg := range []tea.Msg{
		tea.WindowSizeMsg{Width: 80, Height: 24},
		tea.ColorProfileMsg{Profile: colorprofile.ASCII},
		connectedMsg{projects: threeProjects(), at: time.Now()},
		tea.KeyPressMsg{Code: '/', Text: "/"},
	} {
		m, _ = m.Update(msg)
	}
	v := m.View().Content
	if loc := sgrColor.FindStringIndex(v); loc != nil {
		t.Errorf("colour in the view under ASCII: %q", v[max(loc[0]-20, 0):min(loc[1]+20, len(v))])
	}
	for _, want := range []string{"○ sleeping", "● running", "✗ error"} {
		if !strings.Contains(ansi.Strip(v), want) {
			t.Errorf("view lacks %q", want)
		}
	}

	// The colour profile, for contrast, does colour the states.
	m, _ = m.Update(tea.ColorProfileMsg{Profile: colorprofile.ANSI256})
	if !sgrColor.MatchString(m.View().Content) {
		t.Error("no colour in the view under ANSI256")
	}
}

func TestTUIPlainTable(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := WriteTable(&b, threeProjects()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.ContainsRune(out, '\x1b') || !strings.HasPrefix(out, "NAME ") || strings.Count(out, "\n") != 4 {
		t.Errorf("plain table:\n%q", out)
	}
	b.Reset()
	if err := WriteJSON(&b, nil); err != nil || b.String() != "[]\n" {
		t.Errorf("WriteJSON(nil) = %q, %v; want []", b.String(), err)
	}
}

func TestTUIFormatTiered(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{30 * time.Minute, "30m"}, {90 * time.Minute, "1h30m"}, {time.Hour, "1h"}, {45 * time.Second, "45s"},
		{90 * time.Second, "1m30s"}, {0, "0s"},
	} {
		if got := shortDuration(c.d); got != c.want {
			t.Errorf("shortDuration(%v) = %q, want %q", c.d, got, c.want)
		}
	}
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"}, {time.Millisecond, "1s"}, {45 * time.Second, "45s"}, {time.Minute, "60s"},
		{61 * time.Second, "2m"}, {29*time.Minute + time.Second, "30m"}, {time.Hour, "60m"}, {90 * time.Minute, "2h"},
	} {
		got := coarseCountdown(c.d)
		if got != c.want || ansi.StringWidth("stop "+got) > wSleeps {
			t.Errorf("coarseCountdown(%v) = %q, want %q (in %d cells after \"stop \")", c.d, got, c.want, wSleeps)
		}
	}
}

// The plain table shows both steps of a tiered project: while it runs
// idle the pause and then the stop, while it is paused the stop.
func TestTUIPlainTableTiered(t *testing.T) {
	t.Parallel()
	idle := admin.Project{Name: "idle", State: "running", SleepMode: "tiered", SleepAfterMS: 10_000,
		StopAfterMS: 1_800_000, SleepsInMS: 4_000, NextSleepMS: 4_000}
	paused := admin.Project{Name: "paused", State: "sleeping", SleepMode: "tiered", SleepAfterMS: 10_000,
		StopAfterMS: 1_800_000, Asleep: "pause", NextSleepMS: 29 * 60_000}
	stopped := admin.Project{Name: "stopped", State: "sleeping", SleepMode: "tiered", SleepAfterMS: 10_000,
		StopAfterMS: 1_800_000, Asleep: "stop"}
	var b bytes.Buffer
	if err := WriteTable(&b, []admin.Project{idle, paused, stopped}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	for i, want := range []string{"pause 4s, stop +30m", "stop 29m0s", ""} {
		line := lines[i+1]
		if want == "" {
			if strings.Contains(line, "stop ") || strings.Contains(line, "pause ") {
				t.Errorf("stopped project's line %q counts down a step", line)
			}
			continue
		}
		if !strings.Contains(line, want) {
			t.Errorf("line %q lacks %q", line, want)
		}
	}
}

func TestTUIPlainTableSaysAuthPassesThrough(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	ps := []admin.Project{{Name: "own", State: "sleeping", Backend: "docker", Auth: "scram"},
		{Name: "adopted", State: "sleeping", Backend: "kubernetes", Adopted: "statefulset/db", Auth: "pass-through"}}
	if err := WriteTable(&b, ps); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if strings.Contains(lines[1], "passed through") || !strings.Contains(lines[2], "(statefulset/db) (auth passed through)") {
		t.Errorf("table:\n%s", b.String())
	}
}
