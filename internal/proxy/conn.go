package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/pgwire"
	"github.com/pgwake/pgwake/internal/relay"
)

// clientConn is one client connection. Both sockets are closed exactly
// once, by close, whichever path ends the connection.
type clientConn struct {
	srv        *Server
	conn       net.Conn // the raw TCP connection, or TLS over it
	fixed      string   // project of a per-project listener (port routing)
	serverName string   // TLS SNI, if any
	project    *project // set once routed; read under srv.mu by RemoveProject

	mu       sync.Mutex
	closed   bool
	upstream net.Conn
}

func (c *clientConn) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	up, conn := c.upstream, c.conn
	c.mu.Unlock()
	conn.Close()
	if up != nil {
		up.Close()
	}
}

// attach records the upstream socket so close also closes it. If the
// connection was closed meanwhile (shutdown, project removed) the upstream
// is closed at once and attach reports false.
func (c *clientConn) attach(up net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		up.Close()
		return false
	}
	c.upstream = up
	return true
}

func (c *clientConn) serve(ctx context.Context) {
	s := c.srv
	defer s.forget(c)
	defer c.close()

	_ = c.conn.SetDeadline(s.now().Add(s.opts.StartupTimeout))
	startup, ok := c.readStartup()
	if !ok {
		return
	}

	p, dbname, rewrite := c.route(startup)
	if p == nil {
		s.refuse(c.conn, dbname, pgwire.CodeInvalidCatalogName,
			fmt.Sprintf("project %q does not exist", dbname), s.knownProjectsHint())
		return
	}
	name := p.cfg.Spec.Name
	s.mu.Lock()
	c.project = p
	s.mu.Unlock()

	if !s.acquireTotal() {
		s.refuse(c.conn, name, pgwire.CodeTooManyConnections,
			"sorry, too many clients already (pgwake max_connections)", "")
		return
	}
	defer s.total.Add(-1)
	if ok, removed := p.acquire(); !ok {
		if removed {
			s.refuse(c.conn, name, pgwire.CodeInvalidCatalogName,
				fmt.Sprintf("project %q does not exist", name), s.knownProjectsHint())
			return
		}
		s.refuse(c.conn, name, pgwire.CodeTooManyConnections,
			fmt.Sprintf("sorry, too many clients already for project %q (pgwake max_project_connections)", name), "")
		return
	}
	defer p.release()

	p.mu.Lock()
	spec := p.cfg.Spec
	p.mu.Unlock()
	if rewrite {
		startup.Parameters["database"] = spec.Database
	}
	packet, err := pgwire.EncodeStartup(startup)
	if err != nil {
		s.refuse(c.conn, name, pgwire.CodeProtocolViolation, "invalid startup packet: "+err.Error(), "")
		return
	}

	// The client is parked here while the project wakes; its startup
	// deadline no longer applies, the wake deadline does.
	_ = c.conn.SetDeadline(time.Time{})
	// Only a client parked for a wake is watched for hanging up: on an
	// awake project the wait is one round trip, not worth a goroutine.
	wctx, stopWatch := ctx, func() []byte { return nil }
	if !p.running() {
		wctx, stopWatch = c.watchHangup(ctx)
	}
	up, first, err := s.dialReady(wctx, p, packet)
	early := stopWatch()
	if err != nil && errors.Is(context.Cause(wctx), errClientGone) {
		s.log.Debug("client hung up while parked", "project", name, "remote", c.conn.RemoteAddr())
		return
	}
	if err != nil {
		code, msg := pgwire.CodeConnectionFailure, err.Error()
		if s.isClosing() || ctx.Err() != nil {
			code, msg = pgwire.CodeAdminShutdown, "pgwake is shutting down"
		}
		s.refuse(c.conn, name, code, msg, "")
		return
	}
	if !c.attach(up) {
		return
	}
	if len(early) > 0 {
		if _, err := up.Write(early); err != nil {
			return
		}
	}
	in, out := pipe(c, first)
	if s.opts.OnConnDone != nil {
		s.opts.OnConnDone(name, in, out)
	}
}

