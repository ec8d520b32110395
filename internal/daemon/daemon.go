// Package daemon wires pgwake together: state, backend, proxy and admin API.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// Daemon is a running pgwake. New constructs it (taking the state dir's
// lock, connecting backends, opening listeners and serving the admin API),
// Serve serves clients until it is told to stop, and Close shuts it down
// and releases everything New took.
type Daemon struct {
	cfg   config.Config
	log   *slog.Logger
	opts  Options
	store *state.Store
	srv   *proxy.Server
	ln    net.Listener
	sock  string

	// backends holds every backend some project lives on, and the one new
	// projects are created on (newBackend), connected or not.
	backends   map[string]*lazyBackend
	newBackend string

	hub     *hub
	metrics *metrics.Metrics
	tls     *tls.Config

	// serveCtx ends when the daemon stops serving; per-project listeners
	// (port routing) run on it.
	serveCtx    context.Context
	stopServing context.CancelFunc
	portMu      sync.Mutex
	portLns     map[string]net.Listener
	portErrs    map[string]string // why a project's own port could not be opened
	accepting   bool              // Serve runs: a new project port is served at once

	hs        *http.Server // admin API on the unix socket
	ths       *http.Server // and on TCP (admin_listen), or nil
	cancelAPI context.CancelFunc

	starting  atomic.Bool // until Serve has created the declared projects
	closing   atomic.Bool // Close has begun: no more projects are created
	served    atomic.Bool // Serve was called
	serveDone chan error  // the proxy's Serve, once Serve started it

	// cleanups release what New took, in reverse order.
	cleanups  []func()
	closeOnce sync.Once
	closeErr  error

	// busy holds the names a create, remove or catalog sync acts on.
	busyMu   sync.Mutex
	busy     map[string]bool
	syncDone chan struct{} // closed when the catalog sync loop ends

	shutdownOnce    sync.Once
	shutdownCh      chan struct{}
	shutdownVolumes bool // written before shutdownCh is closed
}

// ErrAlreadyRunning is returned when another daemon owns the admin socket.
var ErrAlreadyRunning = errors.New("pgwake is already running")

// Options are New's inputs beyond the config.
type Options struct {
	// Connect connects a backend by name; nil means ConnectBackend.
	Connect Connect
	// Ready, if set, is called once the proxy and admin API accept
	// connections and the declared projects exist.
	Ready func(proxyAddr string)
	// SweepInterval overrides the idle sweep period (tests).
	SweepInterval time.Duration
	// ReconnectInterval is how often, at most, a backend that could not
	// be reached is tried again when one of its projects is used (default
	// DefaultReconnectInterval).
	ReconnectInterval time.Duration
}

// DefaultReconnectInterval is Options.ReconnectInterval's default.
const DefaultReconnectInterval = 5 * time.Second

// Run starts pgwake and blocks until ctx ends or a shutdown is requested
// over the admin API; then it drains connections and puts every project to
// sleep. It is New, Serve and Close.
func Run(ctx context.Context, cfg config.Config, log *slog.Logger, opts Options) error {
	d, err := New(ctx, cfg, log, opts)
	if err != nil {
		return err
	}
	serr := d.Serve(ctx)
	cerr := d.Close()
	if serr != nil {
		return serr // Close logged its own error
	}
	return cerr
}

