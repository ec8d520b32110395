// Package daemon wires pgwake together: state, backend, proxy and admin API.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/certs"
	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/metrics"
	"github.com/pgwake/pgwake/internal/proxy"
	"github.com/pgwake/pgwake/internal/state"
	"github.com/pgwake/pgwake/internal/version"
)

// Daemon is a running pgwake.
type Daemon struct {
	cfg   config.Config
	log   *slog.Logger
	store *state.Store
	be    backend.Backend
	srv   *proxy.Server
	ln    net.Listener

	hub     *hub
	metrics *metrics.Metrics
	tls     *tls.Config

	// serveCtx ends when the daemon stops serving; per-project listeners
	// (port routing) run on it.
	serveCtx context.Context
	portMu   sync.Mutex
	portLns  map[string]net.Listener

	shutdownOnce    sync.Once
	shutdownCh      chan struct{}
	shutdownVolumes bool // written before shutdownCh is closed
}

// ErrAlreadyRunning is returned when another daemon owns the admin socket.
var ErrAlreadyRunning = errors.New("pgwake is already running")

// NewBackend connects a backend; tests may replace SelectBackend with it.
type NewBackend func(ctx context.Context, cfg config.Config, instance string, log *slog.Logger) (backend.Backend, string, error)

// Options are Run's inputs beyond the config.
type Options struct {
	NewBackend NewBackend
	// Ready, if set, is called once the proxy and admin API accept
	// connections.
	Ready func(proxyAddr string)
	// SweepInterval overrides the idle sweep period (tests).
	SweepInterval time.Duration
}