// errClientGone is the cause of a parked client's context once it hung up.
var errClientGone = errors.New("client hung up")

// watchHangup watches a parked client: it sends nothing while it waits for
// an authentication request, so a read that returns an error means it hung
// up, and its wait (and its connection slot) can end before the wake does.
// stop ends the watch and returns any byte the client sent meanwhile, to be
// passed on. Plain TCP only: interrupting a TLS read is not safe.
func (c *clientConn) watchHangup(ctx context.Context) (context.Context, func() []byte) {
	tc, ok := c.conn.(*net.TCPConn)
	if !ok {
		return ctx, func() []byte { return nil }
	}
	ctx, cancel := context.WithCancelCause(ctx)
	var buf [1]byte
	var n int
	done := make(chan struct{})
	go func() {
		defer close(done)
		var err error
		n, err = tc.Read(buf[:])
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			cancel(errClientGone)
		}
	}()
	return ctx, func() []byte {
		_ = tc.SetReadDeadline(time.Unix(1, 0)) // in the past: unblocks the read
		<-done
		_ = tc.SetReadDeadline(time.Time{})
		cancel(nil)
		return buf[:n]
	}
}

// route picks the project for a startup message: the listener's own
// project (port routing), else the database name, else the TLS server name
// (SNI, "myapp.localhost" -> myapp). rewrite says whether the database
// name is the routing key, to be replaced by the project's real database.
func (c *clientConn) route(m *pgproto3.StartupMessage) (p *project, name string, rewrite bool) {
	s := c.srv
	db := m.Parameters["database"]
	if db == "" {
		db = m.Parameters["user"] // libpq's default, as Postgres does
	}
	if c.fixed != "" {
		p = s.project(c.fixed)
		return p, c.fixed, db == c.fixed
	}
	if p = s.project(db); p != nil {
		return p, db, true
	}
	if label, _, _ := strings.Cut(c.serverName, "."); label != "" {
		if p = s.project(label); p != nil {
			return p, label, false
		}
	}
	return nil, db, false
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// readStartup reads first packets until a StartupMessage. It answers
// SSLRequest with 'S' and a TLS handshake when TLS is on ('N' when off),
// accepts PG17 direct TLS (a ClientHello as the first byte, ALPN
// "postgresql" required), answers GSSENCRequest 'N', and forwards a
// CancelRequest without waking anything. It reports false when the
// connection is done.
func (c *clientConn) readStartup() (*pgproto3.StartupMessage, bool) {
	s := c.srv
	var first [1]byte
	if _, err := io.ReadFull(c.conn, first[:]); err != nil {
		// Closed before sending anything: nothing to answer or wake.
		return nil, false
	}
	var rd io.Reader = io.MultiReader(bytes.NewReader(first[:]), c.conn)
	encrypted := false
	if first[0] == tlsHandshakeRecord {
		if s.opts.TLS == nil {
			// A TLS client cannot read an ErrorResponse; Postgres closes too.
			s.log.Debug("direct TLS without TLS configured", "remote", c.conn.RemoteAddr())
			return nil, false
		}
		if !c.startTLS(first[:]) {
			return nil, false
		}
		rd, encrypted = c.conn, true
	}
	sawSSL, sawGSS := false, false
	for {
		pkt, err := pgwire.ReadPacket(rd)
		var perr *pgwire.ProtocolError
		switch {
		case err == nil:
		case errors.As(err, &perr):
			s.refuse(c.conn, "", pgwire.CodeProtocolViolation, perr.Msg, "")
			return nil, false
		case errors.Is(err, os.ErrDeadlineExceeded):
			s.refuse(c.conn, "", pgwire.CodeProtocolViolation, "timeout waiting for startup packet", "")
			return nil, false
		default:
			return nil, false
		}
		switch pkt.Kind {
		case pgwire.KindStartup:
			return pkt.Startup, true
		case pgwire.KindSSLRequest, pgwire.KindGSSEncRequest:
			// Each may come once, in either order, before the startup
			// message, and not inside TLS.
			if encrypted || (pkt.Kind == pgwire.KindSSLRequest && sawSSL) || (pkt.Kind == pgwire.KindGSSEncRequest && sawGSS) {
				s.refuse(c.conn, "", pgwire.CodeProtocolViolation, "unexpected encryption request", "")
				return nil, false
			}
			sawSSL = sawSSL || pkt.Kind == pgwire.KindSSLRequest
			sawGSS = sawGSS || pkt.Kind == pgwire.KindGSSEncRequest
			if pkt.Kind == pgwire.KindSSLRequest && s.opts.TLS != nil {
				if _, err := c.conn.Write([]byte{'S'}); err != nil {
					return nil, false
				}
				if !c.startTLS(nil) {
					return nil, false
				}
				rd, encrypted = c.conn, true
				continue
			}
			if _, err := c.conn.Write([]byte{'N'}); err != nil {
				return nil, false
			}
		case pgwire.KindCancel:
			s.forwardCancel(pkt.Cancel)
			return nil, false
		}
	}
}

// tlsHandshakeRecord is the first byte of a TLS ClientHello.
const tlsHandshakeRecord = 0x16

// alpnPostgres is the ALPN protocol PG17 direct TLS requires.
const alpnPostgres = "postgresql"

// startTLS runs the server side of a TLS handshake on the client connection
// and makes TLS the client connection. read holds the bytes of direct TLS
// already read (nil after an SSLRequest); direct TLS must negotiate ALPN
// "postgresql", as Postgres requires. Its bytes bypass splice, so the socket
// goes through relay.Conn.
func (c *clientConn) startTLS(read []byte) bool {
	s := c.srv
	direct := read != nil
	raw := relay.Conn(c.conn)
	if direct {
		raw = &prefixConn{Conn: raw, r: io.MultiReader(bytes.NewReader(read), raw)}
	}
	tc := tls.Server(raw, s.opts.TLS)
	if err := tc.Handshake(); err != nil {
		s.log.Debug("TLS handshake failed", "remote", c.conn.RemoteAddr(), "err", err)
		return false
	}
	st := tc.ConnectionState()
	if direct && st.NegotiatedProtocol != alpnPostgres {
		s.log.Debug("direct TLS without ALPN postgresql", "remote", c.conn.RemoteAddr())
		tc.Close()
		return false
	}
	c.mu.Lock()
	c.conn = tc
	c.mu.Unlock()
	c.serverName = st.ServerName
	return true
}

// prefixConn replays bytes already read (the peeked first byte) before
// reading from the connection.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (p *prefixConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// dialReady connects to the project's server, replays the startup packet
// and peeks at the first reply. A server that is still starting (57P03) or
// that closes without a byte (booting, shutting down, a port proxy with no
// server behind it yet) is retried until the wake deadline, so the client
// never sees either. It returns the upstream connection and the bytes of
// the first reply to pass on.
func (s *Server) dialReady(ctx context.Context, p *project, packet []byte) (net.Conn, []byte, error) {
	// Waiting for a wake is bounded by the wake's own deadline; the retry
	// budget starts once the project is awake, so a slow wake does not eat
	// it.
	addr, err := p.awake(ctx)
	if err != nil {
		return nil, nil, err
	}
	retryCtx, cancel := context.WithTimeout(ctx, s.opts.WakeTimeout)
	defer cancel()
	var lastErr error
	for attempt := 0; ; attempt++ {
		up, first, retry, err := s.tryUpstream(retryCtx, addr, packet)
		if err == nil {
			return up, first, nil
		}
		lastErr = keepReason(lastErr, err)
		if !retry && retryCtx.Err() == nil {
			return nil, nil, err
		}
		if attempt >= 2 {
			// Repeated failures on a server we believe is running: it may
			// have been stopped behind our back. Let awake re-check.
			p.recheck(retryCtx, addr)
		}
		select {
		case <-retryCtx.Done():
			return nil, nil, fmt.Errorf("timed out waiting for project %q to serve: %w", p.cfg.Spec.Name, lastErr)
		case <-time.After(s.opts.ReadyPoll):
		}
		if addr, err = p.awake(retryCtx); err != nil {
			return nil, nil, err
		}
	}
}

// tryUpstream dials addr, sends the startup packet and reads the first
// reply's header. retry reports whether the failure is one a booting server
// produces.
func (s *Server) tryUpstream(ctx context.Context, addr string, packet []byte) (_ net.Conn, first []byte, retry bool, err error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	up, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, true, fmt.Errorf("dial %s: %w", addr, err)
	}
	ok := false
	defer func() {
		if !ok {
			up.Close()
		}
	}()
	if dl, has := ctx.Deadline(); has {
		_ = up.SetDeadline(dl)
	}
	if s.opts.UpstreamTLS != nil {
		tc, retry, err := startUpstreamTLS(up, s.opts.UpstreamTLS, addr)
		if err != nil {
			return nil, nil, retry, err
		}
		up = tc
	}
	if _, err := up.Write(packet); err != nil {
		return nil, nil, true, fmt.Errorf("send startup packet: %w", err)
	}
	var h pgwire.ReplyHeader
	if n, err := io.ReadFull(up, h[:]); err != nil {
		if n == 0 && (errors.Is(err, io.EOF) || isReset(err)) {
			return nil, nil, true, errors.New("server closed the connection before replying")
		}
		return nil, nil, false, fmt.Errorf("read first reply: %w", err)
	}
	first = h[:]
	if h.Type() == 'E' {
		e, body, err := pgwire.DecodeUpstreamError(up, h)
		if err != nil {
			return nil, nil, false, err
		}
		if e.Code == pgwire.CodeCannotConnectNow {
			return nil, nil, true, fmt.Errorf("server not ready: %s", e.Message)
		}
		first = append(first, body...)
	}
	_ = up.SetDeadline(time.Time{})
	ok = true
	return up, first, false, nil
}

