package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/daemon"
)

func newDownCommand(d *deps) *cobra.Command {
	var timeout time.Duration
	var volumes bool
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Stop pgwake, putting every project to sleep cleanly",
		Long: `Stop pgwake: drain open connections, put every project to sleep with a
fast shutdown, remove ephemeral projects with their data, and exit.
With --volumes every project is removed with its data: everything pgwake
created, and nothing else.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDown(cmd.Context(), d, timeout, volumes)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for pgwake to stop")
	cmd.Flags().BoolVar(&volumes, "volumes", false, "remove every project and its data")
	return cmd
}

func runDown(ctx context.Context, d *deps, timeout time.Duration, volumes bool) error {
	cl := d.client()
	info, err := cl.Info(ctx)
	if errors.Is(err, admin.ErrNotRunning) {
		if !volumes {
			fmt.Fprintln(d.stderr, "pgwake is not running")
			return nil
		}
		// After a crash: remove what it created all the same.
		fmt.Fprintln(d.stderr, "pgwake is not running; removing every project it created, with its data")
		err := daemon.Purge(ctx, d.cfg, d.logger(), daemon.Options{})
		if errors.Is(err, daemon.ErrNothingToPurge) {
			fmt.Fprintln(d.stderr, "nothing to remove:", err)
			return nil
		}
		if err != nil {
			return err
		}
		fmt.Fprintln(d.stderr, "removed everything pgwake created")
		return nil
	}
	if err != nil {
		return err
	}
	if err := cl.Shutdown(ctx, volumes); err != nil {
		return err
	}
	fmt.Fprintf(d.stderr, "stopping pgwake (pid %d): draining connections and putting projects to sleep\n", info.PID)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		// The daemon holds the state dir's lock until its last projects
		// are asleep and it exits.
		if !daemon.Locked(d.cfg.StateDir) {
			fmt.Fprintln(d.stderr, "pgwake stopped")
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgwake (pid %d) did not stop within %s", info.PID, timeout)
		case <-tick.C:
		}
	}
}
