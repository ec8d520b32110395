package tui

import (
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"charm.land/bubbles/v2/table"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/pgwake/pgwake/internal/admin"
)

// Column widths, without the table's one-space padding either side.
const (
	wState  = 10 // "◑ stopping"
	wConn   = 4
	wQueue  = 5
	wLat    = 7 // "1.23s", "850ms", "1m05s"
	wRecent = 8 // sparkline of the last wRecent wakes
	wSleeps = 9 // "9m58s", "pinned", "in use"
	minName = 8
	maxName = 28
	pad     = 2
)

// columns fits the table to width: the name takes what the others leave,
// and on a narrow terminal the sparkline, then the queue, give way.
func columns(width int) []table.Column {
	cols := []table.Column{
		{Title: "NAME"}, {Title: "STATE", Width: wState}, {Title: "CONN", Width: wConn},
		{Title: "QUEUE", Width: wQueue}, {Title: "LAST", Width: wLat}, {Title: "P95", Width: wLat},
		{Title: "RECENT", Width: wRecent}, {Title: "SLEEPS IN", Width: wSleeps},
	}
	used := func() int {
		n := pad // the name's padding
		for _, c := range cols[1:] {
			if c.Width > 0 {
				n += c.Width + pad
			}
		}
		return n
	}
	for _, drop := range []int{6, 3} { // RECENT, QUEUE
		if width-used() >= minName {
			break
		}
		cols[drop].Width = 0
	}
	cols[0].Width = min(max(width-used(), minName), maxName)
	return cols
}

// row is one project's table row. The selected row is left unstyled so the
// selection style covers all of it.
func (m Model) row(e entry, selected bool) table.Row {
	p := e.p
	state, spark := stateLabel(p.State), sparkline(p.RecentWakesMS, wRecent)
	if !selected {
		state, spark = m.styles.state(p.State), m.styles.spark.Render(spark)
	}
	return table.Row{
		p.Name,
		state,
		strconv.Itoa(p.Active),
		strconv.Itoa(p.Queued),
		compactLatency(p.LastWakeMS),
		compactLatency(p.P95WakeMS),
		spark,
		m.sleepsIn(e),
	}
}

// sleepsIn is the idle countdown, run on locally from the snapshot's
// sleeps_in_ms; or why there is none.
func (m Model) sleepsIn(e entry) string {
	p := e.p
	switch {
	case p.Pinned:
		return "pinned"
	case p.SleepAfterMS <= 0:
		return "never"
	case p.State == "running" && p.Active > 0:
		return "in use"
	case countingDown(p):
		return formatCountdown(m.remaining(e))
	case stopPending(p):
		return "stop " + coarseCountdown(m.remainingNext(e))
	}
	return "-"
}

// remaining is the time left of e's idle countdown at the model's clock.
func (m Model) remaining(e entry) time.Duration {
	elapsed := max(m.now.Sub(e.at), 0)
	return time.Duration(e.p.SleepsInMS)*time.Millisecond - elapsed
}

// remainingNext is the time left until e's next idle step (next_sleep_ms)
// at the model's clock: for a paused tiered project, its stop.
func (m Model) remainingNext(e entry) time.Duration {
	elapsed := max(m.now.Sub(e.at), 0)
	return time.Duration(e.p.NextSleepMS)*time.Millisecond - elapsed
}

// coarseCountdown is a countdown in at most 3 cells plus its unit's,
// rounded up to its largest unit ("45s", "29m", "2h"), for the table.
func coarseCountdown(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d <= time.Minute:
		return fmt.Sprintf("%ds", (d+time.Second-1)/time.Second)
	case d <= time.Hour:
		return fmt.Sprintf("%dm", (d+time.Minute-1)/time.Minute)
	}
	return fmt.Sprintf("%dh", (d+time.Hour-1)/time.Hour)
}

