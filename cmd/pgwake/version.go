package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pgwake/pgwake/internal/version"
)

func newVersionCommand(d *deps) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print pgwake's version",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := fmt.Fprintln(d.stdout, version.String())
			return err
		},
	}
}
