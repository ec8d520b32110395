package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
)

// lazyBackend is a backend as the daemon holds it: connected, or not (yet)
// because its runtime did not answer. While it is not connected every call
// fails with an error that matches backend.ErrUnavailable and gives the
// reason, so the projects that live there are told why (their clients get
// 08006) instead of being served from somewhere else. A call made at least
// retryEvery after the last attempt tries to connect again; once that
// succeeds every call goes to the real backend. The proxy keeps this value
// for each project, so a backend that comes up later needs no replacing.
type lazyBackend struct {
	name       string
	connect    func(ctx context.Context) (backend.Backend, error)
	retryEvery time.Duration
	log        *slog.Logger

	mu         sync.Mutex
	be         backend.Backend // nil until connected
	err        error           // why it is not connected
	lastTry    time.Time
	connecting bool
	closed     bool
	ready      chan struct{} // closed once be is set
	advertised string        // where this process accepts cancels, for a backend that routes them
}

var (
	_ backend.Backend        = (*lazyBackend)(nil)
	_ backend.Logger         = (*lazyBackend)(nil)
	_ backend.Watcher        = (*lazyBackend)(nil)
	_ backend.Checker        = (*lazyBackend)(nil)
	_ backend.Sweeper        = (*lazyBackend)(nil)
	_ backend.PauseSupporter = (*lazyBackend)(nil)
	_ backend.Initializer    = (*lazyBackend)(nil)
	_ backend.InitChecker    = (*lazyBackend)(nil)
	_ backend.Describer      = (*lazyBackend)(nil)
	_ backend.Phaser         = (*lazyBackend)(nil)
	_ backend.Shared         = (*lazyBackend)(nil)
	_ cancelRouter           = (*lazyBackend)(nil)
)

// cancelRouter is a backend that routes CancelRequests among the pgwake
// processes sharing it (the kubernetes backend, through its peer Leases).
type cancelRouter interface {
	proxy.CancelRouter
	// Advertise says where this process accepts CancelRequests.
	Advertise(addr string)
}

// connectTimeout bounds one attempt to connect a backend (the Docker
// backend pings its engine for at most 5 s).
const connectTimeout = 10 * time.Second

// newLazyBackend returns name's backend: be if it connected (err nil), or
// one that is unavailable for err's reason and retries with connect.
func newLazyBackend(name string, be backend.Backend, err error, connect func(context.Context) (backend.Backend, error), retryEvery time.Duration, log *slog.Logger) *lazyBackend {
	l := &lazyBackend{name: name, connect: connect, retryEvery: retryEvery, log: log, ready: make(chan struct{}), lastTry: time.Now()}
	if err != nil {
		l.err = unavailable(name, err)
		return l
	}
	l.be = be
	close(l.ready)
	return l
}

// unavailableError keeps a connection failure's one-line reason as its
// message and matches backend.ErrUnavailable.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string   { return e.err.Error() }
func (e *unavailableError) Unwrap() []error { return []error{backend.ErrUnavailable, e.err} }

func unavailable(name string, err error) error {
	if errors.Is(err, backend.ErrUnavailable) {
		// The backend's own words already say what is unreachable
		// ("docker engine unreachable at unix:///...").
		return &unavailableError{oneLine(err)}
	}
	return &unavailableError{fmt.Errorf("%s backend unavailable: %w", name, oneLine(err))}
}

// oneLine keeps an error's chain but puts its message on one line.
func oneLine(err error) error {
	msg := err.Error()
	if !strings.Contains(msg, "\n") {
		return err
	}
	return &lineError{msg: strings.Join(strings.Fields(msg), " "), err: err}
}

type lineError struct {
	msg string
	err error
}

func (e *lineError) Error() string { return e.msg }
func (e *lineError) Unwrap() error { return e.err }

