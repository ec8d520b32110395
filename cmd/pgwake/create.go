package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/config"
)

type createOptions struct {
	req          admin.CreateRequest
	ephemeral    bool
	showPassword bool
	init         []string // --init PATH: files or folders
	set          []string // --set name=value
}

func newCreateCommand(d *deps) *cobra.Command {
	var o createOptions
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a project with its own Postgres; prints its connection URL",
		Long: `Create a project with its own Postgres server and print its connection URL
through the proxy, without the password unless --show-password (so CI logs do
not get it): pgwake url NAME prints the full URL, eval "$(pgwake env NAME)"
sets PGPASSWORD. The first connect starts the new server for the first time
(initdb), which takes seconds.

--init scripts (.sql, .sql.gz, .sh, or folders of them) run once at that
first start, like the official image's /docker-entrypoint-initdb.d; --set
NAME=VALUE server settings apply at every start (postgres -c). A failing
init script leaves the project in the error state with the script's error:
it is not served, init does not run again, and pgwake rm --volumes NAME is
the way out.

Settings the flags leave out come from this command's own configuration
when it sets them: PGWAKE_IMAGE, PGWAKE_SLEEP_AFTER, PGWAKE_SLEEP_MODE,
PGWAKE_STOP_AFTER, PGWAKE_EPHEMERAL, the same keys in ./pgwake.yaml (or --config), or the
project's entry there; otherwise from the running pgwake's. Settings of the
proxy itself (listen, backend, ...) belong to pgwake up.`,
		Args: exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.req.Name = args[0]
			if cmd.Flags().Changed("ephemeral") {
				o.req.Ephemeral = &o.ephemeral
			}
			return runCreate(cmd.Context(), d, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.req.Image, "image", "", "Postgres image (default: the image config key)")
	f.StringVar(&o.req.SleepAfter, "sleep-after", "", "idle time before it sleeps, like 10m; 0 never sleeps (default: sleep_after)")
	f.StringVar(&o.req.SleepMode, "sleep-mode", "", "stop (frees memory), pause (wakes in milliseconds), or tiered (pause, then stop after --stop-after) (default: sleep_mode)")
	f.StringVar(&o.req.StopAfter, "stop-after", "", "sleep mode tiered: time paused before it is stopped, like 30m (default: stop_after)")
	f.IntVar(&o.req.Port, "port", 0, "the project's own port, where every database of its server is reachable (default: the first free one in port_range)")
	f.BoolVar(&o.req.NoPort, "no-port", false, "no port of its own: reach it on the shared port as USER.PROJECT or by database name")
	f.BoolVar(&o.req.PortOutsideRange, "port-outside-range", false, "allow a --port below 1024 or outside port_range")
	f.BoolVar(&o.ephemeral, "ephemeral", false, "remove the project with its data on pgwake down (default: the ephemeral config key)")
	f.BoolVar(&o.showPassword, "show-password", false, "print the URL with its password")
	f.StringVar(&o.req.From, "from", "", "make it a branch of this project: a copy of its data now (see pgwake branch)")
	f.StringArrayVar(&o.init, "init", nil, "an init script (.sql, .sql.gz, .sh) or a folder of them (lexical order), run once at the first start; repeatable (default: the project's init in pgwake.yaml)")
	f.StringArrayVar(&o.set, "set", nil, "a server setting NAME=VALUE applied at every start, like shared_buffers=256MB; repeatable (adds to the project's settings in pgwake.yaml)")
	return cmd
}