// Run starts pgwake and blocks until ctx ends or a shutdown is requested
// over the admin API; then it drains connections and puts every project to
// sleep.
func Run(ctx context.Context, cfg config.Config, log *slog.Logger, opts Options) error {
	if opts.NewBackend == nil {
		opts.NewBackend = SelectBackend
	}
	log.Info("starting pgwake", append([]any{"version", version.Version, "gomaxprocs", runtime.GOMAXPROCS(0)}, cfg.LogAttrs()...)...)

	store, err := state.Open(cfg.StateDir)
	if err != nil {
		return err
	}
	sock := cfg.SocketPath()
	unlock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return err
	}
	defer unlock()
	if err := admin.NewClient(sock).Healthy(ctx); err == nil {
		return fmt.Errorf("%w (admin socket %s)", ErrAlreadyRunning, sock)
	}

	be, reason, err := opts.NewBackend(ctx, cfg, store.Instance(), log)
	if err != nil {
		return err
	}
	defer be.Close()
	log.Info("backend selected", "backend", be.Name(), "why", reason)

	var tlsConf *tls.Config
	if cfg.TLSOn() {
		host, _, _ := net.SplitHostPort(cfg.Listen)
		hostname, _ := os.Hostname()
		tlsConf, err = certs.ServerConfig(cfg.StateDir, cfg.TLS.Cert, cfg.TLS.Key, []string{host, hostname}, time.Now())
		if err != nil {
			return err
		}
		if cfg.TLS.Cert != "" {
			log.Info("TLS on", "cert", cfg.TLS.Cert)
		} else {
			log.Info("TLS on with the local CA; verify clients against it", "ca", certs.CAPath(cfg.StateDir))
		}
	}

	var upstreamTLS *tls.Config
	if cfg.TLS.Upstream == "require" {
		if upstreamTLS, err = certs.UpstreamConfig(cfg.TLS.UpstreamCA); err != nil {
			return err
		}
	}

	d := &Daemon{cfg: cfg, log: log, store: store, be: be, shutdownCh: make(chan struct{}), hub: newHub(), tls: tlsConf}
	d.metrics = metrics.New(d.Projects)
	d.srv, err = proxy.New(proxy.Options{
		OnChange:   d.hub.changed,
		OnWake:     d.metrics.ObserveWake,
		OnConnDone: d.metrics.ConnDone,
		OnRefused: func(project, code string) {
			_, err := d.store.Get(project)
			d.metrics.Refused(project, code, err == nil)
		},
		Backend:         be,
		Logger:          log,
		WakeTimeout:     cfg.WakeTimeout,
		StartupTimeout:  cfg.StartupTimeout,
		GracePeriod:     cfg.GracePeriod,
		SweepInterval:   opts.SweepInterval,
		MaxConns:        cfg.MaxConnections,
		MaxProjectConns: cfg.MaxProjectConnections,
		TLS:             tlsConf,
		UpstreamTLS:     upstreamTLS,
	})
	if err != nil {
		return err
	}
	for _, p := range store.Projects() {
		if err := d.srv.AddProject(ctx, d.proxyProject(p)); err != nil {
			return err
		}
	}

	d.ln, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen for clients: %w", err)
	}
	// Remove a stale socket from a crashed daemon; the health check above
	// proved nobody answers on it.
	_ = os.Remove(sock)
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		d.ln.Close()
		return fmt.Errorf("admin socket dir: %w", err)
	}
	aln, err := net.Listen("unix", sock)
	if err != nil {
		d.ln.Close()
		return fmt.Errorf("listen on admin socket: %w", err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		aln.Close()
		d.ln.Close()
		return fmt.Errorf("admin socket: %w", err)
	}
	defer os.Remove(sock)
	// Per-project listeners run on serveCtx; it must exist before the admin
	// API can create a project with a port.
	serveCtx, stopServing := context.WithCancel(context.Background())
	defer stopServing()
	d.serveCtx = serveCtx
	handler := d.handler()
	// Requests run on apiCtx, cancelled at shutdown so open event streams
	// end instead of holding the HTTP shutdown up.
	apiCtx, cancelAPI := context.WithCancel(context.Background())
	defer cancelAPI()
	baseCtx := func(net.Listener) context.Context { return apiCtx }
	hs := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, BaseContext: baseCtx}
	go hs.Serve(aln)
	if cfg.AdminListen != "" {
		tln, err := net.Listen("tcp", cfg.AdminListen)
		if err != nil {
			aln.Close()
			d.ln.Close()
			return fmt.Errorf("admin listen: %w", err)
		}
		ths := &http.Server{Handler: admin.RequireToken(cfg.AdminToken, handler), ReadHeaderTimeout: 10 * time.Second, BaseContext: baseCtx}
		go ths.Serve(tln)
		defer ths.Close()
		log.Info("admin API and metrics on TCP", "addr", tln.Addr().String(), "token_required", cfg.AdminToken != "")
	}

	serveDone := make(chan error, 1)
	go func() { serveDone <- d.srv.Serve(serveCtx, d.ln) }()
	for _, p := range store.Projects() {
		if err := d.listenProjectPort(p); err != nil {
			log.Error("project port", "project", p.Name, "err", err)
		}
	}

	if err := d.createDeclared(ctx); err != nil {
		log.Error("creating declared projects", "err", err)
		d.Shutdown(false)
	}
	log.Info("pgwake is serving", "listen", d.ln.Addr().String(), "admin", sock,
		"backend", be.Name(), "projects", len(store.Projects()))
	if opts.Ready != nil {
		opts.Ready(d.ln.Addr().String())
	}

	select {
	case <-ctx.Done():
	case <-d.shutdownCh:
	}
	log.Info("shutting down: draining connections, then putting projects to sleep",
		"drain_timeout", cfg.ShutdownTimeout)
	stopServing()
	<-serveDone
	dctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	err = d.srv.Shutdown(dctx)
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer rcancel()
	if rerr := d.removeOnShutdown(rctx, d.shutdownVolumes); rerr != nil {
		err = errors.Join(err, rerr)
	}
	cancelAPI()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = hs.Shutdown(sctx)
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("pgwake stopped")
	return nil
}

func spec(p state.Project) backend.Spec {
	return backend.Spec{Name: p.Name, Image: p.Image, User: p.User, Password: p.Password, Database: p.Database}
}

