package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"

	"github.com/spf13/cobra"
)

func newPsqlCommand(d *deps) *cobra.Command {
	return &cobra.Command{
		Use:   "psql NAME [-- PSQL-ARGS...]",
		Short: "Open psql on a project (waking it if asleep)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 {
				return usageError(errors.New("psql expects a project name"))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := d.client().Project(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			bin, err := exec.LookPath("psql")
			if err != nil {
				return errors.New("psql is not installed (install the PostgreSQL client, e.g. apt-get install postgresql-client or brew install libpq)")
			}
			c := exec.CommandContext(cmd.Context(), bin, append([]string{p.URL}, args[1:]...)...)
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, d.stdout, d.stderr
			if err := c.Run(); err != nil {
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					return &exitError{code: ee.ExitCode(), err: fmt.Errorf("psql exited with status %d", ee.ExitCode())}
				}
				return err
			}
			return nil
		},
	}
}
