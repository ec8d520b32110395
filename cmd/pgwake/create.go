package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pgwake/pgwake/internal/admin"
)

func newCreateCommand(d *deps) *cobra.Command {
	var req admin.CreateRequest
	var ephemeral bool
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a project with its own Postgres; prints its connection URL",
		Args:  exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Name = args[0]
			if cmd.Flags().Changed("ephemeral") {
				req.Ephemeral = &ephemeral
			}
			return runCreate(cmd.Context(), d, req)
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Image, "image", "", "Postgres image (default: the image config key)")
	f.StringVar(&req.SleepAfter, "sleep-after", "", "idle time before it sleeps, like 10m; 0 never sleeps (default: sleep_after)")
	f.StringVar(&req.SleepMode, "sleep-mode", "", "stop (frees memory) or pause (wakes in milliseconds) (default: sleep_mode)")
	f.IntVar(&req.Port, "port", 0, "also listen on this port for the project alone (port routing), for clients that cannot choose a database name; within port_range")
	f.BoolVar(&req.PortOutsideRange, "port-outside-range", false, "allow a --port below 1024 or outside port_range")
	f.BoolVar(&ephemeral, "ephemeral", false, "remove the project with its data on pgwake down (default: ephemeral)")
	return cmd
}

func runCreate(ctx context.Context, d *deps, req admin.CreateRequest) error {
	p, err := d.client().Create(ctx, req)
	if err != nil {
		return err
	}
	kind := "project"
	if p.Ephemeral {
		kind = "ephemeral project"
	}
	fmt.Fprintf(d.stderr, "created %s %s (image %s, sleeps after %s idle, mode %s)\n",
		kind, p.Name, p.Image, fmtMS(p.SleepAfterMS), p.SleepMode)
	_, err = fmt.Fprintln(d.stdout, p.URL)
	return err
}
