package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newPinCommand(d *deps) *cobra.Command {
	return &cobra.Command{
		Use:   "pin NAME",
		Short: "Keep a project awake: it is not put to sleep on idle until pgwake unpin",
		Long: `Pin a project: the idle sweep never puts it to sleep (pgwake sleep still
does). Pinning does not wake a sleeping project; its next client or
pgwake wake does. The pin is kept across restarts of pgwake.`,
		Args: exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := d.client().Action(cmd.Context(), args[0], "pin")
			if err != nil {
				return err
			}
			fmt.Fprintf(d.stderr, "%s is pinned: it does not sleep on idle until pgwake unpin %s (now %s)\n", p.Name, p.Name, p.State)
			return nil
		},
	}
}

func newUnpinCommand(d *deps) *cobra.Command {
	return &cobra.Command{
		Use:   "unpin NAME",
		Short: "Let a pinned project sleep on idle again",
		Args:  exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := d.client().Action(cmd.Context(), args[0], "unpin")
			if err != nil {
				return err
			}
			if p.SleepAfterMS == 0 {
				fmt.Fprintf(d.stderr, "%s is unpinned; it never sleeps on idle anyway (sleep_after 0) (now %s)\n", p.Name, p.State)
				return nil
			}
			fmt.Fprintf(d.stderr, "%s is unpinned: it sleeps after %s idle (now %s)\n", p.Name, fmtMS(p.SleepAfterMS), p.State)
			return nil
		},
	}
}
