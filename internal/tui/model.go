package tui

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	"charm.land/bubbles/v2/table"
	"charm.land/bubbles/v2/textinput"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/pgwake/pgwake/internal/admin"
)

// minDetail is the detail pane's least height, borders included.
const minDetail = 8

// flashFor is how long an action's outcome stays on the status line.
const flashFor = 10 * time.Second

// detailMode is what the detail pane shows.
type detailMode int

const (
	detailEvents detailMode = iota // the project, its recent events and last error
	detailLogs                     // the tail of its server log
)

// entry is a project's latest snapshot and when it arrived, from which the
// idle countdown runs on locally between events.
type entry struct {
	p  admin.Project
	at time.Time
}

// logView is the log tail the detail pane shows in detailLogs mode.
type logView struct {
	name    string
	lines   []string
	err     error
	loading bool
}

// Model is the dashboard's state. It performs no I/O: Init and Update
// return commands (see commands.go) that call the Source and come back as
// messages.
type Model struct {
	ctx context.Context // bounds every command; the program's lifetime
	src Source

	projects map[string]entry
	visible  []string // names in the table: sorted, filtered
	selected string   // the selected project's name, kept across updates

	table  table.Model
	filter textinput.Model
	help   help.Model
	keys   keyMap
	styles styles

	filtering bool // typing into the filter
	showHelp  bool
	showPass  bool // the connection string's password
	detail    detailMode
	logs      logView

	events    <-chan admin.StreamEvent // nil while disconnected
	connected bool
	connErr   error // why the last attempt to reach the daemon failed
	retries   int   // failed attempts since the last success

	flash    string
	flashErr bool
	flashAt  time.Time

	now           time.Time // the last tick: the countdowns' clock
	width, height int
}

// New returns a dashboard of src's projects. Commands run until ctx ends.
func New(ctx context.Context, src Source) Model {
	keys := defaultKeys()
	st := newStyles(colorprofile.TrueColor)
	tbl := table.New(table.WithKeyMap(tableKeys(keys)), table.WithFocused(true), table.WithStyles(st.table))
	fi := textinput.New()
	fi.Prompt = "/"
	fi.Placeholder = "filter by name"
	fs := fi.Styles()
	fs.Cursor.Blink = false
	fi.SetStyles(fs)
	return Model{
		ctx:      ctx,
		src:      src,
		projects: map[string]entry{},
		table:    tbl,
		filter:   fi,
		help:     help.New(),
		keys:     keys,
		styles:   st,
	}
}

// Init connects to the daemon and starts the countdown clock.
func (m Model) Init() tea.Cmd {
	return tea.Batch(connect(m.ctx, m.src, 0), tick())
}

// Update implements tea.Model.
func (m Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
		m.relayout()
		return m, nil

	case tea.ColorProfileMsg:
		m.styles = newStyles(msg.Profile)
		m.table.SetStyles(m.styles.table)
		if msg.Profile <= colorprofile.ASCII {
			m.help.Styles = help.Styles{}
			fs := m.filter.Styles()
			fs.Focused, fs.Blurred = textinput.StyleState{}, textinput.StyleState{}
			fs.Cursor.Color = nil
			m.filter.SetStyles(fs)
		}
		m.relayout()
		return m, nil

	case tickMsg:
		m.now = time.Time(msg)
		if m.flash != "" && m.now.Sub(m.flashAt) > flashFor {
			m.flash = ""
		}
		m.relayout() // the countdowns moved
		return m, tick()

	case connectedMsg:
		m.connected, m.connErr, m.retries = true, nil, 0
		m.events = msg.events
		if msg.at.After(m.now) {
			m.now = msg.at // before the first tick
		}
		m.projects = make(map[string]entry, len(msg.projects))
		for _, p := range msg.projects {
			m.projects[p.Name] = entry{p: p, at: msg.at}
		}
		m.relayout()
		logs := m.refreshLogs() // before m is returned: it updates m
		return m, tea.Batch(waitEvent(m.ctx, m.events), logs)

	case connectFailedMsg:
		m.connected, m.connErr, m.events = false, msg.err, nil
		m.retries++
		m.relayout()
		return m, connect(m.ctx, m.src, backoff(m.retries))

	case streamMsg:
		var cmd tea.Cmd
		switch msg.ev.Type {
		case eventProject:
			m.projects[msg.ev.Project.Name] = entry{p: msg.ev.Project, at: msg.at}
			if msg.ev.Project.Name == m.selected {
				cmd = m.refreshLogs()
			}
		case eventRemoved:
			delete(m.projects, msg.ev.Project.Name)
		}
		m.relayout()
		return m, tea.Batch(waitEvent(m.ctx, m.events), cmd)

	case streamClosedMsg:
		// The daemon went away (or restarts): keep the last snapshot on
		// screen under the banner, and come back when it does.
		m.connected, m.connErr, m.events, m.retries = false, admin.ErrNotRunning, nil, 1
		m.relayout()
		return m, connect(m.ctx, m.src, backoff(m.retries))

	case actionMsg:
		m.setFlash(actionOutcome(msg), msg.err != nil)
		return m, nil

	case logsMsg:
		if m.detail == detailLogs && msg.name == m.logs.name {
			m.logs = logView{name: msg.name, lines: msg.lines, err: msg.err}
		}
		return m, nil

	case tea.KeyPressMsg:
		return m.handleKey(msg)
	}
	if m.filtering { // e.g. the text input's own messages
		var cmd tea.Cmd
		m.filter, cmd = m.filter.Update(msg)
		return m, cmd
	}
	return m, nil
}

