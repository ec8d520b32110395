package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pgwake/pgwake/internal/admin"
)

func newCreateCommand(d *deps) *cobra.Command {
	var req admin.CreateRequest
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a project with its own Postgres; prints its connection URL",
		Args:  exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Name = args[0]
			return runCreate(cmd.Context(), d, req)
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Image, "image", "", "Postgres image (default: the image config key)")
	f.StringVar(&req.SleepAfter, "sleep-after", "", "idle time before it sleeps, like 10m; 0 never sleeps (default: sleep_after)")
	f.StringVar(&req.SleepMode, "sleep-mode", "", "stop (frees memory) or pause (wakes in milliseconds) (default: sleep_mode)")
	return cmd
}

func runCreate(ctx context.Context, d *deps, req admin.CreateRequest) error {
	p, err := d.client().Create(ctx, req)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.stderr, "created project %s (image %s, sleeps after %s idle, mode %s)\n",
		p.Name, p.Image, fmtMS(p.SleepAfterMS), p.SleepMode)
	_, err = fmt.Fprintln(d.stdout, p.URL)
	return err
}
