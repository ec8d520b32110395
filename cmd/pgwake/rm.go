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
		Long: `Remove a project (its data stays unless --volumes).

A project adopted from an annotated Kubernetes object (pgwake.dev/project)
is only forgotten: pgwake drops its annotation and leaves the object, its
data and its replicas as they are. --volumes is refused for one.`,
		Args: exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, _ := d.client().Project(cmd.Context(), args[0]) // a failure shows in Remove
			if err := d.client().Remove(cmd.Context(), args[0], volumes); err != nil {
				return err
			}
			switch {
			case p.Adopted != "":
				fmt.Fprintf(d.stderr, "forgot project %s: %s is left as it is (pgwake no longer sleeps or wakes it)\n", args[0], p.Adopted)
			case volumes:
				fmt.Fprintf(d.stderr, "removed project %s and its data\n", args[0])
			default:
				fmt.Fprintf(d.stderr, "removed project %s; its data volume is kept (create it again to reuse it)\n", args[0])
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&volumes, "volumes", false, "also delete the project's data")
	return cmd
}