// get returns the connected backend, trying to connect when it is not and
// the last attempt is retryEvery old; otherwise the reason it is not.
func (l *lazyBackend) get(ctx context.Context) (backend.Backend, error) {
	l.mu.Lock()
	if l.be != nil {
		be := l.be
		l.mu.Unlock()
		return be, nil
	}
	if l.closed || l.connecting || l.connect == nil || time.Since(l.lastTry) < l.retryEvery {
		err := l.err
		l.mu.Unlock()
		return nil, err
	}
	l.connecting, l.lastTry = true, time.Now()
	l.mu.Unlock()

	// Detached from the caller: a caller's short deadline must not turn
	// the reason into "context deadline exceeded".
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), connectTimeout)
	be, err := l.connect(cctx)
	cancel()

	l.mu.Lock()
	defer l.mu.Unlock()
	l.connecting, l.lastTry = false, time.Now()
	switch {
	case err != nil:
		l.err = unavailable(l.name, err)
		return nil, l.err
	case l.closed:
		be.Close()
		return nil, l.err
	}
	l.be, l.err = be, nil
	if r, ok := be.(cancelRouter); ok && l.advertised != "" {
		r.Advertise(l.advertised)
	}
	close(l.ready)
	l.log.Info("backend connected; its projects are served again", "backend", l.name)
	return be, nil
}

// available reports whether the backend is connected, and if not why.
func (l *lazyBackend) available() (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.be != nil, l.err
}

// Name implements backend.Backend.
func (l *lazyBackend) Name() string { return l.name }

// Ensure implements backend.Backend.
func (l *lazyBackend) Ensure(ctx context.Context, spec backend.Spec) error {
	be, err := l.get(ctx)
	if err != nil {
		return err
	}
	return be.Ensure(ctx, spec)
}

// Start implements backend.Backend.
func (l *lazyBackend) Start(ctx context.Context, spec backend.Spec) (backend.Endpoint, error) {
	be, err := l.get(ctx)
	if err != nil {
		return backend.Endpoint{}, err
	}
	return be.Start(ctx, spec)
}

// Sleep implements backend.Backend.
func (l *lazyBackend) Sleep(ctx context.Context, spec backend.Spec, mode backend.SleepMode) error {
	be, err := l.get(ctx)
	if err != nil {
		return err
	}
	return be.Sleep(ctx, spec, mode)
}

// Status implements backend.Backend.
func (l *lazyBackend) Status(ctx context.Context, spec backend.Spec) (backend.Status, error) {
	be, err := l.get(ctx)
	if err != nil {
		return backend.Status{}, err
	}
	return be.Status(ctx, spec)
}

// Remove implements backend.Backend.
func (l *lazyBackend) Remove(ctx context.Context, spec backend.Spec, volumes bool) error {
	be, err := l.get(ctx)
	if err != nil {
		return err
	}
	return be.Remove(ctx, spec, volumes)
}

// Close implements backend.Backend. A connection attempt still running
// closes what it connects.
func (l *lazyBackend) Close() error {
	l.mu.Lock()
	be := l.be
	l.closed = true
	l.be = nil
	if l.err == nil {
		l.err = &unavailableError{fmt.Errorf("%s backend closed", l.name)}
	}
	l.mu.Unlock()
	if be == nil {
		return nil
	}
	return be.Close()
}

// Logs implements backend.Logger.
func (l *lazyBackend) Logs(ctx context.Context, spec backend.Spec, follow bool, tail int) (io.ReadCloser, error) {
	be, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	lg, ok := be.(backend.Logger)
	if !ok {
		return nil, fmt.Errorf("the %s backend cannot show logs", l.name)
	}
	return lg.Logs(ctx, spec, follow, tail)
}