func (m Model) handleKey(msg tea.KeyPressMsg) (tea.Model, tea.Cmd) {
	if msg.String() == "ctrl+c" {
		return m, tea.Quit
	}
	if m.filtering {
		return m.handleFilterKey(msg)
	}
	switch {
	case key.Matches(msg, m.keys.Quit):
		return m, tea.Quit
	case key.Matches(msg, m.keys.Help):
		m.showHelp = !m.showHelp
	case key.Matches(msg, m.keys.Filter):
		m.filtering, m.showHelp = true, false
		m.relayout()
		blink := m.filter.Focus()
		return m, blink
	case key.Matches(msg, m.keys.Clear):
		switch {
		case m.showHelp:
			m.showHelp = false
		case m.detail == detailLogs:
			m.detail = detailEvents
		case m.filter.Value() != "":
			m.filter.SetValue("")
			m.relayout()
		}
	case key.Matches(msg, m.keys.Wake):
		return m.act(actionWake)
	case key.Matches(msg, m.keys.Sleep):
		return m.act(actionSleep)
	case key.Matches(msg, m.keys.Pin):
		e, ok := m.projects[m.selected]
		if ok && e.p.Pinned {
			return m.act(actionUnpin)
		}
		return m.act(actionPin)
	case key.Matches(msg, m.keys.Logs):
		if m.detail == detailLogs {
			m.detail = detailEvents
			return m, nil
		}
		m.detail, m.showHelp = detailLogs, false
		m.logs = logView{}
		cmd := m.refreshLogs()
		return m, cmd
	case key.Matches(msg, m.keys.URL):
		m.showPass = !m.showPass
	default:
		return m.navigate(msg)
	}
	return m, nil
}

// handleFilterKey edits the filter: enter keeps it, esc drops it, the
// arrows still move the selection.
func (m Model) handleFilterKey(msg tea.KeyPressMsg) (tea.Model, tea.Cmd) {
	switch msg.String() {
	case "esc":
		m.filter.SetValue("")
		fallthrough
	case "enter":
		m.filtering = false
		m.filter.Blur()
		m.relayout()
		return m, nil
	case "up", "down":
		return m.navigate(msg)
	}
	var cmd tea.Cmd
	m.filter, cmd = m.filter.Update(msg)
	m.relayout()
	return m, cmd
}

// navigate lets the table move its cursor, then follows it.
func (m Model) navigate(msg tea.KeyPressMsg) (tea.Model, tea.Cmd) {
	var cmd tea.Cmd
	m.table, cmd = m.table.Update(msg)
	before := m.selected
	if c := m.table.Cursor(); c >= 0 && c < len(m.visible) {
		m.selected = m.visible[c]
	}
	if m.selected == before {
		return m, cmd
	}
	m.relayout()
	if m.detail == detailLogs {
		m.logs = logView{}
		cmd = tea.Batch(cmd, m.refreshLogs())
	}
	return m, cmd
}

