package tui

import (
	"bufio"
	"context"
	"io"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/pgwake/pgwake/internal/admin"
)

// Timeouts of the calls the commands make. A wake includes initdb on a
// project's first start, so it gets long.
const (
	connectTimeout = 10 * time.Second
	actionTimeout  = 3 * time.Minute
	logsTimeout    = 10 * time.Second

	// logLines is how much of a project's log `l` shows.
	logLines = 20
	// maxLogBytes bounds what one log fetch reads.
	maxLogBytes = 256 << 10

	// Reconnect backoff: first retry after backoffMin, doubling to
	// backoffMax.
	backoffMin = 250 * time.Millisecond
	backoffMax = 5 * time.Second
)

// Messages the commands return.
type (
	// connectedMsg: subscribed to the event stream, with the full project
	// list taken right after subscribing.
	connectedMsg struct {
		events   <-chan admin.StreamEvent
		projects []admin.Project
		at       time.Time
	}
	// connectFailedMsg: the daemon could not be reached.
	connectFailedMsg struct{ err error }
	// streamMsg is one event from the stream.
	streamMsg struct {
		ev admin.StreamEvent
		at time.Time
	}
	// streamClosedMsg: the stream ended; the daemon went away.
	streamClosedMsg struct{}
	// tickMsg drives the idle countdowns between events.
	tickMsg time.Time
	// actionMsg is the outcome of a wake, sleep, pin or unpin.
	actionMsg struct {
		name, action string
		took         time.Duration
		err          error
	}
	// logsMsg carries the tail of a project's log.
	logsMsg struct {
		name  string
		lines []string
		err   error
	}
)

// connect subscribes to the event stream after delay, then lists every
// project, so a project removed while we were away disappears even though
// the stream only sends what exists. The stream lives until ctx ends.
func connect(ctx context.Context, src Source, delay time.Duration) tea.Cmd {
	return func() tea.Msg {
		if delay > 0 {
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return nil
			}
		}
		sctx, cancel := context.WithCancel(ctx)
		events, err := src.Events(sctx)
		if err != nil {
			cancel()
			return connectFailedMsg{err}
		}
		lctx, lcancel := context.WithTimeout(sctx, connectTimeout)
		ps, err := src.Projects(lctx)
		lcancel()
		if err != nil {
			cancel() // drop the subscription
			return connectFailedMsg{err}
		}
		// Relay the stream so that the subscription is released when it
		// ends, whichever side ends it.
		out := make(chan admin.StreamEvent)
		go func() {
			defer cancel()
			defer close(out)
			for ev := range events {
				select {
				case out <- ev:
				case <-sctx.Done():
					return
				}
			}
		}()
		return connectedMsg{events: out, projects: ps, at: time.Now()}
	}
}

// waitEvent waits for the next event of the stream; the model re-arms it
// after each one.
func waitEvent(ctx context.Context, events <-chan admin.StreamEvent) tea.Cmd {
	return func() tea.Msg {
		select {
		case ev, ok := <-events:
			if !ok {
				return streamClosedMsg{}
			}
			return streamMsg{ev: ev, at: time.Now()}
		case <-ctx.Done():
			return nil
		}
	}
}

// tick fires once a second.
func tick() tea.Cmd {
	return tea.Tick(time.Second, func(t time.Time) tea.Msg { return tickMsg(t) })
}

// runAction runs a wake, sleep, pin or unpin. The stream shows its effect;
// the message only says how it went.
func runAction(ctx context.Context, src Source, name, action string) tea.Cmd {
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(ctx, actionTimeout)
		defer cancel()
		start := time.Now()
		_, err := src.Action(ctx, name, action)
		return actionMsg{name: name, action: action, took: time.Since(start), err: err}
	}
}

// fetchLogs reads the last logLines lines of a project's log.
func fetchLogs(ctx context.Context, src Source, name string) tea.Cmd {
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(ctx, logsTimeout)
		defer cancel()
		rc, err := src.Logs(ctx, name, false, logLines)
		if err != nil {
			return logsMsg{name: name, err: err}
		}
		defer rc.Close()
		lines, err := lastLines(io.LimitReader(rc, maxLogBytes), logLines)
		return logsMsg{name: name, lines: lines, err: err}
	}
}

// lastLines returns the last n lines of r, made safe to draw: escape
// sequences and control characters removed, tabs expanded.
func lastLines(r io.Reader, n int) ([]string, error) {
	var lines []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLogBytes)
	for sc.Scan() {
		lines = append(lines, sanitize(sc.Text()))
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return lines, sc.Err()
}

// sanitize makes text from outside (log lines, error messages) safe to put
// on the screen: one line, no escape sequences, no control characters.
func sanitize(s string) string {
	s = ansi.Strip(s)
	s = strings.ReplaceAll(s, "\t", "    ")
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}