// New sets pgwake up: the state and its lock, the backends, TLS, the proxy
// with every project, the listeners and the admin API (which answers from
// here on; Info says Starting until Serve has finished start-up). Clients
// are accepted once Serve runs. On error everything taken so far is
// released.
func New(ctx context.Context, cfg config.Config, log *slog.Logger, opts Options) (_ *Daemon, err error) {
	if opts.Connect == nil {
		opts.Connect = ConnectBackend
	}
	if opts.ReconnectInterval <= 0 {
		opts.ReconnectInterval = DefaultReconnectInterval
	}
	nofile, nerr := raiseNoFile()
	attrs := []any{"version", version.Version, "gomaxprocs", runtime.GOMAXPROCS(0), "nofile", nofile}
	log.Info("starting pgwake", append(attrs, cfg.LogAttrs()...)...)
	if nerr != nil {
		log.Warn("could not raise the open-files limit", "nofile", nofile, "err", nerr)
	}

	d := &Daemon{
		cfg: cfg, log: log, opts: opts, sock: cfg.SocketPath(), shutdownCh: make(chan struct{}),
		hub: newHub(), backends: map[string]*lazyBackend{},
	}
	defer func() {
		if err != nil {
			d.release()
		}
	}()
	d.starting.Store(true)

	if d.store, err = state.Open(cfg.StateDir); err != nil {
		return nil, err
	}
	unlock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	d.cleanups = append(d.cleanups, unlock)
	if err := admin.NewClient(d.sock).Healthy(ctx); err == nil {
		return nil, fmt.Errorf("%w (admin socket %s)", ErrAlreadyRunning, d.sock)
	}
	if err := d.openBackends(ctx); err != nil {
		return nil, err
	}

	if cfg.TLSOn() {
		host, _, _ := net.SplitHostPort(cfg.Listen)
		hostname, _ := os.Hostname()
		d.tls, err = certs.ServerConfig(cfg.StateDir, cfg.TLS.Cert, cfg.TLS.Key, []string{host, hostname}, time.Now())
		if err != nil {
			return nil, err
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
			return nil, err
		}
	}

	d.metrics = metrics.New(d.Projects)
	// Replicas in front of one namespace route cancels among themselves.
	var cancels proxy.CancelRouter
	if l := d.backends["kubernetes"]; l != nil {
		cancels = l
	}
	d.srv, err = proxy.New(proxy.Options{
		Cancels:    cancels,
		OnChange:   d.hub.changed,
		OnWake:     d.onWake,
		OnConnDone: d.metrics.ConnDone,
		OnRefused: func(project, code string) {
			_, err := d.store.Get(project)
			d.metrics.Refused(project, code, err == nil)
		},
		Logger:            log,
		WakeTimeout:       cfg.WakeTimeout,
		FirstStartTimeout: cfg.FirstStartTimeout,
		StartupTimeout:    cfg.StartupTimeout,
		GracePeriod:       cfg.GracePeriod,
		SweepInterval:     opts.SweepInterval,
		MaxConns:          cfg.MaxConnections,
		MaxProjectConns:   cfg.MaxProjectConnections,
		MaxStartupConns:   cfg.MaxStartupConnections,
		TLS:               d.tls,
		UpstreamTLS:       upstreamTLS,
	})
	if err != nil {
		return nil, err
	}
	d.cleanups = append(d.cleanups, d.srv.Close)
	if err := d.syncDeclaredSettings(); err != nil {
		return nil, err
	}
	for _, p := range d.store.Projects() {
		if p.Pending {
			d.dropPending(ctx, p)
			continue
		}
		if err := d.srv.AddProject(ctx, d.proxyProject(p)); err != nil {
			return nil, err
		}
	}

	// Per-project listeners run on serveCtx; it must exist before the admin
	// API can create a project with a port.
	d.serveCtx, d.stopServing = context.WithCancel(context.Background())
	d.cleanups = append(d.cleanups, d.stopServing)
	if d.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen for clients: %w", err)
	}
	d.cleanups = append(d.cleanups, func() { d.ln.Close() })
	if l := d.backends["kubernetes"]; l != nil {
		addr := advertiseAddr(cfg.Kubernetes.PeerAddress, d.ln.Addr())
		l.Advertise(addr)
		log.Info("cancel requests for sessions of this pgwake are accepted from its peers", "peer_address", addr)
	}
	d.cleanups = append(d.cleanups, d.closeProjectPorts)
	d.openProjectPorts()
	// Backends that keep projects themselves (a Kubernetes namespace):
	// what is there is what this pgwake serves.
	d.syncCatalogsOnce(ctx)
	if err := d.serveAdmin(); err != nil {
		return nil, err
	}
	return d, nil
}

// openBackends decides which backend new projects go to, assigns a
// backend to projects stored without one, and connects every backend some
// project lives on plus the one for new projects. A backend that cannot be
// connected is kept as an unavailable one: its projects are told why. It
// fails only when no backend could be connected.
func (d *Daemon) openBackends(ctx context.Context) error {
	cfg, log, instance := d.cfg, d.log, d.store.Instance()
	// State files written before the backend was stored with each project:
	// a project lives on the local backend if it has a data directory
	// there, else (the only other backend there was) on Docker.
	root := localRoot(cfg.StateDir, instance)
	if err := d.store.AssignBackends(func(name string) string {
		if hasLocalData(root, name) {
			return "local"
		}
		return "docker"
	}); err != nil {
		return err
	}
	projects := d.store.Projects()
	count := map[string]int{}
	for _, p := range projects {
		count[p.Backend]++
	}
	// Kept data counts as a project when auto decides: creating the project
	// again must find its data.
	evidence := maps.Clone(count)
	for _, c := range d.store.Kept() {
		evidence[c.Backend]++
	}

	connect := func(name string) func(context.Context) (backend.Backend, error) {
		return func(ctx context.Context) (backend.Backend, error) {
			return d.opts.Connect(ctx, name, cfg, instance, log)
		}
	}
	var reason string
	switch {
	case cfg.Backend != "auto":
		d.newBackend, reason = cfg.Backend, "backend: "+cfg.Backend
	case len(evidence) > 0:
		d.newBackend = mostUsed(evidence)
		reason = "auto: the backend this state dir's projects use"
	default:
		// A state dir without projects: auto chooses.
		be, why, err := selectBackend(ctx, d.opts.Connect, cfg, instance, log)
		if err != nil {
			return err
		}
		d.newBackend, reason = be.Name(), why
		d.addBackend(newLazyBackend(be.Name(), be, nil, connect(be.Name()), d.opts.ReconnectInterval, log))
	}
	names := slices.Sorted(maps.Keys(count))
	if !slices.Contains(names, d.newBackend) {
		names = append(names, d.newBackend)
	}
	var reasons []string
	for _, name := range names {
		l := d.backends[name]
		if l == nil {
			be, err := d.opts.Connect(ctx, name, cfg, instance, log)
			if err == nil && name == d.newBackend {
				reason = describe(be, reason)
			}
			l = newLazyBackend(name, be, err, connect(name), d.opts.ReconnectInterval, log)
			d.addBackend(l)
		}
		if ok, err := l.available(); !ok {
			reasons = append(reasons, err.Error())
			log.Warn("backend unavailable: its projects answer clients with this error until it can be reached",
				"backend", name, "projects", count[name], "err", err)
		}
	}
	log.Info("backend for new projects", "backend", d.newBackend, "why", reason)
	if len(reasons) == len(names) {
		if len(projects) == 0 {
			return errors.New(strings.Join(reasons, "; "))
		}
		return fmt.Errorf("none of the %d projects can be served: %s", len(projects), strings.Join(reasons, "; "))
	}
	return nil
}