// act starts action on the selected project.
func (m Model) act(action string) (tea.Model, tea.Cmd) {
	if _, ok := m.projects[m.selected]; !ok {
		return m, nil
	}
	if !m.connected {
		m.setFlash(action+" "+m.selected+": not connected to pgwake", true)
		return m, nil
	}
	doing := map[string]string{
		actionWake: "waking", actionSleep: "putting to sleep", actionPin: "pinning", actionUnpin: "unpinning",
	}[action]
	m.setFlash(doing+" "+m.selected+"…", false)
	return m, runAction(m.ctx, m.src, m.selected, action)
}

// refreshLogs fetches the selected project's log when the pane shows it
// and no fetch is under way.
func (m *Model) refreshLogs() tea.Cmd {
	if m.detail != detailLogs || m.selected == "" || !m.connected {
		return nil
	}
	if m.logs.loading && m.logs.name == m.selected {
		return nil
	}
	m.logs.name, m.logs.loading = m.selected, true
	return fetchLogs(m.ctx, m.src, m.selected)
}

func (m *Model) setFlash(s string, isErr bool) {
	m.flash, m.flashErr, m.flashAt = s, isErr, m.now
}

// actionOutcome is the status line after an action.
func actionOutcome(msg actionMsg) string {
	if msg.err != nil {
		return fmt.Sprintf("%s %s: %s", msg.action, msg.name, sanitize(msg.err.Error()))
	}
	switch msg.action {
	case actionWake:
		return fmt.Sprintf("%s is awake (%s)", msg.name, compactLatency(float64(msg.took.Microseconds())/1000))
	case actionSleep:
		return msg.name + " is asleep"
	case actionPin:
		return msg.name + " is pinned: it stays awake"
	case actionUnpin:
		return msg.name + " is unpinned: it sleeps when idle"
	}
	return msg.action + " " + msg.name + ": done"
}

// backoff is the delay before the n-th reconnect attempt.
func backoff(n int) time.Duration {
	d := backoffMin
	for i := 1; i < n && d < backoffMax; i++ {
		d *= 2
	}
	return min(d, backoffMax)
}

// relayout recomputes what depends on the size and the data: the filtered
// rows, the selection, the columns and the table's height.
func (m *Model) relayout() {
	names := make([]string, 0, len(m.projects))
	q := strings.ToLower(m.filter.Value())
	for name := range m.projects {
		if q == "" || strings.Contains(strings.ToLower(name), q) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	m.visible = names

	cursor := slices.Index(names, m.selected)
	if cursor < 0 && len(names) > 0 {
		// The selection went (removed, filtered out): stay at the same
		// place in the list.
		cursor = min(max(m.table.Cursor(), 0), len(names)-1)
		m.selected = names[cursor]
	}

	m.help.SetWidth(m.width)
	m.filter.SetWidth(max(m.width-4, 1))
	cols := columns(m.width)
	rows := make([]table.Row, len(names))
	for i, name := range names {
		rows[i] = m.row(m.projects[name], i == cursor)
	}
	// Every row has a cell for each column; a column too wide for the
	// terminal gets width 0, which the table skips.
	m.table.SetColumns(cols)
	m.table.SetWidth(m.width)
	m.table.SetHeight(m.tableHeight())
	m.table.SetRows(rows)
	if cursor >= 0 {
		// Move, rather than set, so the table scrolls to keep it in view.
		if d := cursor - m.table.Cursor(); d > 0 {
			m.table.MoveDown(d)
		} else if d < 0 {
			m.table.MoveUp(-d)
		}
	}
}

// bannerShown reports whether the disconnected banner is up.
func (m Model) bannerShown() bool { return !m.connected && m.connErr != nil }

// tableHeight is the table's height, header included: every row if there
// is room, leaving the detail pane at least minDetail lines.
func (m Model) tableHeight() int {
	rest := m.height - m.chromeHeight()
	rows := max(len(m.visible), 1)
	return min(rows, max(rest-minDetail, 1)) + 1
}

// chromeHeight is the lines around the table and the detail pane: title,
// banner, status line and key help.
func (m Model) chromeHeight() int {
	h := 3
	if m.bannerShown() {
		h++
	}
	return h
}

// notRunning reports whether err means no daemon answers.
func notRunning(err error) bool { return errors.Is(err, admin.ErrNotRunning) }
