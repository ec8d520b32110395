// Package proxy is pgwake's Postgres wire-protocol proxy: it reads a
// client's first packets, routes it to a project (by port, USER.PROJECT user
// name, database name or TLS server name), wakes the
// project's server once however many clients arrive, replays the startup
// packet once Postgres really serves, and then pipes bytes. For a project
// whose password pgwake holds, it authenticates the project's user itself
// (SCRAM) before anything wakes.
//
// The files split by direction of calls: server.go accepts, routes and
// orchestrates shutdown; conn.go is one client connection; auth.go its
// SCRAM exchange and pgwake's own login to the server, throttle.go the
// failed-login limit; project.go is one project's state machine (wake,
// readiness, sleep, adoption); and upstream.go dials project servers.
// Calls go downward only.
package proxy

import (
	"container/list"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"runtime/debug"
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
	Logger *slog.Logger

	WakeTimeout time.Duration // start until Postgres serves
	// FirstStartTimeout bounds a new project's first start instead, which
	// runs initdb: seconds on a quiet machine, more than a minute on a
	// loaded CI runner. Never shorter than WakeTimeout.
	FirstStartTimeout time.Duration
	StopTimeout       time.Duration // one sleep call
	StartupTimeout    time.Duration // client's first packets
	GracePeriod       time.Duration // no idle sleep this soon after a wake
	SweepInterval     time.Duration // how often idle projects are checked
	ReadyPoll         time.Duration // readiness probe interval during a wake
	StatusInterval    time.Duration // how often a wake asks the runtime whether the server still runs
	BackoffBase       time.Duration // first delay after a failed wake
	BackoffMax        time.Duration
	MaxConns          int // all projects together
	MaxProjectConns   int // one project
	// MaxStartupConns bounds connections that have not yet sent a complete
	// startup packet. Past it the oldest such connection is closed: a
	// flood of silent sockets cannot exhaust file descriptors, and a real
	// client, which sends its startup packet at once, still gets through.
	MaxStartupConns int

	// Failed logins per client address: AuthFailureBurst pass, then one
	// per AuthFailureEvery; an attempt that would wait longer than
	// AuthMaxWait for its turn is refused (53300) at once.
	AuthFailureBurst int
	AuthFailureEvery time.Duration
	AuthMaxWait      time.Duration

	// TLS, if set, is offered to clients (SSLRequest answered 'S', direct
	// TLS accepted); nil answers 'N'.
	TLS *tls.Config
	// UpstreamTLS, if set, is required on connections to project servers
	// (for servers reached over a network); nil connects in plaintext.
	UpstreamTLS *tls.Config

	// Cancels, if set, routes CancelRequests among the pgwake processes
	// serving the same projects: the keys this proxy issues carry its tag,
	// and a key with another's is forwarded to it.
	Cancels CancelRouter

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

// DefaultMaxStartupConns is MaxStartupConns's default.
const DefaultMaxStartupConns = 1000

func (o *Options) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.WakeTimeout, 60*time.Second)
	def(&o.FirstStartTimeout, 5*time.Minute)
	o.FirstStartTimeout = max(o.FirstStartTimeout, o.WakeTimeout)
	def(&o.StopTimeout, 150*time.Second)
	def(&o.StartupTimeout, 10*time.Second)
	def(&o.SweepInterval, time.Second)
	def(&o.ReadyPoll, 10*time.Millisecond)
	def(&o.StatusInterval, 100*time.Millisecond)
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
	def(&o.AuthFailureEvery, time.Second)
	def(&o.AuthMaxWait, 3*time.Second)
	if o.AuthFailureBurst <= 0 {
		o.AuthFailureBurst = 10
	}
	if o.MaxStartupConns <= 0 {
		o.MaxStartupConns = DefaultMaxStartupConns
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Server is the proxy. Create it with New, add projects, then Serve.
type Server struct {
	opts Options
	log  *slog.Logger
	env  *env // what every project is given
	up   *upstream

	// baseCtx outlives client connections: wakes and sleeps run on it and
	// end only when the server is closed for good.
	baseCtx    context.Context
	baseCancel context.CancelFunc
	// connCtx is the clients' context: it ends when a shutdown's drain
	// time is over (parked clients then get 57P01) or on Close.
	connCtx    context.Context
	connCancel context.CancelFunc

	mu        sync.Mutex
	projects  map[string]*project
	watched   map[backend.Backend]bool
	serving   bool // Serve has started: new backends are watched at once
	listeners map[net.Listener]struct{}
	conns     map[*clientConn]struct{}
	sessions  int           // conns accepted before a shutdown began
	drained   chan struct{} // made when a shutdown begins; closed once sessions reaches 0
	closing   bool
	closingCh chan struct{} // closed when closing is set
	startup   list.List     // of *clientConn that have not sent a startup packet, oldest first

	cancels  cancelRegistry
	refusals refusalLog
	throttle *authThrottle
	leaf     *x509.Certificate // the TLS certificate clients are shown, for channel binding

	total    atomic.Int64
	connWG   sync.WaitGroup
	acceptWG sync.WaitGroup
	loopWG   sync.WaitGroup // sweep and watch loops
}

// New returns a Server with no projects.
func New(opts Options) (*Server, error) {
	opts.setDefaults()
	base, baseCancel := context.WithCancel(context.Background())
	connCtx, connCancel := context.WithCancel(context.Background())
	s := &Server{
		opts:       opts,
		log:        opts.Logger,
		up:         &upstream{tls: opts.UpstreamTLS},
		baseCtx:    base,
		baseCancel: baseCancel,
		connCtx:    connCtx,
		connCancel: connCancel,
		projects:   make(map[string]*project),
		watched:    make(map[backend.Backend]bool),
		listeners:  make(map[net.Listener]struct{}),
		conns:      make(map[*clientConn]struct{}),
		closingCh:  make(chan struct{}),
	}
	s.refusals.init(opts.Logger)
	s.throttle = newAuthThrottle(opts.AuthFailureEvery, opts.AuthFailureBurst, opts.AuthMaxWait)
	s.leaf = servedLeaf(opts.TLS)
	s.env = &env{
		now: time.Now, log: opts.Logger, up: s.up, base: base, wakeBase: connCtx,
		onChange: opts.OnChange, onWake: opts.OnWake,
		wakeTimeout: opts.WakeTimeout, firstTimeout: opts.FirstStartTimeout, stopTimeout: opts.StopTimeout, grace: opts.GracePeriod,
		readyPoll: opts.ReadyPoll, statusEvery: opts.StatusInterval, maxConns: opts.MaxProjectConns,
		backoff: s.backoff,
	}
	return s, nil
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
// its backend reports. A backend that does not answer does not fail the
// registration: the project stays asleep with the error recorded, and its
// clients are told.
func (s *Server) AddProject(ctx context.Context, cfg Project) error {
	if cfg.Backend == nil {
		return fmt.Errorf("project %q: no backend", cfg.Spec.Name)
	}
	p := newProject(cfg, s.env)
	p.adopt(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return fmt.Errorf("project %q: %w", cfg.Spec.Name, errShuttingDown)
	}
	if _, ok := s.projects[cfg.Spec.Name]; ok {
		return fmt.Errorf("%w: %q", ErrProjectExists, cfg.Spec.Name)
	}
	s.projects[cfg.Spec.Name] = p
	if s.serving {
		s.watchLocked(cfg.Backend)
	}
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
	inflight := p.remove() // no new wake or sleep starts from here
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

func (s *Server) projectList() []*project {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*project, 0, len(s.projects))
	for _, p := range s.projects {
		out = append(out, p)
	}
	return out
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
	return p.sleepNow(ctx)
}

// HoldStop says whether a hold stops an awake server, and how.
type HoldStop int

const (
	// HoldNoStop: an awake server is ErrAwake.
	HoldNoStop HoldStop = iota
	// HoldStopDiscard: shut down at once, where the backend can
	// (backend.Killer), for data about to be replaced (a reset); cleanly
	// when clients are forced out, so that they get FATAL 57P01.
	HoldStopDiscard
)

// HoldAsleep runs fn while the project's server is asleep and held so:
// clients that connect meanwhile wait, and wake it when fn is done. An
// awake server is ErrAwake with HoldNoStop; else it is shut down first,
// which one with clients is only with force (their sessions end with
// FATAL 57P01), else a *BusyError. why names the hold in the project's
// history ("reset to snapshot x").
func (s *Server) HoldAsleep(ctx context.Context, name string, stop HoldStop, force bool, why string, fn func(context.Context) error) error {
	p := s.project(name)
	if p == nil {
		return fmt.Errorf("%w: %q", ErrNoProject, name)
	}
	return p.holdAsleep(ctx, stop, force, why, fn)
}

// WithAwake runs fn while the project's server is awake: woken first if it
// sleeps, and kept awake (fn counts as a client) until fn returns.
func (s *Server) WithAwake(ctx context.Context, name string, fn func(context.Context) error) error {
	p := s.project(name)
	if p == nil {
		return fmt.Errorf("%w: %q", ErrNoProject, name)
	}
	return p.withAwake(ctx, fn)
}

// SetPinned pins a project awake (it is never put to sleep on idle) or
// unpins it.
func (s *Server) SetPinned(name string, pinned bool) error {
	return s.setConfig(name, func(c *Project) { c.Pinned = pinned })
}

// SetSleepAfter changes how long a project stays awake without clients
// (zero: never on idle).
func (s *Server) SetSleepAfter(name string, d time.Duration) error {
	return s.setConfig(name, func(c *Project) { c.SleepAfter = d })
}

// SetSettings changes the server settings a project's next start applies
// (a running server keeps its own until it sleeps).
func (s *Server) SetSettings(name string, settings map[string]string) error {
	return s.setConfig(name, func(c *Project) { c.Spec.Settings = maps.Clone(settings) })
}

// SetPassword changes the password a project's clients log in with and
// pgwake logs in to the server with; pending, if set, is a second one the
// server may have (see Project.PendingPassword).
func (s *Server) SetPassword(name, password, pending string) error {
	return s.setConfig(name, func(c *Project) { c.Spec.Password, c.PendingPassword = password, pending })
}

// setConfig changes a running project's settings.
func (s *Server) setConfig(name string, set func(*Project)) error {
	p := s.project(name)
	if p == nil {
		return fmt.Errorf("%w: %q", ErrNoProject, name)
	}
	p.mu.Lock()
	set(&p.cfg)
	p.mu.Unlock()
	p.notify()
	return nil
}

// Serve accepts clients on ln until ctx ends, or Shutdown or Close closes
// the listeners. It also runs the idle sweep and follows the backends' events.
// It returns nil after a clean shutdown.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.mu.Lock()
	if !s.serving && !s.closing {
		s.serving = true
		s.loopWG.Add(1)
		go s.sweepLoop()
		for _, p := range s.projects {
			s.watchLocked(p.be)
		}
	}
	s.mu.Unlock()
	return s.accept(ctx, ln, "")
}

// ServeProject accepts clients on a listener dedicated to one project
// (port routing): every client reaches that project, whatever database
// name it sends. Run it alongside Serve.
func (s *Server) ServeProject(ctx context.Context, ln net.Listener, project string) error {
	return s.accept(ctx, ln, project)
}

func (s *Server) accept(ctx context.Context, ln net.Listener, fixed string) error {
	s.mu.Lock()
	if s.listeners == nil { // closed for good
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.listeners[ln] = struct{}{}
	s.acceptWG.Add(1)
	s.mu.Unlock()
	defer s.acceptWG.Done()
	defer func() {
		s.mu.Lock()
		if s.listeners != nil {
			delete(s.listeners, ln)
		}
		s.mu.Unlock()
	}()
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
		var evict *clientConn
		s.mu.Lock()
		s.conns[c] = struct{}{}
		c.late = s.closing
		if !c.late {
			s.sessions++
		}
		c.startupElem = s.startup.PushBack(c)
		if s.startup.Len() > s.opts.MaxStartupConns {
			evict = s.startup.Remove(s.startup.Front()).(*clientConn)
			evict.startupElem = nil
		}
		s.connWG.Add(1)
		s.mu.Unlock()
		if evict != nil {
			s.refusals.evicted()
			evict.close()
		}
		go c.serve(s.connCtx)
	}
}

// closeDrainedLocked closes drained once a shutdown has begun and no
// session is left. s.mu must be held.
func (s *Server) closeDrainedLocked() {
	if s.closing && s.sessions == 0 {
		select {
		case <-s.drained:
		default:
			close(s.drained)
		}
	}
}

// admit ends c's startup phase (it is no longer evictable) and decides, in
// one step with a shutdown's start, whether it is served: a connection
// that completes its startup packet once a shutdown began is answered
// 57P01.
func (s *Server) admit(c *clientConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.startupElem != nil {
		s.startup.Remove(c.startupElem)
		c.startupElem = nil
	}
	return !s.closing
}

func (s *Server) forget(c *clientConn) {
	s.mu.Lock()
	delete(s.conns, c)
	if c.startupElem != nil {
		s.startup.Remove(c.startupElem)
		c.startupElem = nil
	}
	if !c.late {
		s.sessions--
		s.closeDrainedLocked()
	}
	s.mu.Unlock()
	s.connWG.Done()
}

// Shutdown stops the server truthfully. Clients connecting from now on
// are answered 57P01 (admin shutdown) rather than refused. Sessions get
// until ctx's deadline to finish; then clients still parked for a wake get
// 57P01, and every project's server is put to sleep with a fast shutdown
// while its sessions are still attached, so Postgres itself ends each one
// with FATAL 57P01 at a message boundary. Then the listeners close.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.setClosingLocked()
	// A connection that has not sent its startup packet yet is not a
	// session to wait for: it gets 57P01 once it does.
	for e := s.startup.Front(); e != nil; e = e.Next() {
		if c := e.Value.(*clientConn); !c.late {
			c.late = true
			s.sessions--
		}
	}
	s.closeDrainedLocked()
	drained := s.drained
	s.mu.Unlock()

	select {
	case <-drained:
	case <-ctx.Done():
		s.mu.Lock()
		n := s.sessions
		s.mu.Unlock()
		s.log.Warn("drain time over; ending open sessions with 57P01 (admin shutdown)", "count", n)
	}
	s.connCancel() // parked clients: 57P01

	var errs []error
	var wg sync.WaitGroup
	var emu sync.Mutex
	for _, p := range s.projectList() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.shutdown(); err != nil {
				emu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", p.name, err))
				emu.Unlock()
			}
		}()
	}
	wg.Wait()
	s.closeListeners()
	// What is left has no server behind it any more (or one that would not
	// stop): close it.
	s.closeConns()
	s.connWG.Wait()
	s.baseCancel()
	s.loopWG.Wait()
	s.refusals.flush()
	return errors.Join(errs...)
}