func (d *Daemon) addBackend(l *lazyBackend) {
	d.backends[l.name] = l
	d.cleanups = append(d.cleanups, func() { l.Close() })
}

// mostUsed is the name counted most often; ties go to the first by name.
func mostUsed(count map[string]int) string {
	best := ""
	for _, name := range slices.Sorted(maps.Keys(count)) {
		if best == "" || count[name] > count[best] {
			best = name
		}
	}
	return best
}

// serveAdmin serves the admin API on the unix socket and, when
// configured, on TCP.
func (d *Daemon) serveAdmin() error {
	// Remove a stale socket from a crashed daemon; the health check in New
	// proved nobody answers on it.
	_ = os.Remove(d.sock)
	if err := os.MkdirAll(filepath.Dir(d.sock), 0o700); err != nil {
		return fmt.Errorf("admin socket dir: %w", err)
	}
	aln, err := net.Listen("unix", d.sock)
	if err != nil {
		return fmt.Errorf("listen on admin socket: %w", err)
	}
	d.cleanups = append(d.cleanups, func() { aln.Close(); os.Remove(d.sock) })
	if err := os.Chmod(d.sock, 0o600); err != nil {
		return fmt.Errorf("admin socket: %w", err)
	}
	handler := d.handler()
	// Requests run on apiCtx, cancelled at shutdown so open event streams
	// end instead of holding the HTTP shutdown up.
	apiCtx, cancelAPI := context.WithCancel(context.Background())
	d.cancelAPI = cancelAPI
	d.cleanups = append(d.cleanups, cancelAPI)
	baseCtx := func(net.Listener) context.Context { return apiCtx }
	d.hs = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, BaseContext: baseCtx}
	var tln net.Listener
	if d.cfg.AdminListen != "" {
		if tln, err = net.Listen("tcp", d.cfg.AdminListen); err != nil {
			return fmt.Errorf("admin listen: %w", err)
		}
		d.ths = &http.Server{Handler: admin.RequireToken(d.cfg.AdminToken, handler), ReadHeaderTimeout: 10 * time.Second, BaseContext: baseCtx}
		d.cleanups = append(d.cleanups, func() { d.ths.Close() })
		go d.ths.Serve(tln)
		d.log.Info("admin API and metrics on TCP", "addr", tln.Addr().String(), "token_required", d.cfg.AdminToken != "")
	}
	d.cleanups = append(d.cleanups, func() { d.hs.Close() })
	go d.hs.Serve(aln)
	return nil
}

// Serve accepts clients, creates the projects pgwake.yaml declares, and
// blocks until ctx ends or a shutdown is requested over the admin API. It
// returns an error only when start-up fails (a declared project cannot be
// created); call Close in every case.
func (d *Daemon) Serve(ctx context.Context) error {
	if !d.served.CompareAndSwap(false, true) {
		return errors.New("daemon: Serve called twice")
	}
	d.serveDone = make(chan error, 1)
	go func() { d.serveDone <- d.srv.Serve(d.serveCtx, d.ln) }()
	d.syncDone = make(chan struct{})
	go func() {
		defer close(d.syncDone)
		d.syncCatalogs(d.serveCtx)
	}()
	d.portMu.Lock()
	d.accepting = true
	for name, ln := range d.portLns {
		go d.srv.ServeProject(d.serveCtx, ln, name)
	}
	d.portMu.Unlock()

	// Declared projects are created on a context that a shutdown ends too:
	// an image pull must not hold `down` up.
	dctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-d.shutdownCh:
			cancel()
		case <-dctx.Done():
		}
	}()
	err := d.createDeclared(dctx)
	cancel()
	if err != nil {
		// Starting stays set: while Close runs the admin API still
		// answers, and `up --wait` must not take that for serving.
		d.log.Error("creating declared projects", "err", err)
		return err
	}
	d.starting.Store(false)
	d.log.Info("pgwake is serving", "listen", d.ln.Addr().String(), "admin", d.sock,
		"backend", d.newBackend, "projects", len(d.store.Projects()))
	if d.opts.Ready != nil {
		d.opts.Ready(d.ln.Addr().String())
	}
	select {
	case <-ctx.Done():
	case <-d.shutdownCh:
	}
	return nil
}

