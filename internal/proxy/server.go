// Package proxy is pgwake's Postgres wire-protocol proxy: it reads a
// client's first packets, routes by database name to a project, wakes the
// project's server once however many clients arrive, replays the startup
// packet once Postgres really serves, and then pipes bytes.
package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/pgwire"
)

// Options configures a Server. Zero durations and limits take the defaults
// below.
type Options struct {
	Backend backend.Backend
	Logger  *slog.Logger

	WakeTimeout     time.Duration // start until Postgres serves
	StopTimeout     time.Duration // one sleep call
	StartupTimeout  time.Duration // client's first packets
	GracePeriod     time.Duration // no idle sleep this soon after a wake
	SweepInterval   time.Duration // how often idle projects are checked
	ReadyPoll       time.Duration // readiness probe interval during a wake
	BackoffBase     time.Duration // first delay after a failed wake
	BackoffMax      time.Duration
	MaxConns        int // all projects together
	MaxProjectConns int // one project

	// TLS, if set, is offered to clients (SSLRequest answered 'S', direct
	// TLS accepted); nil answers 'N'.
	TLS *tls.Config
	// UpstreamTLS, if set, is required on connections to project servers
	// (for servers reached over a network); nil connects in plaintext.
	UpstreamTLS *tls.Config

	// Hooks, called without locks held; all optional. OnChange follows any
	// change of a project's state or counts; OnWake every finished wake;
	// OnConnDone every proxied connection when it closes, with the bytes it
	// carried (counted by the relay, so the splice path stays); OnRefused
	// every connection refused with an ErrorResponse.
	OnChange   func(project string)
	OnWake     func(project string, took time.Duration, err error)
	OnConnDone func(project string, fromClient, toClient int64)
	OnRefused  func(project, sqlstate string)
}

func (o *Options) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.WakeTimeout, 60*time.Second)
	def(&o.StopTimeout, 150*time.Second)
	def(&o.StartupTimeout, 10*time.Second)
	def(&o.SweepInterval, time.Second)
	def(&o.ReadyPoll, 10*time.Millisecond)
	def(&o.BackoffBase, time.Second)
	def(&o.BackoffMax, time.Minute)
	if o.GracePeriod < 0 {
		o.GracePeriod = 0
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 1000
	}
	if o.MaxProjectConns <= 0 {
		o.MaxProjectConns = 100
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Server is the proxy. Create it with New, add projects, then Serve.
type Server struct {
	opts Options
	log  *slog.Logger
	now  func() time.Time

	// baseCtx outlives client connections: wakes and sleeps run on it and
	// end only when the server is closed for good.
	baseCtx    context.Context
	baseCancel context.CancelFunc

	mu       sync.Mutex
	projects map[string]*project
	conns    map[*clientConn]struct{}
	closing  bool

	cancels cancelRegistry

	total   atomic.Int64
	connWG  sync.WaitGroup
	sweepWG sync.WaitGroup
}

// New returns a Server with no projects.
func New(opts Options) (*Server, error) {
	if opts.Backend == nil {
		return nil, errors.New("proxy: no backend")
	}
	opts.setDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		opts:       opts,
		log:        opts.Logger,
		now:        time.Now,
		baseCtx:    ctx,
		baseCancel: cancel,
		projects:   make(map[string]*project),
		conns:      make(map[*clientConn]struct{}),
	}, nil
}

func (s *Server) notify(name string) {
	if s.opts.OnChange != nil {
		s.opts.OnChange(name)
	}
}

// backoff is the delay before the n-th consecutive failed wake may be
// retried: exponential, capped, so a broken project does not crash-loop.
func (s *Server) backoff(n int) time.Duration {
	d := s.opts.BackoffBase
	for i := 1; i < n && d < s.opts.BackoffMax; i++ {
		d *= 2
	}
	return min(d, s.opts.BackoffMax)
}

// ErrProjectExists and ErrNoProject are returned by the project methods.
var (
	ErrProjectExists = errors.New("project already exists")
	ErrNoProject     = errors.New("no such project")
)

// AddProject registers a project and adopts its server in whatever state
// the backend reports: a running server is Running (idle accounting starts
// now), anything else is Sleeping.
func (s *Server) AddProject(ctx context.Context, cfg Project) error {
	status, err := s.opts.Backend.Status(ctx, cfg.Spec)
	if err != nil {
		return fmt.Errorf("adopt project %q: %w", cfg.Spec.Name, err)
	}
	if cfg.SleepMode == "" {
		cfg.SleepMode = backend.SleepStop
	}
	p := &project{srv: s, cfg: cfg, state: StateSleeping, lastActive: s.now()}
	if status.State == backend.StateRunning {
		p.state, p.addr, p.wokeAt = StateRunning, status.Addr, s.now()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.projects[cfg.Spec.Name]; ok {
		return fmt.Errorf("%w: %q", ErrProjectExists, cfg.Spec.Name)
	}
	s.projects[cfg.Spec.Name] = p
	s.log.Info("project registered", "project", cfg.Spec.Name, "state", p.state, "backend_state", status.State)
	return nil
}

// RemoveProject unregisters a project and closes its connections. The
// caller removes its server from the backend.
func (s *Server) RemoveProject(name string) error {
	s.mu.Lock()
	p, ok := s.projects[name]
	delete(s.projects, name)
	var victims []*clientConn
	for c := range s.conns {
		if c.project == p {
			victims = append(victims, c)
		}
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoProject, name)
	}
	p.mu.Lock()
	p.removed = true // no new wake or sleep starts from here
	inflight := p.inFlight()
	p.mu.Unlock()
	for _, c := range victims {
		c.close()
	}
	// The caller removes the server next: a wake or sleep still running
	// would race it (recreating a container, or starting a postmaster in a
	// directory being deleted).
	if inflight != nil {
		<-inflight
	}
	return nil
}

