package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/pgwake/pgwake/internal/tui"
)

// statusOptions are `pgwake status`'s flags.
type statusOptions struct {
	once   bool // print the table once and exit
	asJSON bool // print JSON once and exit
}

func newStatusCommand(d *deps) *cobra.Command {
	var o statusOptions
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Live dashboard of projects: state, connections, cold starts, idle countdown",
		Long: `Show every project live, updated as the daemon reports changes: state,
open and queued connections, last and p95 cold start with a sparkline of
recent wakes, and the idle countdown. The pane below the table shows the
selected project: its connection string, recent events and last error, or
its log.

Keys: ↑/↓ or j/k move, w wake, s sleep, p pin/unpin, l log, u show the
password, / filter by name, esc clear, ? help, q quit.

When stdout is not a terminal, or with --once or --json, it prints the same
data once as a plain table (the one pgwake ls prints) or JSON, and exits.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runStatus(cmd.Context(), d, o)
		},
	}
	cmd.Flags().BoolVar(&o.once, "once", false, "print a plain table once and exit")
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "print JSON once and exit")
	return cmd
}

// runStatus runs the dashboard on a terminal, and prints once otherwise.
func runStatus(ctx context.Context, d *deps, o statusOptions) error {
	if o.once || o.asJSON || !tui.IsInteractive(d.stdout, d.environ) {
		return printProjects(ctx, d, o.asJSON)
	}
	return tui.Run(ctx, d.client(), tui.Options{Output: d.stdout, Environ: d.environ})
}
