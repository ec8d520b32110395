package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgwake/pgwake/internal/admin"
)

func newLsCommand(d *deps) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List projects and their state",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ps, err := d.client().Projects(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(d.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(ps)
			}
			return writeTable(d.stdout, ps)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// writeTable prints projects as a plain table.
func writeTable(w io.Writer, ps []admin.Project) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tCONNS\tWAKES\tLAST WAKE\tP95 WAKE\tSLEEPS IN\tIMAGE")
	for _, p := range ps {
		state := p.State
		if p.Pinned {
			state += " (pinned)"
		}
		if p.LastError != "" && !p.RetryAt.IsZero() {
			state += " (backing off)"
		}
		sleeps := "-"
		if p.State == "running" && p.Active == 0 && !p.Pinned && p.SleepAfterMS > 0 {
			sleeps = fmtMS(p.SleepsInMS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", p.Name, state, p.Active, p.Wakes,
			fmtLatency(p.LastWakeMS), fmtLatency(p.P95WakeMS), sleeps, p.Image)
	}
	return tw.Flush()
}

func fmtLatency(ms float64) string {
	if ms == 0 {
		return "-"
	}
	return (time.Duration(ms * float64(time.Millisecond))).Round(time.Millisecond).String()
}

func fmtMS(ms int64) string {
	if ms == 0 {
		return "never"
	}
	return (time.Duration(ms) * time.Millisecond).Round(time.Second).String()
}