func (d *Daemon) proxyProject(p state.Project) proxy.Project {
	return proxy.Project{
		Spec: spec(p), SleepAfter: p.SleepAfter,
		SleepMode: backend.SleepMode(p.SleepMode), Pinned: p.Pinned,
	}
}

// listenProjectPort opens a project's dedicated port (port routing), on
// the proxy's listen host.
func (d *Daemon) listenProjectPort(p state.Project) error {
	if p.Port == 0 {
		return nil
	}
	host, _, _ := net.SplitHostPort(d.cfg.Listen)
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p.Port)))
	if err != nil {
		return fmt.Errorf("listen on port %d for project %q: %w", p.Port, p.Name, err)
	}
	d.portMu.Lock()
	if d.portLns == nil {
		d.portLns = map[string]net.Listener{}
	}
	d.portLns[p.Name] = ln
	d.portMu.Unlock()
	go d.srv.ServeProject(d.serveCtx, ln, p.Name)
	d.log.Info("project port", "project", p.Name, "listen", ln.Addr().String())
	return nil
}

func (d *Daemon) closeProjectPort(name string) {
	d.portMu.Lock()
	ln := d.portLns[name]
	delete(d.portLns, name)
	d.portMu.Unlock()
	if ln != nil {
		ln.Close()
	}
}

// handler is the admin API plus /metrics.
func (d *Daemon) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", d.metrics.Handler())
	mux.Handle("/", admin.Handler(d))
	return mux
}

// Ready implements admin.Service: listening, and the backend answers.
func (d *Daemon) Ready(ctx context.Context) error {
	if c, ok := d.be.(backend.Checker); ok {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return c.Check(ctx)
	}
	return nil
}

// Info implements admin.Service.
func (d *Daemon) Info() admin.Info {
	return admin.Info{
		Version: version.Version, PID: os.Getpid(), Listen: d.ln.Addr().String(),
		Backend: d.be.Name(), StateDir: d.cfg.StateDir,
	}
}

