package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgwake/pgwake/internal/admin"
)

func newBranchCommand(d *deps) *cobra.Command {
	create := newCreateCommand(d)
	cmd := &cobra.Command{
		Use:   "branch SRC NEW",
		Short: "Create project NEW as a copy of SRC's data now; prints its connection URL",
		Long: `Create project NEW whose data is SRC's at one consistent point in time:
the same as pgwake create NEW --from SRC. NEW is a project of its own: its own
server, port, password and sleep settings (the create flags), --ephemeral
allowed. It runs SRC's image, and has SRC's roles and databases.

SRC may be asleep, awake or busy; its clients see no error, and it is left
as it was. A sleeping SRC stays asleep while its files are copied
(copy-on-write where the filesystem can, cp --reflink=auto; clients that
connect meanwhile wait for the copy); an awake one is copied with
pg_basebackup, serving its clients meanwhile. NEW's server is started once
to give it its own password, then sleeps until its first client.`,
		Args: exactArgs(2, "a source project and a new project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := create.Flags().Set("from", args[0]); err != nil {
				return err
			}
			return create.RunE(cmd, args[1:])
		},
	}
	// The create command's flags, but --from, which SRC gives.
	create.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name != "from" {
			cmd.Flags().AddFlag(f)
		}
	})
	return cmd
}

func newSnapshotCommand(d *deps) *cobra.Command {
	return &cobra.Command{
		Use:   "snapshot NAME [LABEL]",
		Short: "Keep a consistent copy of a project's data (pgwake reset puts it back)",
		Long: `Keep a consistent copy of project NAME's data under LABEL (default: the time,
UTC, like 20261202-153000). A sleeping project stays asleep while its files
are copied; an awake one is copied with pg_basebackup while it serves.
pgwake snapshots NAME lists them; pgwake rm --volumes removes them too.`,
		Args: rangeArgs(1, 2, "a project name and an optional label"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req admin.SnapshotRequest
			if len(args) == 2 {
				req.Label = args[1]
			}
			start := time.Now()
			s, err := d.client().Snapshot(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			fmt.Fprintf(d.stderr, "snapshot %s of %s taken in %s (%s)\n", s.Label, args[0],
				time.Since(start).Round(10*time.Millisecond), fmtBytes(s.Bytes))
			_, err = fmt.Fprintln(d.stdout, s.Label)
			return err
		},
	}
}

func newSnapshotsCommand(d *deps) *cobra.Command {
	var del string
	cmd := &cobra.Command{
		Use:   "snapshots NAME",
		Short: "List a project's snapshots with their sizes, oldest first",
		Args:  exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := d.client()
			if del != "" {
				if err := c.DeleteSnapshot(cmd.Context(), args[0], del); err != nil {
					return err
				}
				fmt.Fprintf(d.stderr, "deleted snapshot %s of %s\n", del, args[0])
				return nil
			}
			snaps, err := c.Snapshots(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if len(snaps) == 0 {
				fmt.Fprintf(d.stderr, "%s has no snapshots: pgwake snapshot %s takes one\n", args[0], args[0])
				return nil
			}
			w := tabwriter.NewWriter(d.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "LABEL\tTAKEN\tSIZE")
			for _, s := range snaps {
				fmt.Fprintf(w, "%s\t%s\t%s\n", s.Label, s.TakenAt.Local().Format(time.DateTime), fmtBytes(s.Bytes))
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&del, "delete", "", "delete the snapshot with this label instead of listing")
	return cmd
}

func newResetCommand(d *deps) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "reset NAME [LABEL]",
		Short: "Put a project's data back to a snapshot (default: the latest)",
		Long: `Put project NAME's data back to snapshot LABEL, or to its latest snapshot.
The server is stopped if it runs and its data replaced; it wakes on the
snapshot's data at the next connect. Clients that connect during the reset
wait for it. A project with open connections is refused (with their count)
unless --force, which ends their sessions with FATAL 57P01 (admin shutdown).`,
		Args: rangeArgs(1, 2, "a project name and an optional snapshot label"),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := admin.ResetRequest{Force: force}
			if len(args) == 2 {
				req.Label = args[1]
			}
			start := time.Now()
			s, err := d.client().Reset(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			fmt.Fprintf(d.stderr, "%s reset to snapshot %s (taken %s) in %s\n", args[0], s.Label,
				s.TakenAt.Local().Format(time.DateTime), time.Since(start).Round(10*time.Millisecond))
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "end open sessions (FATAL 57P01) rather than refuse")
	return cmd
}

// fmtBytes is a size for people: 1.2 GB, 34 MB, 512 kB.
func fmtBytes(n int64) string {
	switch {
	case n <= 0:
		return "size unknown"
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.0f kB", float64(n)/(1<<10))
}