// sslRequest is the 8-byte SSLRequest packet.
var sslRequest = []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}

// startUpstreamTLS negotiates TLS with a Postgres server the libpq way
// (SSLRequest, 'S', handshake). A server that answers 'N' is refused: the
// operator asked for TLS. With no RootCAs in conf the certificate is not
// verified (sslmode=require); with them it is (verify-full).
func startUpstreamTLS(up net.Conn, conf *tls.Config, addr string) (net.Conn, bool, error) {
	if _, err := up.Write(sslRequest); err != nil {
		return nil, true, fmt.Errorf("send SSLRequest: %w", err)
	}
	var b [1]byte
	if n, err := io.ReadFull(up, b[:]); err != nil {
		if n == 0 && (errors.Is(err, io.EOF) || isReset(err)) {
			return nil, true, errors.New("server closed the connection before replying")
		}
		return nil, false, fmt.Errorf("read SSLRequest answer: %w", err)
	}
	if b[0] != 'S' {
		return nil, false, fmt.Errorf("server %s does not accept TLS (answered %q) but upstream TLS is required", addr, b[0])
	}
	c := conf.Clone()
	if c.ServerName == "" {
		host, _, _ := net.SplitHostPort(addr)
		c.ServerName = host
	}
	tc := tls.Client(relay.Conn(up), c)
	if err := tc.Handshake(); err != nil {
		return nil, false, fmt.Errorf("upstream TLS handshake: %w", err)
	}
	return tc, false, nil
}

