package tui

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/term"
)

// Options configure Run.
type Options struct {
	// Output is the terminal; nothing else may write to it while the
	// dashboard runs.
	Output io.Writer
	// Environ is the environment (TERM, NO_COLOR, COLORTERM...) the
	// program's colour detection reads.
	Environ []string
}

// Run shows the dashboard of src's projects until the user quits or ctx
// ends (which is not an error: the caller's signal handling reports it).
func Run(ctx context.Context, src Source, opts Options) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the commands still waiting on the daemon
	p := tea.NewProgram(New(ctx, src),
		tea.WithContext(ctx),
		tea.WithOutput(opts.Output),
		tea.WithEnvironment(opts.Environ),
	)
	_, err := p.Run()
	if err != nil && (ctx.Err() != nil || errors.Is(err, tea.ErrInterrupted)) {
		return nil // a signal: main reports it with its exit code
	}
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	return nil
}

// IsInteractive reports whether w is a terminal the dashboard can draw on:
// a TTY, and not TERM=dumb.
func IsInteractive(w io.Writer, environ []string) bool {
	f, ok := w.(interface{ Fd() uintptr })
	if !ok || !term.IsTerminal(f.Fd()) {
		return false
	}
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "TERM="); ok && v == "dumb" {
			return false
		}
	}
	return true
}
