package k8sbackend

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/pgwake/pgwake/internal/backend"
)

// forward is one port-forward to one run of a project's server: a
// loopback listener whose every connection is a stream through the API
// server to the Pod's port 5432 (client-go's port-forward, what `kubectl
// port-forward` runs). It is opened for a run ID and never reused for
// another: a new Pod gets a new forward, so a new address, and the proxy
// never relays a client to a run it did not check.
type forward struct {
	id     string
	addr   string
	cancel context.CancelFunc
	done   chan struct{}
	err    error // why it ended; read after done
}

func (f *forward) alive() bool {
	select {
	case <-f.done:
		return false
	default:
		return true
	}
}

func (f *forward) close() {
	f.cancel()
	<-f.done
}

// forwardFor returns the address of the project's port-forward for run
// id, opening one when there is none (or it broke: the API server
// restarted, the Pod went).
func (b *Backend) forwardFor(ctx context.Context, project, pod, id string) (string, error) {
	b.forwardMu.Lock()
	f := b.forwards[project]
	if f != nil && f.id == id && f.alive() {
		b.forwardMu.Unlock()
		return f.addr, nil
	}
	b.forwardMu.Unlock()
	v, err, _ := b.opening.Do(project+"\x00"+id, func() (any, error) {
		b.forwardMu.Lock()
		if f := b.forwards[project]; f != nil && f.id == id && f.alive() {
			b.forwardMu.Unlock()
			return f.addr, nil
		}
		b.forwardMu.Unlock()
		nf, err := b.openForward(ctx, project, pod, id)
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

// openForward opens a port-forward to pod's 5432 on a free loopback port,
// over WebSocket with SPDY as the fallback, as kubectl does.
func (b *Backend) openForward(ctx context.Context, project, pod, id string) (*forward, error) {
	u := b.cs.CoreV1().RESTClient().Post().Namespace(b.ns).Resource("pods").Name(pod).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(b.cfg)
	if err != nil {
		return nil, fmt.Errorf("port-forward to pod %s: %w", pod, err)
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	ws, err := portforward.NewSPDYOverWebsocketDialer(u, b.cfg)
	if err != nil {
		return nil, fmt.Errorf("port-forward to pod %s: %w", pod, err)
	}
	dialer = portforward.NewFallbackDialer(ws, dialer, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	fctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	log := b.log.With("project", project, "pod", pod)
	errOut := logWriter{func(s string) { log.Debug("port-forward", "msg", s) }}
	pf, err := portforward.NewOnAddressesWithContext(fctx, dialer, []string{"127.0.0.1"}, []string{"0:5432"}, ready, io.Discard, errOut)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("port-forward to pod %s: %w", pod, err)
	}
	f := &forward{id: id, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		f.err = pf.ForwardPorts()
		if fctx.Err() == nil {
			log.Info("port-forward ended; the next connection opens another", "err", f.err)
			b.changed.notify(backend.Event{Project: project, State: b.cachedState(project)})
		}
	}()
	select {
	case <-ready:
	case <-f.done:
		cancel()
		return nil, b.apiErr(f.err, "port-forward to pod "+pod)
	case <-ctx.Done():
		cancel()
		<-f.done
		return nil, fmt.Errorf("port-forward to pod %s: %w", pod, ctx.Err())
	}
	ports, err := pf.GetPorts()
	if err != nil || len(ports) == 0 {
		f.close()
		return nil, fmt.Errorf("port-forward to pod %s: no local port: %v", pod, err)
	}
	f.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(int(ports[0].Local)))
	log.Info("port-forward open", "addr", f.addr, "via", b.server)
	return f, nil
}

// logWriter turns what client-go's port-forward writes (one error per
// failed stream, for example while Postgres still boots) into log lines.
type logWriter struct{ fn func(string) }

func (w logWriter) Write(p []byte) (int, error) {
	if s := strings.TrimSpace(string(p)); s != "" {
		w.fn(s)
	}
	return len(p), nil
}