// keepReason keeps the backend's own reason (57P03's message, say) over
// the deadline error that ends the last attempt.
func keepReason(prev, err error) error {
	if prev != nil && (isTimeout(err) || errors.Is(err, context.DeadlineExceeded)) {
		return prev
	}
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

// recheck asks the backend whether the server at addr still runs and marks
// the project down if not.
func (p *project) recheck(ctx context.Context, addr string) {
	p.mu.Lock()
	spec := p.cfg.Spec
	p.mu.Unlock()
	st, err := p.srv.opts.Backend.Status(ctx, spec)
	if err == nil && (st.State != backend.StateRunning || st.Addr != addr) {
		p.markDown(addr)
	}
}

// waitReady polls addr until Postgres accepts a startup packet: any reply
// other than 57P03 (authentication request, or even an authentication
// error) proves the server serves. The poll interval is short so readiness
// is seen within tens of milliseconds.
func (s *Server) waitReady(ctx context.Context, spec backend.Spec, addr string) error {
	probe := &pgproto3.StartupMessage{
		ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{
			"user": spec.User, "database": spec.Database, "application_name": "pgwake-probe",
		},
	}
	packet, err := probe.Encode(nil)
	if err != nil {
		return err
	}
	var lastErr error
	for {
		up, first, retry, err := s.tryUpstream(ctx, addr, packet)
		if err == nil {
			// Read the rest of the reply before closing: closing with
			// unread input resets the connection, and Postgres logs that.
			if h := pgwire.ReplyHeader(first[:5]); h.BodyLen() > 0 && h.BodyLen() < 1<<16 && len(first) == 5 {
				_ = up.SetReadDeadline(time.Now().Add(time.Second))
				_, _ = io.CopyN(io.Discard, up, int64(h.BodyLen()))
			}
			up.Close()
			return nil
		}
		if !retry && ctx.Err() == nil && !isTimeout(err) {
			return err
		}
		lastErr = keepReason(lastErr, err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("server did not become ready: %w", lastErr)
		case <-time.After(s.opts.ReadyPoll):
		}
	}
}

// pipe relays the startup phase from the server (learning the session's
// BackendKeyData for cancels), then copies bytes both ways until either
// side closes, then closes both. It returns the bytes each way. Between two
// *net.TCPConn, relay.Copy splices on Linux; with TLS on either side it
// copies through user space.
func pipe(c *clientConn, first []byte) (fromClient, toClient int64) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fromClient = copyClientToServer(c)
	}()
	toClient = copyServerToClient(c, first)
	c.close()
	<-done
	return fromClient, toClient
}

