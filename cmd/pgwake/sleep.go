package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newSleepCommand(d *deps) *cobra.Command {
	return &cobra.Command{
		Use:   "sleep NAME",
		Short: "Put a project to sleep now (refused while clients are connected)",
		Args:  exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := d.client().Action(cmd.Context(), args[0], "sleep")
			if err != nil {
				return err
			}
			fmt.Fprintf(d.stderr, "%s is %s\n", p.Name, p.State)
			return nil
		},
	}
}
