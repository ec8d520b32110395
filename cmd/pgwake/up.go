package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/daemon"
)

type upOptions struct {
	detach      bool
	wait        bool
	waitTimeout time.Duration
}

func newUpCommand(d *deps) *cobra.Command {
	var o upOptions
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run the pgwake proxy (foreground; -d for background)",
		Long: `Run the pgwake proxy. In the foreground it logs to stderr and stops on
Ctrl-C, putting every project to sleep cleanly. With -d it starts itself in
the background, logging to <state_dir>/pgwake.log, and returns once it
answers, or with the error it stopped on (engine unreachable, port in use,
already running); add --wait to return only once start-up is complete
(declared projects created).`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.detach {
				return runUpDetached(cmd.Context(), d, cmd.Flags(), o)
			}
			if o.wait {
				return usageError(errors.New("--wait goes with -d"))
			}
			if n := daemonProcs(os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0)); n > 0 {
				runtime.GOMAXPROCS(n)
			}
			return daemon.Run(cmd.Context(), d.cfg, d.logger(), daemon.Options{})
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&o.detach, "detach", "d", false, "run in the background")
	f.BoolVar(&o.wait, "wait", false, "with -d: return once start-up is complete (declared projects created)")
	f.DurationVar(&o.waitTimeout, "wait-timeout", 5*time.Minute, "with -d: how long to wait for pgwake to serve (with --wait: and for declared projects, image pulls included)")
	var keys []string
	for _, k := range config.Keys() {
		if !slices.Contains(globalKeys, k.Name) {
			keys = append(keys, k.Name)
		}
	}
	config.BindFlags(f, keys...)
	return cmd
}

// daemonProcs is the GOMAXPROCS `pgwake up` runs with: 0 (leave it) when
// env, the GOMAXPROCS variable, holds a value the runtime honours (a
// positive integer), else a quarter of what Go would use (which already
// honours a container's CPU limit), at least one. The proxy's work is many
// tiny relays, and every extra scheduler thread turns more of them into
// cross-CPU wake-ups: on 2 vCPUs one thread used 10% less CPU per query
// than two and left it to the Postgres servers (bench/README.md). Setting
// it stops Go from following later changes of a container's CPU limit.
func daemonProcs(env string, available int) int {
	if n, err := strconv.Atoi(env); err == nil && n > 0 {
		return 0
	}
	return max(1, available/4)
}

