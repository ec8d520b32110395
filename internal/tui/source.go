// Package tui is `pgwake status`: a live terminal dashboard of a daemon's
// projects, and the plain table and JSON that `pgwake status --once`,
// `--json` and `pgwake ls` print instead when there is no terminal.
//
// The dashboard is a Bubble Tea program. Its Model holds state only; every
// call to the daemon runs in a tea.Cmd that returns a typed message, and the
// event stream is read by a command that is re-armed after each event.
package tui

import (
	"context"
	"io"

	"github.com/pgwake/pgwake/internal/admin"
)

// Source is what the dashboard needs from a daemon. *admin.Client satisfies
// it; tests script their own.
type Source interface {
	// Projects lists every project.
	Projects(ctx context.Context) ([]admin.Project, error)
	// Events streams project snapshots and removals: first every project,
	// then each change. The channel closes when ctx ends or the daemon
	// goes away.
	Events(ctx context.Context) (<-chan admin.StreamEvent, error)
	// Action runs "wake", "sleep", "pin" or "unpin" on a project.
	Action(ctx context.Context, name, action string) (admin.Project, error)
	// Logs returns a project's server log, the last tail lines of it.
	Logs(ctx context.Context, name string, follow bool, tail int) (io.ReadCloser, error)
}

var _ Source = (*admin.Client)(nil)

// Actions the dashboard runs; the admin API's names for them.
const (
	actionWake  = "wake"
	actionSleep = "sleep"
	actionPin   = "pin"
	actionUnpin = "unpin"
)

// Stream event types (admin.StreamEvent.Type).
const (
	eventProject = "project"
	eventRemoved = "removed"
)