func (s *Server) project(name string) *project {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.projects[name]
}

// ProjectNames returns the registered names, sorted.
func (s *Server) ProjectNames() []string {
	s.mu.Lock()
	names := make([]string, 0, len(s.projects))
	for n := range s.projects {
		names = append(names, n)
	}
	s.mu.Unlock()
	sort.Strings(names)
	return names
}

// Statuses returns a snapshot of every project, sorted by name.
func (s *Server) Statuses() []Status {
	var out []Status
	for _, n := range s.ProjectNames() {
		if p := s.project(n); p != nil {
			out = append(out, p.status())
		}
	}
	return out
}

// ProjectStatus returns one project's snapshot.
func (s *Server) ProjectStatus(name string) (Status, error) {
	p := s.project(name)
	if p == nil {
		return Status{}, fmt.Errorf("%w: %q", ErrNoProject, name)
	}
	return p.status(), nil
}

// Wake wakes a project and waits until it serves.
func (s *Server) Wake(ctx context.Context, name string) error {
	p := s.project(name)
	if p == nil {
		return fmt.Errorf("%w: %q", ErrNoProject, name)
	}
	// Holding a slot keeps the sweep away while we wait; the connection
	// count is what the sweep looks at.
	if ok, removed := p.acquire(); !ok {
		if removed {
			return fmt.Errorf("%w: %q", ErrNoProject, name)
		}
		return fmt.Errorf("project %q: too many connections", name)
	}
	defer p.release()
	_, err := p.awake(ctx)
	return err
}

// Sleep puts a running project to sleep now, unless clients are connected.
func (s *Server) Sleep(ctx context.Context, name string) error {
	p := s.project(name)
	if p == nil {
		return fmt.Errorf("%w: %q", ErrNoProject, name)
	}
	for {
		p.mu.Lock()
		switch {
		case p.state == StateSleeping:
			p.mu.Unlock()
			return nil
		case p.state == StateRunning && p.active > 0:
			n := p.active
			p.mu.Unlock()
			return fmt.Errorf("project %q has %d open connection(s)", name, n)
		case p.state == StateRunning:
			p.sleepLocked(p.cfg.SleepMode)
			return nil
		}
		// Waking or Stopping: wait for that to finish, then decide.
		ch := p.inFlight()
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// SetPinned pins a project awake (it is never put to sleep on idle) or
// unpins it.
func (s *Server) SetPinned(name string, pinned bool) error {
	p := s.project(name)
	if p == nil {
		return fmt.Errorf("%w: %q", ErrNoProject, name)
	}
	p.mu.Lock()
	p.cfg.Pinned = pinned
	p.mu.Unlock()
	s.notify(name)
	return nil
}

// Serve accepts clients on ln until ctx ends or Shutdown is called. It also
// runs the idle sweep and follows the backend's events. It returns nil after
// a clean shutdown.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.sweepWG.Add(1)
	go s.sweepLoop(ctx)
	if w, ok := s.opts.Backend.(backend.Watcher); ok {
		s.sweepWG.Add(1)
		go s.watchLoop(ctx, w)
	}
	return s.accept(ctx, ln, "")
}

// ServeProject accepts clients on a listener dedicated to one project
// (port routing): every client reaches that project, whatever database
// name it sends. Run it alongside Serve.
func (s *Server) ServeProject(ctx context.Context, ln net.Listener, project string) error {
	return s.accept(ctx, ln, project)
}

func (s *Server) accept(ctx context.Context, ln net.Listener, fixed string) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var tempDelay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of file descriptors and the like: back off, as net/http does.
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			tempDelay = min(max(2*tempDelay, 5*time.Millisecond), time.Second)
			s.log.Error("accept", "err", err, "retry_in", tempDelay)
			time.Sleep(tempDelay)
			continue
		}
		tempDelay = 0
		c := &clientConn{srv: s, conn: nc, fixed: fixed}
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			nc.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.connWG.Add(1)
		s.mu.Unlock()
		go c.serve(ctx)
	}
}

func (s *Server) forget(c *clientConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.connWG.Done()
}

