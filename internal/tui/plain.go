package tui

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgwake/pgwake/internal/admin"
)

// WriteTable prints projects as a plain table: no colour, no escape
// sequences, one line per project under a NAME ... header, for scripts and
// CI. `pgwake ls` and `pgwake status --once` print this.
func WriteTable(w io.Writer, ps []admin.Project) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tPORT\tCONNS\tQUEUED\tWAKES\tLAST WAKE\tP95 WAKE\tSLEEPS IN\tBACKEND\tIMAGE")
	for _, p := range ps {
		state := p.State
		if p.Pinned {
			state += " (pinned)"
		}
		if p.LastError != "" && !p.RetryAt.IsZero() {
			state += " (backing off)"
		}
		if p.Phase != "" {
			state += " (" + p.Phase + ")"
		}
		if p.PeersBusy != "" {
			state += " (in use via peers)"
		}
		sleeps := "-"
		switch {
		case countingDown(p) && tiered(p):
			sleeps = "pause " + formatCountdown(time.Duration(p.SleepsInMS)*time.Millisecond) +
				", stop +" + shortDuration(time.Duration(p.StopAfterMS)*time.Millisecond)
		case countingDown(p):
			sleeps = formatCountdown(time.Duration(p.SleepsInMS) * time.Millisecond)
		case stopPending(p):
			sleeps = "stop " + formatCountdown(time.Duration(p.NextSleepMS)*time.Millisecond)
		}
		be := p.Backend
		if be == "" {
			be = "-"
		}
		if p.Adopted != "" {
			be += " (" + p.Adopted + ")"
		}
		if p.Parent != "" {
			be += " (branch of " + p.Parent + ")"
		}
		if p.Auth == "pass-through" {
			// pgwake holds no password: the server authenticates, and a
			// client with a wrong one still wakes it.
			be += " (auth passed through)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", p.Name, state, FormatPort(p), p.Active, p.Queued, p.Wakes,
			lastWake(p), FormatLatency(p.P95WakeMS), sleeps, be, p.Image)
	}
	return tw.Flush()
}

// lastWake is the last wake's latency or, before any wake, the first
// start's (initdb), marked as such: it is not a cold start.
func lastWake(p admin.Project) string {
	if p.LastWakeMS == 0 && p.FirstStartMS > 0 {
		return FormatLatency(p.FirstStartMS) + " (first start)"
	}
	return FormatLatency(p.LastWakeMS)
}

// FormatPort is the project's own port, "busy" after it when another
// program holds it (the project is then reached on the shared port), "-"
// for none.
func FormatPort(p admin.Project) string {
	switch {
	case p.Port == 0:
		return "-"
	case p.PortError != "":
		return strconv.Itoa(p.Port) + " (busy)"
	}
	return strconv.Itoa(p.Port)
}

// WriteJSON prints projects as an indented JSON array of admin.Project.
func WriteJSON(w io.Writer, ps []admin.Project) error {
	if ps == nil {
		ps = []admin.Project{} // [] rather than null for an empty daemon
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(ps)
}

// FormatLatency formats a wake latency to the millisecond ("1.234s"), "-"
// for none.
func FormatLatency(ms float64) string {
	if ms == 0 {
		return "-"
	}
	return (time.Duration(ms * float64(time.Millisecond))).Round(time.Millisecond).String()
}

// FormatMillis formats a duration in milliseconds to the second ("9m58s"),
// "never" for zero (a sleep_after of 0 never sleeps).
func FormatMillis(ms int64) string {
	if ms == 0 {
		return "never"
	}
	return (time.Duration(ms) * time.Millisecond).Round(time.Second).String()
}

// countingDown reports whether p's idle countdown (SleepsInMS) is running:
// awake, no connections, not pinned, and it sleeps at all.
func countingDown(p admin.Project) bool {
	return p.State == "running" && p.Active == 0 && !p.Pinned && p.SleepAfterMS > 0
}

// tiered reports whether p sleeps in two steps: paused after its
// sleep_after, stopped after its stop_after more.
func tiered(p admin.Project) bool { return p.SleepMode == "tiered" && p.StopAfterMS > 0 }

// stopPending reports whether p is a tiered project asleep but not yet
// stopped, whose stop counts down (NextSleepMS). A project backing off
// after failed wakes ("error") counts down too: its server is stopped
// whatever the failed wake left.
func stopPending(p admin.Project) bool {
	return (p.State == "sleeping" || p.State == "error") && tiered(p) && !p.Pinned && p.Asleep != "stop"
}

// shortDuration formats a setting's duration without its zero tail:
// "30m", "1h30m", "45s".
func shortDuration(d time.Duration) string {
	s := d.Round(time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// formatCountdown formats the time left before an idle project sleeps,
// rounded up to the second, so it reads "0s" only once it is due.
func formatCountdown(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return (d + time.Second - 1).Truncate(time.Second).String()
}
