package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newWakeCommand(d *deps) *cobra.Command {
	return &cobra.Command{
		Use:   "wake NAME",
		Short: "Wake a project now and wait until it serves",
		Args:  exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := d.client().Action(cmd.Context(), args[0], "wake")
			if err != nil {
				return err
			}
			if p.LastWakeMS == 0 && p.FirstStartMS > 0 {
				fmt.Fprintf(d.stderr, "%s is %s (first start, with initdb, took %s)\n", p.Name, p.State, fmtLatency(p.FirstStartMS))
				return nil
			}
			fmt.Fprintf(d.stderr, "%s is %s (last wake took %s)\n", p.Name, p.State, fmtLatency(p.LastWakeMS))
			return nil
		},
	}
}
