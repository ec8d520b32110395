package main

import (
	"bufio"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgwake/pgwake/internal/admin"
)

func newPasswdCommand(d *deps) *cobra.Command {
	var fromStdin bool
	cmd := &cobra.Command{
		Use:   "passwd NAME",
		Short: "Change a project's password on its server and in pgwake",
		Long: `Change project NAME's password: a fresh random one, or the first line of
standard input with --password-stdin. The server is woken if it sleeps, and
the role gets the new password; pgwake then keeps it. Clients logging in
with the old password keep working until the server has the new one.
Prints the project's new connection string.

pgwake checks the project user's password itself, before a sleeping
database wakes: change it with this command, not with ALTER ROLE, or
pgwake keeps accepting the old one and cannot log in to the server.`,
		Args: exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req admin.PasswordRequest
			if fromStdin {
				line, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				line = strings.TrimRight(line, "\r\n")
				if err != nil && line == "" {
					return errors.New("--password-stdin: no password on standard input")
				}
				req.Password = line
			}
			p, err := d.client().SetPassword(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			fmt.Fprintf(d.stderr, "%s: password changed\n", args[0])
			_, err = fmt.Fprintln(d.stdout, p.URL)
			return err
		},
	}
	cmd.Flags().BoolVar(&fromStdin, "password-stdin", false, "read the new password from standard input")
	return cmd
}