// Watch implements backend.Watcher: the real backend's events once it is
// connected (nothing happens to its servers that pgwake could see before).
// The channel closes when ctx ends.
func (l *lazyBackend) Watch(ctx context.Context) <-chan backend.Event {
	out := make(chan backend.Event)
	go func() {
		defer close(out)
		select {
		case <-ctx.Done():
			return
		case <-l.ready:
		}
		l.mu.Lock()
		be := l.be
		l.mu.Unlock()
		w, ok := be.(backend.Watcher)
		if !ok {
			return
		}
		for ev := range w.Watch(ctx) {
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// Check implements backend.Checker.
func (l *lazyBackend) Check(ctx context.Context) error {
	be, err := l.get(ctx)
	if err != nil {
		return err
	}
	if c, ok := be.(backend.Checker); ok {
		return c.Check(ctx)
	}
	return nil
}

// SupportsPause implements backend.PauseSupporter. Unconnected, it does
// not refuse: the call that needs the backend reports why it cannot.
func (l *lazyBackend) SupportsPause() bool {
	l.mu.Lock()
	be := l.be
	l.mu.Unlock()
	if be == nil {
		// Known without connecting: the Kubernetes API has no freezer.
		return l.name != "kubernetes"
	}
	return backend.CanPause(be)
}

// Kill implements backend.Killer.
func (l *lazyBackend) Kill(ctx context.Context, spec backend.Spec) error {
	be, err := l.get(ctx)
	if err != nil {
		return err
	}
	return backend.Kill(ctx, be, spec)
}

// WillInitialize implements backend.Initializer.
func (l *lazyBackend) WillInitialize(ctx context.Context, spec backend.Spec) bool {
	be, err := l.get(ctx)
	return err == nil && backend.WillInitialize(ctx, be, spec)
}

// InitFailure implements backend.InitChecker; a backend that is not
// connected, or runs no init scripts, reports none.
func (l *lazyBackend) InitFailure(ctx context.Context, spec backend.Spec) error {
	be, err := l.get(ctx)
	if err != nil {
		return nil
	}
	if ic, ok := be.(backend.InitChecker); ok {
		return ic.InitFailure(ctx, spec)
	}
	return nil
}

// RemoveAll implements backend.Sweeper; a backend that cannot sweep has
// nothing more to remove than its projects.
func (l *lazyBackend) RemoveAll(ctx context.Context, volumes bool) error {
	be, err := l.get(ctx)
	if err != nil {
		return err
	}
	if sw, ok := be.(backend.Sweeper); ok {
		return sw.RemoveAll(ctx, volumes)
	}
	return nil
}

// catalog returns the connected backend as a backend.Catalog, or nil when
// it does not keep projects (or is not connected).
func (l *lazyBackend) catalog(ctx context.Context) backend.Catalog {
	be, err := l.get(ctx)
	if err != nil {
		return nil
	}
	c, _ := be.(backend.Catalog)
	return c
}

// Describe implements backend.Describer ("" when the backend has nothing
// to add or is not connected).
func (l *lazyBackend) Describe() string {
	l.mu.Lock()
	be := l.be
	l.mu.Unlock()
	if d, ok := be.(backend.Describer); ok {
		return d.Describe()
	}
	return ""
}

// Phase implements backend.Phaser.
func (l *lazyBackend) Phase(ctx context.Context, spec backend.Spec) string {
	l.mu.Lock()
	be := l.be
	l.mu.Unlock()
	if p, ok := be.(backend.Phaser); ok {
		return p.Phase(ctx, spec)
	}
	return ""
}

// Use implements backend.Shared. Before the backend connects there is
// nothing to publish to, and no server its projects' clients could use.
func (l *lazyBackend) Use(project string, u backend.Use) {
	l.mu.Lock()
	be := l.be
	l.mu.Unlock()
	if sh, ok := be.(backend.Shared); ok {
		sh.Use(project, u)
	}
}

// PeerUse implements backend.Shared: a backend no other process shares
// has no peers. One not connected yet has none this process could see,
// and cannot put a server to sleep anyway.
func (l *lazyBackend) PeerUse(ctx context.Context, project string) (backend.PeerUse, error) {
	l.mu.Lock()
	be := l.be
	l.mu.Unlock()
	if sh, ok := be.(backend.Shared); ok {
		return sh.PeerUse(ctx, project)
	}
	return backend.PeerUse{}, nil
}

// CancelTag implements proxy.CancelRouter.
func (l *lazyBackend) CancelTag() byte {
	l.mu.Lock()
	be := l.be
	l.mu.Unlock()
	if r, ok := be.(cancelRouter); ok {
		return r.CancelTag()
	}
	return 0
}

// CancelPeers implements proxy.CancelRouter.
func (l *lazyBackend) CancelPeers(ctx context.Context, tag byte) ([]string, error) {
	// Never connects: a CancelRequest (sent by anyone, unauthenticated)
	// must not make pgwake dial its runtime.
	l.mu.Lock()
	be := l.be
	l.mu.Unlock()
	if r, ok := be.(cancelRouter); ok {
		return r.CancelPeers(ctx, tag)
	}
	return nil, nil
}

// Advertise implements cancelRouter; a backend connected later is told
// when it connects.
func (l *lazyBackend) Advertise(addr string) {
	l.mu.Lock()
	l.advertised = addr
	be := l.be
	l.mu.Unlock()
	if r, ok := be.(cancelRouter); ok {
		r.Advertise(addr)
	}
}