// compactLatency formats a latency in at most 6 cells.
func compactLatency(ms float64) string {
	switch {
	case ms <= 0:
		return "-"
	case ms < 999.5:
		return fmt.Sprintf("%.0fms", ms)
	case ms < 9995:
		return fmt.Sprintf("%.2fs", ms/1000)
	case ms < 59950:
		return fmt.Sprintf("%.1fs", ms/1000)
	}
	s := int(math.Round(ms / 1000))
	return fmt.Sprintf("%dm%02ds", s/60, s%60)
}

// sparkline draws the last n values as bars, scaled to their maximum.
func sparkline(vals []float64, n int) string {
	if len(vals) == 0 {
		return "-"
	}
	if len(vals) > n {
		vals = vals[len(vals)-n:]
	}
	top := 0.0
	for _, v := range vals {
		top = max(top, v)
	}
	// No full block: bars of adjacent rows would touch and read as one.
	bars := []rune("▁▂▃▄▅▆▇")
	var b strings.Builder
	for _, v := range vals {
		i := 0
		if top > 0 {
			i = int(math.Round(v / top * float64(len(bars)-1)))
		}
		b.WriteRune(bars[min(max(i, 0), len(bars)-1)])
	}
	return b.String()
}

// View implements tea.Model: the whole screen, in the alternate screen.
func (m Model) View() tea.View {
	v := tea.NewView(m.render())
	v.AltScreen = true
	return v
}

// render draws the screen: title, banner, table, detail pane, status line
// and key help, cut to the terminal's size.
func (m Model) render() string {
	if m.width <= 0 || m.height <= 0 {
		return ""
	}
	var parts []string
	parts = append(parts, m.titleView())
	if m.bannerShown() {
		parts = append(parts, m.bannerView())
	}
	tbl := m.table.View()
	parts = append(parts, tbl)
	if h := m.height - m.chromeHeight() - lipgloss.Height(tbl); h >= 3 {
		parts = append(parts, m.detailView(h))
	}
	body := strings.Join(parts, "\n")
	// The status line and key help stay at the bottom.
	if gap := m.height - 2 - lipgloss.Height(body); gap > 0 {
		body += strings.Repeat("\n", gap)
	}
	body += "\n" + m.statusView() + "\n" + m.help.ShortHelpView(m.keys.ShortHelp())
	return fit(body, m.width, m.height)
}

// fit cuts s to width columns and height lines.
func fit(s string, width, height int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > height {
		lines = lines[:height]
	}
	for i, l := range lines {
		if ansi.StringWidth(l) > width {
			lines[i] = ansi.Truncate(l, width, "")
		}
	}
	return strings.Join(lines, "\n")
}

func (m Model) titleView() string {
	left := m.styles.title.Render("pgwake status")
	awake := 0
	for _, e := range m.projects {
		if e.p.State == "running" || e.p.State == "waking" {
			awake++
		}
	}
	right := fmt.Sprintf("%d projects · %d awake", len(m.projects), awake)
	if len(m.projects) == 1 {
		right = fmt.Sprintf("1 project · %d awake", awake)
	}
	if m.filter.Value() != "" {
		right = fmt.Sprintf("%d of %s", len(m.visible), right)
	}
	switch {
	case m.connected:
	case m.connErr == nil:
		right = "connecting…"
	default:
		right = "disconnected"
	}
	right = m.styles.faint.Render(right) + " "
	gap := max(m.width-lipgloss.Width(left)-lipgloss.Width(right), 1)
	return left + strings.Repeat(" ", gap) + right
}

func (m Model) bannerView() string {
	msg := "pgwake is not running — reconnecting…"
	if !notRunning(m.connErr) {
		msg = "cannot reach pgwake (" + sanitize(m.connErr.Error()) + ") — reconnecting…"
	}
	if m.retries > 1 {
		msg += fmt.Sprintf(" (attempt %d)", m.retries)
	}
	return m.styles.banner.Width(m.width).Render(ansi.Truncate(msg, max(m.width-2, 1), "…"))
}

