package k8sbackend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/streaming/pkg/httpstream"
)

// forward is one port-forward to one run of a project's server: a
// loopback listener whose every connection becomes a pair of streams
// (data and error) through the API server to the Pod's Postgres port, over
// one upgraded connection made with client-go's dialers (WebSocket, SPDY
// as fallback, as `kubectl port-forward`).
//
// client-go's PortForwarder is not used for the streams: it closes the
// whole upgraded connection, and with it its listener, on the first
// stream error (kubectl exits on one), and a proxy's readiness probes get
// one ("connection refused") every time while Postgres boots. Here the
// listener's address stays the run's for as long as the run lasts. After
// a stream error the upgraded connection takes no new streams (seen here:
// they time out after 30 s), so it is retired (closed once its sessions
// end) and the next client connection dials a new one, no sooner than
// redialPause after the failure: every new connection costs zlib header
// compressors on each end (about 1 MB), and probes every 10 ms would
// otherwise make one each (about 200 MB of garbage per wake under -race).
//
// A forward is opened for a run ID and never reused for another: a new
// Pod gets a new forward and so a new address, and the proxy never relays
// a client to a run it did not check.
type forward struct {
	id     string
	port   string // the Pod's port (5432, or an adopted workload's)
	addr   string
	ln     net.Listener
	dialer httpstream.Dialer
	log    *slog.Logger
	nextID atomic.Int64

	mu     sync.Mutex
	cur    *upgraded              // takes new streams; nil until dialled or after an error
	failAt time.Time              // when the last one was retired after an error
	all    map[*upgraded]struct{} // every open one, closed by close

	closeOnce sync.Once
	closing   chan struct{} // closed by close: connections end
	done      chan struct{} // closed when serve and every connection returned
}

// close ends the listener and every connection through it.
func (f *forward) close() {
	f.closeOnce.Do(func() {
		close(f.closing)
		f.ln.Close()
		f.mu.Lock()
		for u := range f.all {
			u.c.Close()
		}
		f.mu.Unlock()
		<-f.done
	})
}

// forwardFor returns the address of the project's port-forward for run
// id, opening one when there is none for that run.
func (b *Backend) forwardFor(ctx context.Context, project, pod, id string, port int) (string, error) {
	b.forwardMu.Lock()
	f := b.forwards[project]
	b.forwardMu.Unlock()
	if f != nil && f.id == id {
		return f.addr, nil
	}
	v, err, _ := b.opening.Do(project+"\x00"+id, func() (any, error) {
		b.forwardMu.Lock()
		if f := b.forwards[project]; f != nil && f.id == id {
			b.forwardMu.Unlock()
			return f.addr, nil
		}
		b.forwardMu.Unlock()
		nf, err := b.openForward(ctx, project, pod, id, port)
		if err != nil {
			return "", err
		}
		b.forwardMu.Lock()
		old := b.forwards[project]
		b.forwards[project] = nf
		b.forwardMu.Unlock()
		if old != nil {
			go old.close()
		}
		return nf.addr, nil
	})
	if err != nil {
		return "", err
	}
	return v.(string), nil
}

// dropForward closes the project's port-forward (it sleeps or goes).
func (b *Backend) dropForward(project string) {
	b.forwardMu.Lock()
	f := b.forwards[project]
	delete(b.forwards, project)
	b.forwardMu.Unlock()
	if f != nil {
		f.close()
	}
}

// openForward dials the API server's port-forward for pod (so that RBAC
// or an unreachable server fails here, not on a client's connection) and
// listens on a free loopback port.
func (b *Backend) openForward(ctx context.Context, project, pod, id string, port int) (*forward, error) {
	u := b.cs.CoreV1().RESTClient().Post().Namespace(b.ns).Resource("pods").Name(pod).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(b.cfg)
	if err != nil {
		return nil, fmt.Errorf("port-forward to pod %s: %w", pod, err)
	}
	dialer := spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	ws, err := portforward.NewSPDYOverWebsocketDialerForStreaming(u, b.cfg)
	if err != nil {
		return nil, fmt.Errorf("port-forward to pod %s: %w", pod, err)
	}
	dialer = portforward.NewFallbackDialerForStreaming(ws, dialer, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	f := &forward{
		id: id, port: strconv.Itoa(port), dialer: dialer, log: b.log.With("project", project, "pod", pod),
		closing: make(chan struct{}), done: make(chan struct{}), all: map[*upgraded]struct{}{},
	}
	type dialed struct {
		conn httpstream.Connection
		err  error
	}
	ch := make(chan dialed, 1)
	go func() {
		c, err := f.dial()
		ch <- dialed{c, err}
	}()
	select {
	case d := <-ch:
		if d.err != nil {
			return nil, b.apiErr(d.err, "port-forward to pod "+pod)
		}
		f.cur = &upgraded{c: d.conn}
		f.all[f.cur] = struct{}{}
	case <-ctx.Done():
		go func() {
			if d := <-ch; d.conn != nil {
				d.conn.Close()
			}
		}()
		return nil, fmt.Errorf("port-forward to pod %s: %w", pod, ctx.Err())
	}
	if f.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		f.cur.c.Close()
		return nil, fmt.Errorf("port-forward to pod %s: %w", pod, err)
	}
	f.addr = f.ln.Addr().String()
	go f.serve()
	f.log.Info("port-forward open", "addr", f.addr, "via", b.server)
	return f, nil
}