func copyClientToServer(c *clientConn) int64 {
	n, _ := relay.Copy(c.upstream, c.conn)
	c.close()
	return n
}

func copyServerToClient(c *clientConn, first []byte) int64 {
	n, key, err := relayStartup(c.conn, c.upstream, first)
	if key != nil {
		c.srv.cancels.add(key, c.upstream.RemoteAddr().String())
		defer c.srv.cancels.remove(key)
	}
	if err != nil {
		return n
	}
	m, _ := relay.Copy(c.conn, c.upstream)
	return n + m
}

// maxStartupMessage bounds one server message parsed during the startup
// phase; real ones are small.
const maxStartupMessage = 1 << 20

// relayStartup forwards the server's messages to the client, starting with
// the already-read first bytes (a header, or a whole error message), until
// ReadyForQuery or an error, and returns the BackendKeyData it saw.
func relayStartup(client io.Writer, up io.Reader, first []byte) (n int64, key []byte, err error) {
	write := func(b []byte) error {
		w, err := client.Write(b)
		n += int64(w)
		return err
	}
	if err := write(first); err != nil {
		return n, nil, err
	}
	if len(first) < 5 || first[0] == 'E' {
		return n, nil, nil // a whole error message was passed on
	}
	h := pgwire.ReplyHeader(first[:5])
	var buf []byte // reused: a dozen small messages per session
	for {
		body := h.BodyLen()
		if body < 0 || body > maxStartupMessage {
			return n, key, fmt.Errorf("server message of %d bytes during startup", body)
		}
		if cap(buf) < body {
			buf = make([]byte, body)
		}
		buf = buf[:body]
		if _, err := io.ReadFull(up, buf); err != nil {
			return n, key, err
		}
		if err := write(buf); err != nil {
			return n, key, err
		}
		switch h.Type() {
		case 'K':
			// Protocol 3.0: 4-byte pid + 4-byte key; 3.2 (PG18): up to 256.
			if len(buf) >= 8 {
				key = append([]byte(nil), buf...)
			}
		case 'Z', 'E':
			return n, key, nil
		}
		if _, err := io.ReadFull(up, h[:]); err != nil {
			return n, key, err
		}
		if err := write(h[:]); err != nil {
			return n, key, err
		}
	}
}