func (m Model) statusView() string {
	switch {
	case m.filtering:
		return m.filter.View()
	case m.flash != "" && m.flashErr:
		return m.styles.flashErr.Render(m.flash)
	case m.flash != "":
		return m.styles.flash.Render(m.flash)
	case m.filter.Value() != "":
		return m.styles.faint.Render("filter: " + m.filter.Value() + "  (/ to edit, esc to clear)")
	}
	return ""
}

// detailView is the pane under the table, height lines tall: key help,
// the selected project, or its log.
func (m Model) detailView(height int) string {
	inner := max(m.width-4, 1) // border and padding
	var title string
	var lines []string
	e, ok := m.projects[m.selected]
	ok = ok && slices.Contains(m.visible, m.selected)
	switch {
	case m.showHelp:
		title = "keys"
		lines = strings.Split(m.help.FullHelpView(m.keys.FullHelp()), "\n")
	case !ok && len(m.projects) == 0 && m.connected:
		title = "no projects"
		lines = []string{"Create one with:  pgwake create NAME"}
	case !ok && len(m.projects) == 0:
		title = "waiting for pgwake"
		lines = []string{"Start it with:  pgwake up -d"}
	case !ok:
		title = "no match"
		lines = []string{"No project matches " + strconv.Quote(m.filter.Value()) + "; esc clears the filter."}
	case m.detail == detailLogs:
		title = e.p.Name + " · log"
		lines = m.logLines()
	default:
		title = e.p.Name
		lines = m.projectLines(e)
	}
	// The pane fits its content, up to height; the log and the help keep
	// their newest or first lines when cut, the project its first ones.
	body := height - 3 // borders and title
	if len(lines) > body {
		if m.detail == detailLogs && !m.showHelp {
			lines = lines[len(lines)-body:]
		} else {
			lines = lines[:body]
		}
	}
	for i, l := range lines {
		lines[i] = ansi.Truncate(l, inner, "…")
	}
	content := m.styles.bold.Render(ansi.Truncate(title, inner, "…"))
	if len(lines) > 0 {
		content += "\n" + strings.Join(lines, "\n")
	}
	height = min(height, max(len(lines)+3, minDetail))
	return m.styles.box.Width(m.width).Height(height).MaxHeight(height).Render(content)
}

func (m Model) logLines() []string {
	switch {
	case m.logs.err != nil:
		return []string{m.styles.errText.Render("logs: " + sanitize(m.logs.err.Error()))}
	case m.logs.loading && len(m.logs.lines) == 0:
		return []string{m.styles.faint.Render("loading the log…")}
	case len(m.logs.lines) == 0:
		return []string{m.styles.faint.Render("(the log is empty)")}
	}
	return m.logs.lines
}

