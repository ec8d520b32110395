package main

import (
	"io"

	"github.com/spf13/cobra"
)

func newLogsCommand(d *deps) *cobra.Command {
	var follow bool
	var tail int
	cmd := &cobra.Command{
		Use:   "logs NAME",
		Short: "Show a project's Postgres server log",
		Args:  exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			rc, err := d.client().Logs(cmd.Context(), args[0], follow, tail)
			if err != nil {
				return err
			}
			defer rc.Close()
			_, err = io.Copy(d.stdout, rc)
			if cmd.Context().Err() != nil {
				return nil // Ctrl-C ends -f
			}
			return err
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep streaming new lines")
	cmd.Flags().IntVar(&tail, "tail", 0, "only the last N lines (0: all)")
	return cmd
}