// runUpDetached starts `pgwake up` again as a background process in its own
// session, with the same configuration flags, and waits until it serves
// (its admin API answers; with --wait also its start-up is complete) or
// exits. If it exits, the error it printed is this command's error.
func runUpDetached(ctx context.Context, d *deps, flags *pflag.FlagSet, o upOptions) error {
	cl := d.client()
	if info, err := cl.Info(ctx); err == nil {
		return upAgain(ctx, d, info, o)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	args := []string{"up"}
	flags.Visit(func(f *pflag.Flag) {
		switch f.Name {
		case "detach", "wait", "wait-timeout":
			return
		}
		args = append(args, "--"+f.Name+"="+f.Value.String())
	})
	if err := os.MkdirAll(d.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	logPath := filepath.Join(d.cfg.StateDir, "pgwake.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	defer logf.Close()
	// This start's output begins here; its error is looked for from here.
	offset, err := logf.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	child := exec.Command(exe, args...)
	child.Env = d.environ
	child.Stdout, child.Stderr = logf, logf
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		return fmt.Errorf("start pgwake in the background: %w", err)
	}
	fmt.Fprintf(d.stderr, "pgwake started in the background (pid %d, log %s)\n", child.Process.Pid, logPath)
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()

	// The admin socket offers nothing to wait on before it exists: poll
	// it, and the child's exit, which is an event.
	ctx, cancel := context.WithTimeout(ctx, o.waitTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if info, err := cl.Info(ctx); err == nil && (!o.wait || !info.Starting) {
			fmt.Fprintf(d.stderr, "pgwake is serving on %s (backend %s)\n", info.Listen, info.Backend)
			for _, b := range info.Backends {
				if b.Error != "" {
					fmt.Fprintf(d.stderr, "warning: the %s backend is unavailable; its %d project(s) answer clients with this error until it can be reached: %s\n",
						b.Name, b.Projects, b.Error)
				}
			}
			return nil
		}
		select {
		case err := <-exited:
			return startupError(logPath, offset, err)
		case <-ctx.Done():
			return fmt.Errorf("pgwake did not serve within %s; see %s", o.waitTimeout, logPath)
		case <-tick.C:
		}
	}
}

// upAgain is `up -d` while pgwake already runs: like `docker compose up
// -d`, nothing to do when it runs with this configuration (but create the
// declared projects it lacks), and an error naming what differs when it
// runs with another.
func upAgain(ctx context.Context, d *deps, info admin.Info, o upOptions) error {
	if info.Config == nil {
		fmt.Fprintf(d.stderr, "pgwake: warning: the running pgwake (pid %d, version %s) does not report its configuration; not compared\n", info.PID, info.Version)
	}
	diffs, notes := configDiff(&d.cfg, info.Config)
	if len(diffs) > 0 {
		return fmt.Errorf("pgwake is already running (pid %d) with another configuration: %s; stop it with `pgwake down` to change it",
			info.PID, strings.Join(diffs, "; "))
	}
	for _, n := range notes {
		fmt.Fprintf(d.stderr, "pgwake: warning: %s\n", n)
	}
	cl := d.client()
	ctx, cancel := context.WithTimeout(ctx, o.waitTimeout)
	defer cancel()
	// Its own start-up may still be creating declared projects: creating
	// them here too would race it.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for info.Starting {
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgwake (pid %d) did not finish starting within %s (--wait-timeout)", info.PID, o.waitTimeout)
		case <-tick.C:
		}
		var err error
		if info, err = cl.Info(ctx); err != nil {
			return err
		}
	}
	for _, pc := range d.cfg.Projects {
		if _, err := cl.Project(ctx, pc.Name); !isNotFound(err) {
			continue
		}
		req := admin.CreateRequest{Name: pc.Name}
		fillCreateRequest(&req, d.cfg)
		if err := fillInitRequest(&req, d.cfg, nil, nil); err != nil {
			return fmt.Errorf("declared project %q: %w", pc.Name, err)
		}
		if _, err := cl.Create(ctx, req); err != nil {
			return fmt.Errorf("declared project %q: %w", pc.Name, err)
		}
		fmt.Fprintf(d.stderr, "created declared project %s\n", pc.Name)
	}
	fmt.Fprintf(d.stderr, "pgwake is already running with this configuration (pid %d, serving on %s)\n", info.PID, info.Listen)
	return nil
}

// perProject are the keys that are only defaults for new projects: creates
// from this command send them with each request (see fillCreateRequest),
// so the daemon's own values need not match.
var perProject = map[string]bool{"image": true, "sleep_after": true, "sleep_mode": true, "stop_after": true, "ephemeral": true}

// configDiff lists the keys whose value in cfg differs from the running
// daemon's, each with both values and where cfg's came from; notes are
// differences that change nothing that matters (how it logs).
func configDiff(cfg *config.Config, running map[string]string) (diffs, notes []string) {
	mine := cfg.Effective()
	for _, k := range config.Keys() {
		have, ok := running[k.Name]
		if !ok || have == mine[k.Name] || perProject[k.Name] {
			continue
		}
		from := cfg.Source(k.Name)
		if from == "" {
			from = "default"
		}
		msg := fmt.Sprintf("%s is %q there, %q here (%s)", k.Name, have, mine[k.Name], from)
		if k.Secret {
			msg = fmt.Sprintf("%s differs (%s)", k.Name, from)
		}
		switch k.Name {
		case "log_level", "log_format":
			notes = append(notes, msg+"; the running pgwake keeps its own")
		default:
			diffs = append(diffs, msg)
		}
	}
	return diffs, notes
}

func isNotFound(err error) bool {
	var ae *admin.APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

// startupError is the error a daemon that exited during start-up printed
// (main's "pgwake: ..." line, the last in its log since offset), with its
// exit code; or, if it printed none, how it exited.
func startupError(logPath string, offset int64, exit error) error {
	msg := lastErrorLine(logPath, offset)
	if msg == "" {
		return fmt.Errorf("pgwake exited during start-up (%v); see %s", exit, logPath)
	}
	err := errors.New(msg)
	var ee *exec.ExitError
	if errors.As(exit, &ee) && ee.ExitCode() == 2 {
		return usageError(err)
	}
	return err
}

// lastErrorLine returns the last "pgwake: " line written to the log after
// offset, without the prefix main adds again.
func lastErrorLine(logPath string, offset int64) string {
	f, err := os.Open(logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	last := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if msg, ok := strings.CutPrefix(sc.Text(), "pgwake: "); ok {
			last = msg
		}
	}
	return last
}