// projectLines describe one project: state, connection string, wakes,
// idle time, last error and recent events, newest last.
func (m Model) projectLines(e entry) []string {
	p := e.p
	label := func(s string) string { return m.styles.label.Render(fmt.Sprintf("%-9s", s)) }

	var meta []string
	meta = append(meta, m.styles.state(p.State))
	if p.Phase != "" {
		meta = append(meta, p.Phase)
	}
	if p.Pinned {
		meta = append(meta, "pinned")
	}
	switch {
	case p.SleepAfterMS > 0 && tiered(p):
		meta = append(meta, "pauses after "+FormatMillis(p.SleepAfterMS)+" idle, stops "+
			shortDuration(time.Duration(p.StopAfterMS)*time.Millisecond)+" later (tiered)")
	case p.SleepAfterMS > 0:
		meta = append(meta, "sleeps after "+FormatMillis(p.SleepAfterMS)+" idle ("+p.SleepMode+")")
	default:
		meta = append(meta, "never sleeps")
	}
	if p.Ephemeral {
		meta = append(meta, "ephemeral")
	}
	lines := []string{
		strings.Join(meta, " · "),
		label("url") + m.connString(p.URL),
		label("port") + m.portLine(p),
		label("image") + p.Image + m.styles.faint.Render(" on "+p.Backend),
	}
	if p.Parent != "" {
		lines = append(lines, label("branch")+"of "+p.Parent+m.styles.faint.Render(", copied "+p.BranchedAt.Local().Format(time.DateTime)))
	}

	wakes := fmt.Sprintf("%d", p.Wakes)
	if p.WakeFailures > 0 {
		wakes += fmt.Sprintf(" (%d failed)", p.WakeFailures)
	}
	if p.Wakes > 0 {
		wakes += fmt.Sprintf(" · last %s · p50 %s · p95 %s · max %s", compactLatency(p.LastWakeMS),
			compactLatency(p.P50WakeMS), compactLatency(p.P95WakeMS), compactLatency(p.MaxWakeMS))
	}
	if p.FirstStartMS > 0 {
		wakes += m.styles.faint.Render(" · first start (initdb) " + compactLatency(p.FirstStartMS) + ", not counted")
	}
	lines = append(lines, label("wakes")+wakes)

	var conns string
	switch {
	case p.Active > 0 && p.Queued > 0:
		conns = fmt.Sprintf("%d open, %d waiting for the wake", p.Active, p.Queued)
	case p.Active > 0:
		conns = fmt.Sprintf("%d open", p.Active)
	case countingDown(p) && tiered(p):
		conns = fmt.Sprintf("none · idle %s · pauses in %s, then stops %s later",
			formatCountdown(time.Duration(p.IdleMS)*time.Millisecond+max(m.now.Sub(e.at), 0)),
			formatCountdown(m.remaining(e)), shortDuration(time.Duration(p.StopAfterMS)*time.Millisecond))
	case countingDown(p):
		conns = fmt.Sprintf("none · idle %s · sleeps in %s",
			formatCountdown(time.Duration(p.IdleMS)*time.Millisecond+max(m.now.Sub(e.at), 0)),
			formatCountdown(m.remaining(e)))
	case stopPending(p) && p.Asleep == "pause":
		conns = "none · paused; stops in " + formatCountdown(m.remainingNext(e))
	case stopPending(p):
		conns = "none · stops in " + formatCountdown(m.remainingNext(e))
	case tiered(p) && p.Asleep == "stop":
		conns = "none · stopped"
	default:
		conns = "none"
	}
	lines = append(lines, label("conns")+conns)

	if p.LastError != "" {
		msg := sanitize(p.LastError)
		if !p.LastErrorAt.IsZero() {
			msg += m.styles.faint.Render(" at " + p.LastErrorAt.Local().Format("15:04:05"))
		}
		if !p.RetryAt.IsZero() {
			if left := p.RetryAt.Sub(m.now); left > 0 {
				msg += m.styles.faint.Render(" · retry in " + formatCountdown(left))
			}
		}
		lines = append(lines, label("error")+m.styles.errText.Render(msg))
	}

	if len(p.Events) > 0 {
		lines = append(lines, "", m.styles.label.Render("recent events"))
		// Newest first, so the pane's cut drops the oldest.
		for i := len(p.Events) - 1; i >= 0; i-- {
			ev := p.Events[i]
			lines = append(lines, m.styles.faint.Render(ev.At.Local().Format("15:04:05"))+"  "+sanitize(ev.Msg))
		}
	}
	return lines
}

// portLine says where the project is reached: its own port (every
// database) and the shared one (as USER.PROJECT).
func (m Model) portLine(p admin.Project) string {
	shared := "shared port as " + p.User + "." + p.Name
	switch {
	case p.Port == 0:
		return shared
	case p.PortError != "":
		return m.styles.errText.Render(strconv.Itoa(p.Port)+" busy") + m.styles.faint.Render(" · "+shared)
	}
	return strconv.Itoa(p.Port) + m.styles.faint.Render(" · every database · or "+shared)
}

// connString is the project's URL with its password hidden unless shown
// with `u`.
func (m Model) connString(raw string) string {
	if m.showPass {
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Redacted()
}
