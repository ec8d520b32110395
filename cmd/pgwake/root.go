package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/config"
)

// deps are what commands need from the outside world; tests replace them.
type deps struct {
	stdout  io.Writer
	stderr  io.Writer
	environ []string

	// cfg is resolved once, before any command runs.
	cfg config.Config
}

func defaultDeps() *deps {
	return &deps{stdout: os.Stdout, stderr: os.Stderr, environ: os.Environ()}
}

// client returns an admin API client for the configured daemon.
func (d *deps) client() *admin.Client { return admin.NewClient(d.cfg.SocketPath()) }

func (d *deps) logger() *slog.Logger {
	lvl, _ := d.cfg.SlogLevel()
	opts := &slog.HandlerOptions{Level: lvl}
	if d.cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(d.stderr, opts))
	}
	return slog.New(slog.NewTextHandler(d.stderr, opts))
}

func newRootCommand(d *deps) *cobra.Command {
	var configFile string
	root := &cobra.Command{
		Use:   "pgwake",
		Short: "Scale-to-zero Postgres: a real database per project that costs nothing while idle",
		Long: `pgwake gives every project its own PostgreSQL server behind one proxy.
Idle projects sleep; the next client that connects wakes its project and
sees nothing but a slower first connect.

  pgwake up -d --wait        start the proxy in the background
  pgwake create myapp        create a project
  psql "$(pgwake url myapp)" connect (wakes it if asleep)`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// An unknown command is a usage error (exit 2), with suggestions.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			msg := fmt.Sprintf("unknown command %q for pgwake", args[0])
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return usageError(errors.New(msg))
		},
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			src := config.Sources{File: configFile, Environ: d.environ, Flags: cmd.Flags()}
			var cfg config.Config
			var err error
			if daemonOnly[topCommand(cmd)] {
				// The daemon already runs with its own config: a broken
				// file costs these commands a warning, not their use.
				var warning error
				cfg, warning, err = config.LoadWithoutBrokenFile(src)
				if warning != nil {
					fmt.Fprintf(d.stderr, "pgwake: warning: ignoring the config file but for where pgwake runs: %s\n", oneLine(warning))
				}
			} else {
				cfg, err = config.Load(src)
			}
			if err != nil {
				return usageError(err)
			}
			d.cfg = cfg
			return nil
		},
	}
	root.SetOut(d.stdout)
	root.SetErr(d.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	pf := root.PersistentFlags()
	pf.StringVar(&configFile, "config", "", "config file (env "+config.EnvConfigFile+"; default ./"+config.DefaultFile+" if present)")
	config.BindFlags(pf, globalKeys...)

	root.AddCommand(
		newUpCommand(d),
		newDownCommand(d),
		newCreateCommand(d),
		newBranchCommand(d),
		newSnapshotCommand(d), newSnapshotsCommand(d), newResetCommand(d),
		newPasswdCommand(d),
		newRmCommand(d),
		newLsCommand(d),
		newStatusCommand(d),
		newURLCommand(d),
		newEnvCommand(d),
		newTLSCommand(d),
		newPsqlCommand(d),
		newWakeCommand(d),
		newSleepCommand(d),
		newPinCommand(d), newUnpinCommand(d),
		newLogsCommand(d),
		newVersionCommand(d),
		newGenDocsCommand(d),
	)
	return root
}

// daemonOnly are the commands that only talk to a running daemon (or, for
// down, clean up after one): they work with a broken config file.
var daemonOnly = map[string]bool{
	"down": true, "rm": true, "ls": true, "status": true, "url": true, "env": true, "tls": true,
	"psql": true, "wake": true, "sleep": true, "pin": true, "unpin": true, "logs": true, "version": true,
}

// topCommand is the name of the root's subcommand cmd belongs to ("tls"
// for `pgwake tls ca`).
func topCommand(cmd *cobra.Command) string {
	for cmd.HasParent() && cmd.Parent().HasParent() {
		cmd = cmd.Parent()
	}
	return cmd.Name()
}

// oneLine joins a multi-line error (errors.Join) into one line.
func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// globalKeys are the config keys every command takes as flags; `up` takes
// the rest.
var globalKeys = []string{"state_dir", "admin_socket", "log_level", "log_format"}

// exactArgs is cobra.ExactArgs with a usage exit code and a clearer message.
func exactArgs(n int, what string) cobra.PositionalArgs { return rangeArgs(n, n, what) }

// rangeArgs refuses fewer than lo or more than hi arguments with a usage
// error that says what the command expects.
func rangeArgs(lo, hi int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < lo || len(args) > hi {
			return usageError(fmt.Errorf("%s expects %s (see pgwake %s --help)", cmd.CommandPath(), what, cmd.Name()))
		}
		return nil
	}
}