func runCreate(ctx context.Context, d *deps, o createOptions) error {
	req := o.req
	fillCreateRequest(&req, d.cfg)
	if err := fillInitRequest(&req, d.cfg, o.init, o.set); err != nil {
		return err
	}
	if req.From != "" && o.req.Image == "" {
		req.Image = "" // a branch runs its source's image, whatever the config's default
	}
	if err := checkDaemonKeys(ctx, d); err != nil {
		return err
	}
	p, err := d.client().Create(ctx, req)
	if err != nil {
		return err
	}
	if o.showPassword {
		writeMasks(d.stderr, d.environ, urlSecrets(p.URL)...)
	}
	kind := "project"
	if p.Ephemeral {
		kind = "ephemeral project"
	}
	mode := p.SleepMode
	if p.StopAfterMS > 0 {
		mode += ": paused, then stopped after " + fmtMS(p.StopAfterMS)
	}
	fmt.Fprintf(d.stderr, "created %s %s (image %s, sleeps after %s idle, mode %s)\n",
		kind, p.Name, p.Image, fmtMS(p.SleepAfterMS), mode)
	if p.Parent != "" {
		fmt.Fprintf(d.stderr, "its data is a copy of %s's, taken %s\n", p.Parent, p.BranchedAt.Local().Format(time.DateTime))
	} else if p.Backend == "local" {
		fmt.Fprintln(d.stderr, "its data was initialised now (initdb); its first connect starts the server, later wakes too")
	} else {
		fmt.Fprintln(d.stderr, "its first connect starts the server for the first time (initdb for new data): allow a few seconds; later wakes are much faster")
	}
	if len(p.Init) > 0 {
		fmt.Fprintf(d.stderr, "init scripts run once, at its first start: %s\n", strings.Join(p.Init, ", "))
	} else if len(req.Init) > 0 {
		fmt.Fprintln(d.stderr, "init scripts not run: the project reuses data kept by pgwake rm (rm --volumes first for new data)")
	}
	if len(p.Settings) > 0 {
		fmt.Fprintf(d.stderr, "settings at every start: %s\n", fmtSettings(p.Settings))
	}
	u := p.URL
	if !o.showPassword {
		if u, err = withoutPassword(u); err != nil {
			return err
		}
		fmt.Fprintf(d.stderr, "the URL below has no password: pgwake url %s prints it in full, eval \"$(pgwake env %s)\" sets PGPASSWORD\n", p.Name, p.Name)
	}
	_, err = fmt.Fprintln(d.stdout, u)
	return err
}

// fillCreateRequest fills in what the create flags left empty from this
// command's own configuration, where the user set it (cfg.Source says so,
// also for a value equal to the default): a PGWAKE_* variable exported for
// this call or a key in its pgwake.yaml must not give way to the daemon's
// start-up config. The project's entry in pgwake.yaml comes before those,
// as it does when `pgwake up` creates it. What nobody set stays empty: the
// daemon's own defaults apply.
func fillCreateRequest(req *admin.CreateRequest, cfg config.Config) {
	for _, pc := range cfg.Projects {
		if pc.Name != req.Name {
			continue
		}
		if req.Image == "" {
			req.Image = pc.Image
		}
		if req.SleepMode == "" {
			req.SleepMode = pc.SleepMode
		}
		if req.SleepAfter == "" && pc.SleepAfter != nil {
			req.SleepAfter = pc.SleepAfter.String()
		}
		if req.StopAfter == "" && pc.StopAfter != nil {
			req.StopAfter = pc.StopAfter.String()
		}
		if req.Ephemeral == nil && pc.Ephemeral {
			req.Ephemeral = &pc.Ephemeral
		}
	}
	set := func(key string) bool { return cfg.Source(key) != "" }
	if req.Image == "" && set("image") {
		req.Image = cfg.Image
	}
	if req.SleepMode == "" && set("sleep_mode") {
		req.SleepMode = cfg.SleepMode
	}
	if req.SleepAfter == "" && set("sleep_after") {
		req.SleepAfter = cfg.SleepAfter.String()
	}
	if req.StopAfter == "" && set("stop_after") {
		req.StopAfter = cfg.StopAfter.String()
	}
	if req.Ephemeral == nil && set("ephemeral") {
		req.Ephemeral = &cfg.Ephemeral
	}
}