func (f *forward) dial() (httpstream.Connection, error) {
	c, proto, err := f.dialer.Dial(portforward.PortForwardProtocolV1Name)
	if err != nil {
		return nil, err
	}
	if proto != portforward.PortForwardProtocolV1Name {
		c.Close()
		return nil, fmt.Errorf("port-forward: the server speaks %q, not %q", proto, portforward.PortForwardProtocolV1Name)
	}
	return c, nil
}

// upgraded is one upgraded connection to the kubelet's port-forward and
// the client connections using it.
type upgraded struct {
	c       httpstream.Connection
	active  int
	retired bool
}

// acquire returns the upgraded connection new streams go on, dialling one
// when there is none (the last one saw an error, or broke: the API server
// restarted, a proxy timed it out).
func (f *forward) acquire() (*upgraded, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		if u := f.cur; u != nil {
			select {
			case <-u.c.CloseChan():
				f.cur = nil
				delete(f.all, u)
			default:
				u.active++
				return u, nil
			}
		}
		wait := time.Until(f.failAt.Add(redialPause))
		if wait <= 0 {
			break
		}
		f.mu.Unlock()
		select {
		case <-time.After(wait):
		case <-f.closing:
		}
		f.mu.Lock()
		select {
		case <-f.closing:
			return nil, net.ErrClosed
		default:
		}
	}
	c, err := f.dial()
	if err != nil {
		return nil, err
	}
	f.cur = &upgraded{c: c, active: 1}
	f.all[f.cur] = struct{}{}
	return f.cur, nil
}

// redialPause is the least time between a retired upgraded connection's
// failure and the next dial.
const redialPause = 100 * time.Millisecond

// release ends one client connection's use of u; failed retires u.
func (f *forward) release(u *upgraded, failed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	u.active--
	if failed && f.cur == u {
		f.cur, u.retired, f.failAt = nil, true, time.Now()
	}
	if u.retired && u.active == 0 {
		u.c.Close()
		delete(f.all, u)
	}
}

func (f *forward) serve() {
	defer close(f.done)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return // closed
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.handle(c)
		}()
	}
}

// handle relays one client connection over its own pair of streams.
func (f *forward) handle(c net.Conn) {
	defer c.Close()
	u, err := f.acquire()
	if err != nil {
		f.log.Warn("port-forward: cannot reach the API server", "err", err)
		return
	}
	failed := true
	defer func() { f.release(u, failed) }()
	conn := u.c
	h := http.Header{}
	h.Set(corev1.StreamType, corev1.StreamTypeError)
	h.Set(corev1.PortHeader, f.port)
	h.Set(corev1.PortForwardRequestIDHeader, strconv.FormatInt(f.nextID.Add(1), 10))
	errStream, err := conn.CreateStream(h)
	if err != nil {
		f.log.Debug("port-forward: error stream", "err", err)
		return // failed: this upgraded connection is retired
	}
	errStream.Close() // nothing to send on it
	defer conn.RemoveStreams(errStream)
	remoteErr := make(chan string, 1)
	go func() {
		msg, _ := io.ReadAll(errStream)
		remoteErr <- string(msg)
	}()
	h.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := conn.CreateStream(h)
	if err != nil {
		f.log.Debug("port-forward: data stream", "err", err)
		return
	}
	defer conn.RemoveStreams(data)
	failed = false

	fromPod := make(chan struct{})
	go func() {
		defer close(fromPod)
		_, _ = io.Copy(c, data)
	}()
	go func() {
		_, err := io.Copy(data, c)
		if err != nil && !errors.Is(err, net.ErrClosed) {
			_ = data.Reset()
			return
		}
		data.Close() // half-close: the client is done sending
	}()
	select {
	case <-fromPod:
	case <-f.closing:
	}
	// Discard what is unsent, so the error stream can be read.
	_ = data.Reset()
	msg := <-remoteErr
	failed = msg != ""
	if failed {
		// Expected while Postgres boots (connection refused): the client
		// sees the connection closed and the proxy's probe retries.
		f.log.Debug("port-forward: connection failed at the pod", "err", msg)
	}
}
