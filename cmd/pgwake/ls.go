package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/pgwake/pgwake/internal/tui"
)

func newLsCommand(d *deps) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List projects and their state",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return printProjects(cmd.Context(), d, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printProjects prints the daemon's projects once, as the plain table or
// JSON; `pgwake ls` and `pgwake status --once/--json` share it.
func printProjects(ctx context.Context, d *deps, asJSON bool) error {
	ps, err := d.client().Projects(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		return tui.WriteJSON(d.stdout, ps)
	}
	return tui.WriteTable(d.stdout, ps)
}

func fmtLatency(ms float64) string { return tui.FormatLatency(ms) }

func fmtMS(ms int64) string { return tui.FormatMillis(ms) }