// fillInitRequest adds init scripts and settings to a create request: the
// --init paths (files or folders) if any, else the project's init in
// pgwake.yaml; the project's settings there, with --set NAME=VALUE on top.
// The scripts are read here and travel with the request. Errors are usage
// errors naming the path or setting.
func fillInitRequest(req *admin.CreateRequest, cfg config.Config, initFlags, setFlags []string) error {
	var pc config.ProjectConfig
	for _, c := range cfg.Projects {
		if c.Name == req.Name {
			pc = c
		}
	}
	paths := pc.Init
	if len(initFlags) > 0 {
		var err error
		if paths, err = config.ExpandInit(initFlags); err != nil {
			return usageError(fmt.Errorf("--%w", err))
		}
	}
	if len(paths) > 0 {
		files, err := admin.ReadInitFiles(paths)
		if err != nil {
			return usageError(err)
		}
		req.Init = files
	}
	for k, v := range pc.Settings {
		if req.Settings == nil {
			req.Settings = map[string]string{}
		}
		req.Settings[k] = v
	}
	for _, kv := range setFlags {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return usageError(fmt.Errorf("--set %q: want NAME=VALUE, like work_mem=64MB", kv))
		}
		name, err := config.SettingName(strings.TrimSpace(k))
		if err != nil {
			return usageError(fmt.Errorf("--set: %w", err))
		}
		if req.Settings == nil {
			req.Settings = map[string]string{}
		}
		req.Settings[name] = v
	}
	return nil
}

// fmtSettings shows settings as name=value, sorted.
func fmtSettings(s map[string]string) string {
	names := make([]string, 0, len(s))
	for k := range s {
		names = append(names, k)
	}
	sort.Strings(names)
	for i, k := range names {
		names[i] = k + "=" + s[k]
	}
	return strings.Join(names, " ")
}

// checkDaemonKeys compares what this command's configuration sets for the
// daemon's own keys with what the running daemon uses, where the API tells
// (its listen address, its backend for new projects). A backend that
// differs is refused: the project would live on another backend for good.
// A listen address that differs only gets a warning, since it changes
// nothing for the project.
func checkDaemonKeys(ctx context.Context, d *deps) error {
	backendFrom := d.cfg.Source("backend")
	if d.cfg.Backend == "auto" {
		backendFrom = ""
	}
	listenFrom := d.cfg.Source("listen")
	if backendFrom == "" && listenFrom == "" {
		return nil
	}
	info, err := d.client().Info(ctx)
	if err != nil {
		return err
	}
	if backendFrom != "" && d.cfg.Backend != info.Backend {
		return usageError(fmt.Errorf("backend %s (%s) applies to pgwake up: the running pgwake creates new projects on %s; unset it, or restart pgwake with --backend %s",
			d.cfg.Backend, backendFrom, info.Backend, d.cfg.Backend))
	}
	if listenFrom != "" && !sameListen(d.cfg.Listen, info.Listen) {
		fmt.Fprintf(d.stderr, "pgwake: warning: listen %s (%s) applies to pgwake up only; the running pgwake listens on %s\n",
			d.cfg.Listen, listenFrom, info.Listen)
	}
	return nil
}

// sameListen reports whether a daemon configured to listen on want may be
// the one listening on got: port 0 is any port, an empty or unspecified
// host any address.
func sameListen(want, got string) bool {
	wh, wp, err1 := net.SplitHostPort(want)
	gh, gp, err2 := net.SplitHostPort(got)
	if err1 != nil || err2 != nil {
		return want == got
	}
	if wp != "0" && wp != gp {
		return false
	}
	anyHost := func(h string) bool { ip := net.ParseIP(h); return h == "" || ip != nil && ip.IsUnspecified() }
	if anyHost(wh) || anyHost(gh) {
		return anyHost(wh) && anyHost(gh)
	}
	if wh == "localhost" {
		wh = "127.0.0.1"
	}
	return wh == gh || net.ParseIP(wh).Equal(net.ParseIP(gh))
}

// withoutPassword is a connection URL with its password left out.
func withoutPassword(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("project URL: %w", err)
	}
	if u.User != nil {
		u.User = url.User(u.User.Username())
	}
	return u.String(), nil
}
