package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newRmCommand(d *deps) *cobra.Command {
	var volumes bool
	cmd := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a project (its data stays unless --volumes)",
		Args:  exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := d.client().Remove(cmd.Context(), args[0], volumes); err != nil {
				return err
			}
			if volumes {
				fmt.Fprintf(d.stderr, "removed project %s and its data\n", args[0])
			} else {
				fmt.Fprintf(d.stderr, "removed project %s; its data volume is kept (create it again to reuse it)\n", args[0])
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&volumes, "volumes", false, "also delete the project's data")
	return cmd
}