// URL is a connection string for a project through the proxy.
func (d *Daemon) URL(p state.Project) string {
	host, port, _ := net.SplitHostPort(d.ln.Addr().String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	if p.Port != 0 {
		port = strconv.Itoa(p.Port)
	}
	q := url.Values{"sslmode": {"disable"}}
	switch {
	case d.tls != nil && d.cfg.TLS.Cert == "":
		q = url.Values{"sslmode": {"verify-full"}, "sslrootcert": {certs.CAPath(d.cfg.StateDir)}}
	case d.tls != nil:
		q = url.Values{"sslmode": {"require"}}
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(p.User, p.Password),
		Host:     net.JoinHostPort(host, port),
		Path:     "/" + p.Name,
		RawQuery: q.Encode(),
	}
	return u.String()
}

func (d *Daemon) apiProject(p state.Project) admin.Project {
	out := admin.Project{
		Name: p.Name, Image: p.Image, SleepAfterMS: p.SleepAfter.Milliseconds(), SleepMode: p.SleepMode,
		Pinned: p.Pinned, URL: d.URL(p), User: p.User, Database: p.Database, CreatedAt: p.CreatedAt,
		State: string(proxy.StateSleeping), Ephemeral: p.Ephemeral, Backend: d.be.Name(),
	}
	st, err := d.srv.ProjectStatus(p.Name)
	if err != nil {
		return out
	}
	ms := func(t time.Duration) float64 { return float64(t.Microseconds()) / 1000 }
	out.State, out.Active, out.Pinned = string(st.State), st.Active, st.Pinned
	out.Wakes, out.WakeFailures = st.Wakes, st.WakeFails
	out.LastWakeMS, out.P50WakeMS, out.P95WakeMS, out.MaxWakeMS = ms(st.LastWake), ms(st.P50Wake), ms(st.P95Wake), ms(st.MaxWake)
	out.LastError, out.LastErrorAt, out.RetryAt = st.LastError, st.LastErrorAt, st.RetryAt
	out.IdleMS, out.SleepsInMS = st.IdleFor.Milliseconds(), st.SleepsIn.Milliseconds()
	out.Queued, out.LastActiveAt = st.Queued, st.LastActive
	for _, l := range st.Recent {
		out.RecentWakesMS = append(out.RecentWakesMS, ms(l))
	}
	for _, e := range st.Events {
		out.Events = append(out.Events, admin.Event{At: e.At, Msg: e.Msg})
	}
	if out.State == string(proxy.StateSleeping) && !st.RetryAt.IsZero() {
		out.State = "error" // backing off after failed wakes
	}
	return out
}

// Projects implements admin.Service.
func (d *Daemon) Projects() []admin.Project {
	ps := d.store.Projects()
	out := make([]admin.Project, 0, len(ps))
	for _, p := range ps {
		out = append(out, d.apiProject(p))
	}
	return out
}

// Project implements admin.Service.
func (d *Daemon) Project(name string) (admin.Project, error) {
	p, err := d.store.Get(name)
	if err != nil {
		return admin.Project{}, apiErr(err)
	}
	return d.apiProject(p), nil
}

func apiErr(err error) error {
	switch {
	case errors.Is(err, state.ErrNotFound), errors.Is(err, proxy.ErrNoProject):
		return admin.NotFound(err)
	case errors.Is(err, state.ErrExists), errors.Is(err, proxy.ErrProjectExists):
		return admin.Conflict(err)
	}
	return err
}

// Create implements admin.Service: it stores the project, creates its
// server (pulling the image if needed) without starting it, and registers
// it with the proxy.
func (d *Daemon) Create(ctx context.Context, req admin.CreateRequest) (admin.Project, error) {
	if err := state.ValidateName(req.Name); err != nil {
		return admin.Project{}, admin.Invalid(err)
	}
	p := state.Project{
		Name: req.Name, Image: req.Image, User: "postgres", Database: req.Name,
		SleepAfter: d.cfg.SleepAfter, SleepMode: req.SleepMode, Ephemeral: d.cfg.Ephemeral,
		Port: req.Port,
	}
	if req.Port < 0 || req.Port > 65535 {
		return admin.Project{}, admin.Invalid(fmt.Errorf("port %d is out of range", req.Port))
	}
	if req.Ephemeral != nil {
		p.Ephemeral = *req.Ephemeral
	}
	if p.Image == "" {
		p.Image = d.cfg.Image
	}
	if p.SleepMode == "" {
		p.SleepMode = d.cfg.SleepMode
	}
	if _, err := backend.ParseSleepMode(p.SleepMode); err != nil {
		return admin.Project{}, admin.Invalid(err)
	}
	if backend.SleepMode(p.SleepMode) == backend.SleepPause && !backend.CanPause(d.be) {
		return admin.Project{}, admin.Invalid(fmt.Errorf("the %s backend cannot pause servers; use --sleep-mode stop", d.be.Name()))
	}
	if req.SleepAfter != "" {
		dur, err := time.ParseDuration(req.SleepAfter)
		if err != nil || dur < 0 {
			return admin.Project{}, admin.Invalid(fmt.Errorf("sleep_after: %q is not a duration like 10m", req.SleepAfter))
		}
		p.SleepAfter = dur
	}
	p, err := d.store.Add(p)
	if err != nil {
		return admin.Project{}, apiErr(err)
	}
	if err := d.be.Ensure(ctx, spec(p)); err != nil {
		_ = d.store.Remove(p.Name, false)
		return admin.Project{}, fmt.Errorf("create project %q: %w", p.Name, err)
	}
	if err := d.srv.AddProject(ctx, d.proxyProject(p)); err != nil {
		_ = d.store.Remove(p.Name, false)
		return admin.Project{}, apiErr(err)
	}
	if err := d.listenProjectPort(p); err != nil {
		_ = d.srv.RemoveProject(p.Name)
		_ = d.store.Remove(p.Name, false)
		return admin.Project{}, admin.Conflict(err)
	}
	d.log.Info("project created", "project", p.Name, "image", p.Image, "sleep_after", p.SleepAfter, "sleep_mode", p.SleepMode)
	return d.apiProject(p), nil
}

// Remove implements admin.Service.
func (d *Daemon) Remove(ctx context.Context, name string, volumes bool) error {
	p, err := d.store.Get(name)
	if err != nil {
		return apiErr(err)
	}
	if err := d.srv.RemoveProject(name); err != nil && !errors.Is(err, proxy.ErrNoProject) {
		return err
	}
	defer d.hub.changed(name)
	d.closeProjectPort(name)
	if err := d.be.Remove(ctx, spec(p), volumes); err != nil {
		// Put it back so the user can retry; the data is untouched.
		_ = d.srv.AddProject(ctx, d.proxyProject(p))
		_ = d.listenProjectPort(p)
		return err
	}
	if err := d.store.Remove(name, !volumes); err != nil {
		return apiErr(err)
	}
	d.log.Info("project removed", "project", name, "volumes", volumes)
	return nil
}

// Wake implements admin.Service.
func (d *Daemon) Wake(ctx context.Context, name string) error { return apiErr(d.srv.Wake(ctx, name)) }

// Sleep implements admin.Service.
func (d *Daemon) Sleep(ctx context.Context, name string) error {
	err := d.srv.Sleep(ctx, name)
	if err != nil && !errors.Is(err, proxy.ErrNoProject) {
		return admin.Conflict(err)
	}
	return apiErr(err)
}

// Pin implements admin.Service.
func (d *Daemon) Pin(name string, pinned bool) error {
	if err := d.store.Update(name, func(p *state.Project) { p.Pinned = pinned }); err != nil {
		return apiErr(err)
	}
	return apiErr(d.srv.SetPinned(name, pinned))
}

// Logs implements admin.Service.
func (d *Daemon) Logs(ctx context.Context, name string, follow bool, tail int) (io.ReadCloser, error) {
	p, err := d.store.Get(name)
	if err != nil {
		return nil, apiErr(err)
	}
	lg, ok := d.be.(backend.Logger)
	if !ok {
		return nil, fmt.Errorf("the %s backend cannot show logs", d.be.Name())
	}
	return lg.Logs(ctx, spec(p), follow, tail)
}

// Shutdown implements admin.Service.
func (d *Daemon) Shutdown(volumes bool) {
	d.shutdownOnce.Do(func() {
		d.shutdownVolumes = volumes
		close(d.shutdownCh)
	})
}

// removeOnShutdown removes ephemeral projects, or all with volumes, data
// included. Only what pgwake created is touched: its own projects.
func (d *Daemon) removeOnShutdown(ctx context.Context, all bool) error {
	var errs []error
	for _, p := range d.store.Projects() {
		if !all && !p.Ephemeral {
			continue
		}
		if err := d.be.Remove(ctx, spec(p), true); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := d.store.Remove(p.Name, false); err != nil {
			errs = append(errs, err)
			continue
		}
		d.log.Info("project removed with its data", "project", p.Name, "ephemeral", p.Ephemeral)
	}
	return errors.Join(errs...)
}

// createDeclared creates the projects pgwake.yaml declares that do not
// exist yet.
func (d *Daemon) createDeclared(ctx context.Context) error {
	for _, pc := range d.cfg.Projects {
		if _, err := d.store.Get(pc.Name); err == nil {
			continue
		}
		req := admin.CreateRequest{Name: pc.Name, Image: pc.Image, SleepMode: pc.SleepMode}
		if pc.SleepAfter != nil {
			req.SleepAfter = pc.SleepAfter.String()
		}
		if pc.Ephemeral {
			req.Ephemeral = &pc.Ephemeral
		}
		if _, err := d.Create(ctx, req); err != nil {
			return fmt.Errorf("declared project %q: %w", pc.Name, err)
		}
	}
	return nil
}
