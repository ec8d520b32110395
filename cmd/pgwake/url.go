package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newURLCommand(d *deps) *cobra.Command {
	return &cobra.Command{
		Use:   "url NAME",
		Short: "Print a connection string for a project, through the proxy",
		Args:  exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := d.client().Project(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(d.stdout, p.URL)
			return err
		},
	}
}
