package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/pgwake/pgwake/internal/certs"
)

func newTLSCommand(d *deps) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tls",
		Short: "TLS helpers",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "ca",
		Short: "Print the path of pgwake's local CA certificate (for sslrootcert)",
		Long: `Print the path of the local CA certificate pgwake generated for its TLS
listener, so clients can verify it:

  psql "host=localhost port=6432 dbname=app sslmode=verify-full sslrootcert=$(pgwake tls ca)"`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := certs.CAPath(d.cfg.StateDir)
			if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("no local CA in %s yet: start pgwake with TLS on (pgwake up --tls on)", certs.Dir(d.cfg.StateDir))
			}
			_, err := fmt.Fprintln(d.stdout, path)
			return err
		},
	})
	return cmd
}