// closeListeners stops every accept loop and waits for them, so no
// connection is added after it returns.
func (s *Server) closeListeners() {
	s.mu.Lock()
	lns := s.listeners
	s.listeners = nil
	s.mu.Unlock()
	for ln := range lns {
		ln.Close()
	}
	s.acceptWG.Wait()
}

func (s *Server) closeConns() {
	s.mu.Lock()
	victims := make([]*clientConn, 0, len(s.conns))
	for c := range s.conns {
		victims = append(victims, c)
	}
	s.mu.Unlock()
	for _, c := range victims {
		c.close()
	}
}

// Close aborts everything without putting projects to sleep (for tests and
// for a second signal).
func (s *Server) Close() {
	s.mu.Lock()
	s.setClosingLocked()
	s.mu.Unlock()
	s.connCancel()
	s.closeListeners()
	s.closeConns()
	s.baseCancel()
	s.refusals.flush()
}

func (s *Server) sweepLoop() {
	defer s.loopWG.Done()
	t := time.NewTicker(s.opts.SweepInterval)
	defer t.Stop()
	flooded := false
	for {
		select {
		case <-s.baseCtx.Done():
			return
		case <-t.C:
		}
		s.throttle.prune()
		if s.refusals.flush() > 0 {
			flooded = true
		} else if flooded && s.startupLen() < s.opts.MaxStartupConns/10 {
			// A flood of silent sockets has passed. Go returns the memory
			// their goroutines used to the OS only slowly (measured: RSS
			// stayed 50% above idle 30 s after a 19000-socket flood); give
			// it back now, once per flood.
			flooded = false
			debug.FreeOSMemory()
		}
		if s.isClosing() {
			continue // Shutdown puts every project to sleep itself
		}
		for _, p := range s.projectList() {
			go p.maybeSleep()
		}
	}
}

// watchLocked follows b's events, once per backend. s.mu must be held.
func (s *Server) watchLocked(b backend.Backend) {
	w, ok := b.(backend.Watcher)
	if !ok || s.watched[b] {
		return
	}
	s.watched[b] = true
	s.loopWG.Add(1)
	go func() {
		defer s.loopWG.Done()
		for ev := range w.Watch(s.baseCtx) {
			if p := s.project(ev.Project); p != nil && p.be == b {
				p.observe(ev.State)
			}
		}
	}()
}

func (s *Server) setClosingLocked() {
	if !s.closing {
		s.closing = true
		close(s.closingCh)
		s.drained = make(chan struct{})
		if s.sessions == 0 {
			close(s.drained)
		}
	}
}

func (s *Server) startupLen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startup.Len()
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
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

// refuse sends an ErrorResponse, logs it with the project (rate-limited:
// a flood must not fill the disk) and closes.
func (s *Server) refuse(c net.Conn, project, code, msg, hint string) {
	if s.opts.OnRefused != nil {
		s.opts.OnRefused(project, code)
	}
	s.refusals.refused(project, code, msg, c.RemoteAddr())
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
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