// Close shuts pgwake down: the proxy first (it drains sessions up to
// shutdown_timeout, answers connects that arrive meanwhile with 57P01,
// puts every project to sleep and closes the listeners), then ephemeral
// projects (or all, after `down --volumes`) are removed with their data,
// the admin API stops, and the backends and the state dir's lock are
// released. It is safe to call more than once.
func (d *Daemon) Close() error {
	d.closeOnce.Do(func() { d.closeErr = d.close() })
	return d.closeErr
}

func (d *Daemon) close() error {
	d.closing.Store(true)
	d.log.Info("shutting down: draining connections, then putting projects to sleep",
		"drain_timeout", d.cfg.ShutdownTimeout)
	dctx, cancel := context.WithTimeout(context.Background(), d.cfg.ShutdownTimeout)
	defer cancel()
	// Shutdown first: while it drains, the listeners stay open so late
	// clients hear 57P01 rather than "connection refused".
	err := d.srv.Shutdown(dctx)
	d.stopServing()
	d.ln.Close()
	d.closeProjectPorts()
	if d.serveDone != nil {
		<-d.serveDone
	}
	if d.syncDone != nil {
		<-d.syncDone
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer rcancel()
	if rerr := d.removeOnShutdown(rctx, d.shutdownVolumes); rerr != nil {
		err = errors.Join(err, rerr)
	}
	d.cancelAPI()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = d.hs.Shutdown(sctx)
	d.release()
	if err != nil {
		d.log.Error("shutdown", "err", err)
		return fmt.Errorf("shutdown: %w", err)
	}
	d.log.Info("pgwake stopped")
	return nil
}

// release undoes what New took, newest first.
func (d *Daemon) release() {
	for i := len(d.cleanups) - 1; i >= 0; i-- {
		d.cleanups[i]()
	}
	d.cleanups = nil
}

// backendOf is the backend project p lives on.
func (d *Daemon) backendOf(p state.Project) *lazyBackend {
	if l := d.backends[p.Backend]; l != nil {
		return l
	}
	// Not reached: New connects every project's backend. Should it be,
	// the project is reported unavailable rather than served elsewhere.
	return newLazyBackend(p.Backend, nil, fmt.Errorf("unknown backend %q", p.Backend), nil, 0, d.log)
}

func spec(p state.Project) backend.Spec {
	return backend.Spec{Name: p.Name, Image: p.Image, User: p.User, Password: p.Password, Database: p.Database, Adopted: p.Adopted,
		Init: p.Init, Settings: p.Settings}
}

func (d *Daemon) proxyProject(p state.Project) proxy.Project {
	return proxy.Project{
		Spec: spec(p), Backend: d.backendOf(p), SleepAfter: p.SleepAfter,
		SleepMode: backend.SleepMode(p.SleepMode), StopAfter: d.stopAfter(p), Pinned: p.Pinned,
		PendingPassword: p.PendingPassword,
	}
}

// stopAfter is how long tiered project p stays paused before it is
// stopped: its own stop_after, or the configured default for a project
// stored without one. Zero for the other sleep modes.
func (d *Daemon) stopAfter(p state.Project) time.Duration {
	switch {
	case backend.SleepMode(p.SleepMode) != backend.SleepTiered:
		return 0
	case p.StopAfter > 0:
		return p.StopAfter
	}
	return d.cfg.StopAfter
}

// handler is the admin API plus /metrics.
func (d *Daemon) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", d.metrics.Handler())
	mux.Handle("/", admin.Handler(d))
	return mux
}