// Shutdown stops the server: the listener must already be closed (cancel
// Serve's context). Client connections get until ctx's deadline to finish,
// then are closed; then every running project is put to sleep with a fast
// shutdown.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()

	drained := make(chan struct{})
	go func() { s.connWG.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-ctx.Done():
		s.mu.Lock()
		victims := make([]*clientConn, 0, len(s.conns))
		for c := range s.conns {
			victims = append(victims, c)
		}
		s.mu.Unlock()
		s.log.Warn("closing open connections", "count", len(victims))
		for _, c := range victims {
			c.close()
		}
		<-drained
	}

	var errs []error
	var wg sync.WaitGroup
	var emu sync.Mutex
	for _, name := range s.ProjectNames() {
		p := s.project(name)
		if p == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.mu.Lock()
			// Let a wake or sleep in flight finish first, then decide.
			for p.state == StateWaking || p.state == StateStopping {
				ch := p.inFlight()
				p.mu.Unlock()
				<-ch
				p.mu.Lock()
			}
			if p.state != StateRunning {
				paused := p.cfg.SleepMode == backend.SleepPause
				spec := p.cfg.Spec
				p.mu.Unlock()
				if paused {
					// Always a real stop: a paused server left behind by an
					// exiting pgwake would hold its memory with nobody to
					// wake it. Stopping a stopped server is a no-op.
					ctx, cancel := context.WithTimeout(context.Background(), s.opts.StopTimeout)
					if err := s.opts.Backend.Sleep(ctx, spec, backend.SleepStop); err != nil {
						emu.Lock()
						errs = append(errs, fmt.Errorf("%s: %w", name, err))
						emu.Unlock()
					}
					cancel()
				}
				return
			}
			p.sleepLocked(backend.SleepStop)
			p.mu.Lock()
			if p.lastErr != "" && !p.lastErrAt.Before(p.wokeAt) {
				emu.Lock()
				errs = append(errs, fmt.Errorf("%s: %s", name, p.lastErr))
				emu.Unlock()
			}
			p.mu.Unlock()
		}()
	}
	wg.Wait()
	s.baseCancel()
	s.sweepWG.Wait()
	return errors.Join(errs...)
}

// Close aborts everything without putting projects to sleep (for tests and
// for a second signal).
func (s *Server) Close() {
	s.mu.Lock()
	s.closing = true
	victims := make([]*clientConn, 0, len(s.conns))
	for c := range s.conns {
		victims = append(victims, c)
	}
	s.mu.Unlock()
	for _, c := range victims {
		c.close()
	}
	s.baseCancel()
}

func (s *Server) sweepLoop(ctx context.Context) {
	defer s.sweepWG.Done()
	t := time.NewTicker(s.opts.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.baseCtx.Done():
			return
		case <-t.C:
		}
		for _, name := range s.ProjectNames() {
			if p := s.project(name); p != nil {
				go p.maybeSleep(false)
			}
		}
	}
}

func (s *Server) watchLoop(ctx context.Context, w backend.Watcher) {
	defer s.sweepWG.Done()
	wctx, cancel := context.WithCancel(s.baseCtx)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	for ev := range w.Watch(wctx) {
		if p := s.project(ev.Project); p != nil {
			p.observe(ev.State)
		}
	}
}

// knownProjectsHint lists project names for the 3D000 hint.
func (s *Server) knownProjectsHint() string {
	names := s.ProjectNames()
	if len(names) == 0 {
		return "No projects exist yet; create one with: pgwake create NAME"
	}
	const maxNames = 20
	more := ""
	if len(names) > maxNames {
		more = fmt.Sprintf(" and %d more", len(names)-maxNames)
		names = names[:maxNames]
	}
	return "Known projects: " + strings.Join(names, ", ") + more
}

// acquireTotal takes a slot from the server-wide connection cap.
func (s *Server) acquireTotal() bool {
	if s.total.Add(1) > int64(s.opts.MaxConns) {
		s.total.Add(-1)
		return false
	}
	return true
}

// writeError sends an ErrorResponse and logs it with the project.
func (s *Server) refuse(c net.Conn, project, code, msg, hint string) {
	if s.opts.OnRefused != nil {
		s.opts.OnRefused(project, code)
	}
	s.log.Warn("connection refused", "project", project, "sqlstate", code, "reason", msg, "remote", c.RemoteAddr())
	_ = c.SetWriteDeadline(s.now().Add(5 * time.Second))
	if err := pgwire.WriteError(c, code, msg, hint); err != nil {
		s.log.Debug("write error response", "err", err)
		return
	}
	lingerClose(c)
}

// lingerClose sends FIN and briefly discards what the client still sends:
// closing a socket with unread input makes the kernel answer with a reset,
// which can destroy the error response before the client reads it.
func lingerClose(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	_ = tc.CloseWrite()
	_ = tc.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.Copy(io.Discard, io.LimitReader(tc, 64<<10))
}

// OpenConns is the number of client connections holding a slot.
func (s *Server) OpenConns() int { return int(s.total.Load()) }