// Ready implements admin.Service: listening, and every backend answers.
func (d *Daemon) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var errs []string
	for _, name := range slices.Sorted(maps.Keys(d.backends)) {
		if err := d.backends[name].Check(ctx); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// Info implements admin.Service.
func (d *Daemon) Info() admin.Info {
	count := map[string]int{}
	for _, p := range d.store.Projects() {
		count[p.Backend]++
	}
	var bs []admin.BackendInfo
	for _, name := range slices.Sorted(maps.Keys(d.backends)) {
		bi := admin.BackendInfo{Name: name, Projects: count[name], Detail: d.backends[name].Describe()}
		if ok, err := d.backends[name].available(); !ok {
			bi.Error = err.Error()
		}
		bs = append(bs, bi)
	}
	return admin.Info{
		Version: version.Version, PID: os.Getpid(), Listen: d.ln.Addr().String(),
		Backend: d.newBackend, Backends: bs, StateDir: d.cfg.StateDir, Starting: d.starting.Load(),
		Config: d.cfg.Effective(),
	}
}

func (d *Daemon) apiProject(p state.Project) admin.Project {
	out := admin.Project{
		Name: p.Name, Image: p.Image, SleepAfterMS: p.SleepAfter.Milliseconds(), SleepMode: p.SleepMode,
		StopAfterMS: d.stopAfter(p).Milliseconds(), Pinned: p.Pinned, URL: d.URL(p), SharedURL: d.sharedURL(p), User: p.User, Database: p.Database,
		CreatedAt: p.CreatedAt, State: string(proxy.StateSleeping), Ephemeral: p.Ephemeral, Backend: p.Backend,
		Adopted: p.Adopted, Parent: p.Parent, BranchedAt: p.BranchedAt,
		Settings: p.Settings, Init: initNames(p.Init), InitError: p.InitError,
	}
	out.Port, out.PortError = d.portOf(p)
	out.Auth = proxy.AuthPassThrough
	if p.Password != "" {
		out.Auth = proxy.AuthSCRAM
	}
	st, err := d.srv.ProjectStatus(p.Name)
	if err != nil {
		return out
	}
	ms := func(t time.Duration) float64 { return float64(t.Microseconds()) / 1000 }
	out.State, out.Active, out.Pinned = string(st.State), st.Active, st.Pinned
	out.Wakes, out.WakeFailures = st.Wakes, st.WakeFails
	out.LastWakeMS, out.P50WakeMS, out.P95WakeMS, out.MaxWakeMS = ms(st.LastWake), ms(st.P50Wake), ms(st.P95Wake), ms(st.MaxWake)
	out.FirstStartMS = ms(st.FirstStart)
	if st.LastWake > 0 {
		ph := st.LastPhases
		out.LastWakePhases = &admin.WakePhases{
			EngineMS: ms(ph.Engine), AcceptMS: ms(ph.Accept), ReadyMS: ms(ph.Ready),
			ConfirmMS: ms(ph.Confirm), Retries: ph.Retries,
		}
	}
	out.LastError, out.LastErrorAt, out.RetryAt = st.LastError, st.LastErrorAt, st.RetryAt
	out.IdleMS, out.SleepsInMS = st.IdleFor.Milliseconds(), st.SleepsIn.Milliseconds()
	out.Asleep, out.NextSleepMS = st.Asleep, st.NextSleep.Milliseconds()
	out.Queued, out.LastActiveAt, out.PeersBusy = st.Queued, st.LastActive, st.PeersBusy
	out.Auth, out.AuthFailures, out.AuthThrottled = st.Auth, st.AuthFailures, st.AuthThrottled
	for _, l := range st.Recent {
		out.RecentWakesMS = append(out.RecentWakesMS, ms(l))
	}
	for _, e := range st.Events {
		out.Events = append(out.Events, admin.Event{At: e.At, Msg: e.Msg})
	}
	if st.State == proxy.StateWaking {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		out.Phase = d.backendOf(p).Phase(ctx, spec(p))
		cancel()
	}
	if out.State == string(proxy.StateSleeping) && !st.RetryAt.IsZero() {
		out.State = "error" // backing off after failed wakes
	}
	if p.InitError != "" && out.State == string(proxy.StateSleeping) {
		// Never served again (also after a restart, before any wake).
		out.State = "error"
		if out.LastError == "" {
			out.LastError = p.InitError
		}
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
	case errors.Is(err, state.ErrExists), errors.Is(err, proxy.ErrProjectExists), errors.Is(err, backend.ErrNotOwned),
		errors.Is(err, backend.ErrDataExists), errors.Is(err, backend.ErrNotStopped):
		return admin.Conflict(err)
	}
	return err
}

// ErrClosing is returned for a project created while pgwake shuts down.
var ErrClosing = errors.New("pgwake is shutting down")

// Create implements admin.Service: it stores the project, creates its
// server (pulling the image if needed) without starting it, and registers
// it with the proxy. What can fail cheaply is checked before anything is
// created (the name, the settings, the port); a failure after that removes
// everything the create made, but never data that existed before it (data
// kept by `rm` that this project reuses).
func (d *Daemon) Create(ctx context.Context, req admin.CreateRequest) (admin.Project, error) {
	if d.closing.Load() {
		return admin.Project{}, admin.Conflict(ErrClosing)
	}
	if err := state.ValidateName(req.Name); err != nil {
		return admin.Project{}, admin.Invalid(err)
	}
	be := d.backends[d.newBackend]
	p := state.Project{
		Name: req.Name, Image: req.Image, User: "postgres", Database: req.Name,
		SleepAfter: d.cfg.SleepAfter, SleepMode: req.SleepMode, Ephemeral: d.cfg.Ephemeral,
		Port: req.Port, Backend: be.Name(),
	}
	var src *state.Project
	if req.From != "" {
		s, err := d.branchSource(ctx, req)
		if err != nil {
			return admin.Project{}, err
		}
		// The copy's image, roles and database are its source's; the
		// server runs where the source's data is.
		src, be = &s, d.backendOf(s)
		p.Image, p.User, p.Database, p.Backend = s.Image, s.User, s.Database, s.Backend
		p.Parent, p.BranchedAt = s.Name, time.Now().UTC().Truncate(time.Second)
		p.Pending = true // until its data is whole (see dropPending)
	}
	if err := d.checkPort(req.Port, req.PortOutsideRange); err != nil {
		return admin.Project{}, admin.Invalid(err)
	}
	settings, err := checkInitRequest(req, be.Name())
	if err != nil {
		return admin.Project{}, admin.Invalid(err)
	}
	p.Settings = settings
	if src != nil && len(p.Settings) == 0 {
		p.Settings = src.Settings // its server as its source's, unless told
	}
	if req.NoPort {
		if req.Port != 0 {
			return admin.Project{}, admin.Invalid(errors.New("--port and --no-port exclude each other"))
		}
		p.NoPort = true
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
	switch mode := backend.SleepMode(p.SleepMode); {
	case mode == backend.SleepPause && !backend.CanPause(be):
		return admin.Project{}, admin.Invalid(fmt.Errorf("the %s backend cannot pause servers; use --sleep-mode stop", be.Name()))
	case mode == backend.SleepTiered && !backend.CanPause(be):
		return admin.Project{}, admin.Invalid(fmt.Errorf("the %s backend cannot pause servers, and sleep mode tiered pauses before it stops; use --sleep-mode stop", be.Name()))
	}
	if req.StopAfter != "" {
		dur, err := time.ParseDuration(req.StopAfter)
		if err != nil || dur <= 0 {
			return admin.Project{}, admin.Invalid(fmt.Errorf("stop_after: %q is not a positive duration like 30m", req.StopAfter))
		}
		p.StopAfter = dur
	}
	if backend.SleepMode(p.SleepMode) != backend.SleepTiered {
		p.StopAfter = 0 // only tiered stops a paused server
	} else if p.StopAfter == 0 {
		p.StopAfter = d.cfg.StopAfter
	}
	if req.SleepAfter != "" {
		dur, err := time.ParseDuration(req.SleepAfter)
		if err != nil || dur < 0 {
			return admin.Project{}, admin.Invalid(fmt.Errorf("sleep_after: %q is not a duration like 10m", req.SleepAfter))
		}
		p.SleepAfter = dur
	}
	if _, err := d.store.Get(p.Name); err == nil {
		return admin.Project{}, admin.Conflict(fmt.Errorf("%w: %q", state.ErrExists, p.Name))
	}
	if !d.claimName(p.Name) {
		return admin.Project{}, admin.Conflict(fmt.Errorf("project %q is being created or removed right now", p.Name))
	}
	defer d.releaseName(p.Name)
	cat := be.catalog(ctx)
	keptData := false
	if cat != nil {
		// The backend is the store: a project of this name made by
		// another pgwake exists, and data kept by `rm` comes with its
		// credentials.
		recs, err := cat.Projects(ctx)
		if err != nil {
			return admin.Project{}, apiErr(err)
		}
		for _, r := range recs {
			if r.Spec.Name == p.Name {
				return admin.Project{}, admin.Conflict(fmt.Errorf("%w: %q (on %s, made by another pgwake)", state.ErrExists, p.Name, be.Name()))
			}
		}
		kept, ok, err := cat.Kept(ctx, p.Name)
		if err != nil {
			return admin.Project{}, apiErr(err)
		}
		if ok {
			p.User, p.Password, p.Database, keptData = kept.User, kept.Password, kept.Database, true
		}
	}
	ln, err := d.claimPort(&p)
	if err != nil {
		return admin.Project{}, admin.Conflict(err)
	}
	if !keptData {
		if p.Init, err = d.writeInit(p.Name, req.Init); err != nil {
			if ln != nil {
				ln.Close()
			}
			return admin.Project{}, err
		}
	}

	p, reused, err := d.store.Add(p)
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		d.removeInit(p.Name)
		return admin.Project{}, apiErr(err)
	}
	reused = reused || keptData
	if reused && len(req.Init) > 0 {
		// Like the official image: init scripts run on new data only.
		d.log.Warn("init scripts not run: the project reuses data kept by `pgwake rm` (pgwake rm --volumes first for new data)", "project", p.Name)
		p.Init = nil
		d.removeInit(p.Name)
		if err := d.store.Update(p.Name, func(sp *state.Project) { sp.Init = nil }); err != nil {
			d.log.Warn("forget the init scripts", "project", p.Name, "err", err)
		}
	}
	// Data that exists before Ensure is never removed by a rollback: kept
	// data this project reuses, or a server of this instance already there
	// (what the backend cannot tell us about, it keeps).
	existed := reused
	if !existed {
		st, err := be.Status(ctx, spec(p))
		existed = err != nil || st.State != backend.StateMissing
	}
	rollback := func(cause error) {
		if ln != nil {
			ln.Close()
		}
		// Something that is not ours (ErrNotOwned) is never touched; an
		// unreachable backend created nothing.
		if !errors.Is(cause, backend.ErrNotOwned) && !errors.Is(cause, backend.ErrUnavailable) {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			defer cancel()
			if err := be.Remove(rctx, spec(p), !existed && !errors.Is(cause, backend.ErrDataExists)); err != nil {
				d.log.Error("create failed and its rollback too; `pgwake down --volumes` removes what is left",
					"project", p.Name, "err", err)
			}
		}
		if err := d.store.Remove(p.Name, reused); err != nil {
			d.log.Error("create failed; removing it from the state", "project", p.Name, "err", err)
		}
		d.removeInit(p.Name)
	}
	if src != nil && reused {
		err := fmt.Errorf("data of an earlier project %q is kept (rm without --volumes): a branch needs a name without data; `pgwake create %s` reuses it, or choose another name", p.Name, p.Name)
		rollback(err)
		return admin.Project{}, admin.Conflict(err)
	}
	ensure := be.Ensure
	if src != nil {
		ensure = func(ctx context.Context, _ backend.Spec) error { return d.branchData(ctx, *src, p) }
	}
	if err := ensure(ctx, spec(p)); err != nil {
		rollback(err)
		return admin.Project{}, apiErr(fmt.Errorf("create project %q: %w", p.Name, err))
	}
	if p.Pending {
		p.Pending = false
		if err := d.store.Update(p.Name, func(sp *state.Project) { sp.Pending = false }); err != nil {
			rollback(err)
			return admin.Project{}, apiErr(fmt.Errorf("create project %q: %w", p.Name, err))
		}
	}
	if cat != nil {
		if err := cat.Save(ctx, record(p)); err != nil {
			rollback(err)
			return admin.Project{}, apiErr(fmt.Errorf("create project %q: %w", p.Name, err))
		}
	}
	if err := d.srv.AddProject(ctx, d.proxyProject(p)); err != nil {
		rollback(err)
		return admin.Project{}, apiErr(err)
	}
	if ln != nil {
		d.addProjectPort(p.Name, ln)
	}
	d.log.Info("project created", "project", p.Name, "backend", p.Backend, "image", p.Image,
		"sleep_after", p.SleepAfter, "sleep_mode", p.SleepMode, "stop_after", p.StopAfter, "reused_data", reused,
		"init", len(p.Init), "settings", fmtSettings(p.Settings))
	return d.apiProject(p), nil
}

// Remove implements admin.Service.
func (d *Daemon) Remove(ctx context.Context, name string, volumes bool) error {
	p, err := d.store.Get(name)
	if err != nil {
		return apiErr(err)
	}
	if p.Adopted != "" && volumes {
		return admin.Invalid(fmt.Errorf("project %q is %s, which pgwake adopted and does not own: pgwake never deletes its data (`pgwake rm %s` without --volumes forgets it)", name, p.Adopted, name))
	}
	if !d.claimName(name) {
		return admin.Conflict(fmt.Errorf("project %q is being created or removed right now", name))
	}
	defer d.releaseName(name)
	if err := d.srv.RemoveProject(name); err != nil && !errors.Is(err, proxy.ErrNoProject) {
		return err
	}
	defer d.hub.changed(name)
	d.closeProjectPort(name)
	if err := d.backendOf(p).Remove(ctx, spec(p), volumes); err != nil {
		// Put it back so the user can retry; the data is untouched.
		_ = d.srv.AddProject(ctx, d.proxyProject(p))
		d.openProjectPort(p)
		return apiErr(err)
	}
	// An adopted server's credentials are its owner's: nothing is kept.
	if err := d.store.Remove(name, !volumes && p.Adopted == ""); err != nil {
		return apiErr(err)
	}
	d.removeInit(name)
	d.log.Info("project removed", "project", name, "volumes", volumes, "adopted", p.Adopted)
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
	if p, err := d.store.Get(name); err == nil {
		if cat := d.backendOf(p).catalog(context.Background()); cat != nil {
			// Other pgwakes of the namespace see the pin too.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := cat.Save(ctx, record(p))
			cancel()
			if err != nil {
				return err
			}
		}
	}
	return apiErr(d.srv.SetPinned(name, pinned))
}

// Logs implements admin.Service.
func (d *Daemon) Logs(ctx context.Context, name string, follow bool, tail int) (io.ReadCloser, error) {
	p, err := d.store.Get(name)
	if err != nil {
		return nil, apiErr(err)
	}
	return d.backendOf(p).Logs(ctx, spec(p), follow, tail)
}

// Shutdown implements admin.Service.
func (d *Daemon) Shutdown(volumes bool) {
	d.shutdownOnce.Do(func() {
		d.shutdownVolumes = volumes
		close(d.shutdownCh)
	})
}

// removeOnShutdown removes ephemeral projects, or all with volumes, data
// included. Only what pgwake created is touched: its own projects and,
// with all, whatever else carries this instance's labels on each backend
// (leftovers of failed operations or of a crashed pgwake, data kept by
// rm).
func (d *Daemon) removeOnShutdown(ctx context.Context, all bool) error {
	var errs []error
	for _, p := range d.store.Projects() {
		if !all && !p.Ephemeral {
			continue
		}
		if p.Adopted != "" {
			// Not pgwake's to delete; other pgwakes may serve it still.
			d.log.Info("adopted project left as it is", "project", p.Name, "object", p.Adopted)
			continue
		}
		if err := d.backendOf(p).Remove(ctx, spec(p), true); err != nil {
			errs = append(errs, fmt.Errorf("remove project %q: %w", p.Name, err))
			continue
		}
		if err := d.store.Remove(p.Name, false); err != nil {
			errs = append(errs, err)
			continue
		}
		d.removeInit(p.Name)
		d.log.Info("project removed with its data", "project", p.Name, "ephemeral", p.Ephemeral)
	}
	if !all {
		return errors.Join(errs...)
	}
	// Backends that hold only kept data are connected for the sweep alone.
	for _, c := range d.store.Kept() {
		if d.backends[c.Backend] != nil {
			continue
		}
		be, err := d.opts.Connect(ctx, c.Backend, d.cfg, d.store.Instance(), d.log)
		if err != nil {
			d.log.Warn("data kept by rm on an unavailable backend is left", "backend", c.Backend, "err", err)
		}
		d.addBackend(newLazyBackend(c.Backend, be, err, nil, 0, d.log))
	}
	for _, name := range slices.Sorted(maps.Keys(d.backends)) {
		if err := d.backends[name].RemoveAll(ctx, true); err != nil {
			if !errors.Is(err, backend.ErrUnavailable) {
				errs = append(errs, fmt.Errorf("remove everything on %s: %w", name, err))
			}
			continue
		}
		if err := d.store.ForgetKept(name); err != nil {
			errs = append(errs, err)
		}
		d.log.Info("removed everything of this instance", "backend", name)
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
		req := DeclaredRequest(pc)
		init, err := declaredInit(pc)
		if err != nil {
			return fmt.Errorf("declared project %q: %w", pc.Name, err)
		}
		req.Init = init
		_, err = d.Create(ctx, req)
		if errors.Is(err, state.ErrExists) {
			continue // created meanwhile (an `up -d` run again)
		}
		if err != nil {
			return fmt.Errorf("declared project %q: %w", pc.Name, err)
		}
	}
	return nil
}

// DeclaredRequest is the create request for a project pgwake.yaml declares.
func DeclaredRequest(pc config.ProjectConfig) admin.CreateRequest {
	req := admin.CreateRequest{Name: pc.Name, Image: pc.Image, SleepMode: pc.SleepMode}
	if pc.SleepAfter != nil {
		req.SleepAfter = pc.SleepAfter.String()
	}
	if pc.StopAfter != nil {
		req.StopAfter = pc.StopAfter.String()
	}
	if pc.Ephemeral {
		req.Ephemeral = &pc.Ephemeral
	}
	req.Settings = pc.Settings
	return req
}

// advertiseAddr is where this pgwake's peers send it CancelRequests:
// kubernetes.peer_address when set; else, in a pod, the Pod's IP
// (POD_IP, from the downward API) with the proxy's port; else the proxy's
// own address, unless it listens on every interface (no single address
// names it; peers then cannot forward to it, and say so in their log).
func advertiseAddr(explicit string, ln net.Addr) string {
	if explicit != "" {
		return explicit
	}
	host, port, err := net.SplitHostPort(ln.String())
	if err != nil {
		return ""
	}
	if ip := os.Getenv("POD_IP"); ip != "" {
		return net.JoinHostPort(ip, port)
	}
	if a := net.ParseIP(host); a == nil || a.IsUnspecified() {
		return ""
	}
	return ln.String()
}
