package proxy

import (
	"bytes"
	"container/list"
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
	// Guarded by srv.mu: late marks a connection accepted once a shutdown
	// began (answered 57P01, not waited for); startupElem is its place in
	// the server's list of connections still in their startup phase.
	late        bool
	startupElem *list.Element

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

	_ = c.conn.SetDeadline(time.Now().Add(s.opts.StartupTimeout))
	startup, ok := c.readStartup()
	if !ok {
		return
	}
	if !s.admit(c) {
		s.refuse(c.conn, "", pgwire.CodeAdminShutdown, "pgwake is shutting down", "")
		return
	}

	p, key := c.route(startup)
	if p == nil {
		s.refuse(c.conn, key, pgwire.CodeInvalidCatalogName,
			fmt.Sprintf("project %q does not exist", key), s.knownProjectsHint())
		return
	}
	name := p.name
	s.mu.Lock()
	c.project = p
	s.mu.Unlock()

	if !s.acquireTotal() {
		s.refuse(c.conn, name, pgwire.CodeTooManyConnections,
			"sorry, too many clients already (pgwake max_connections)", "")
		return
	}
	// The server-wide slot is given back before the project's, whose
	// release is announced (OnChange): whoever sees the project's count
	// drop must find the server's dropped too.
	totalHeld := true
	releaseTotal := func() {
		if totalHeld {
			totalHeld = false
			s.total.Add(-1)
		}
	}
	defer releaseTotal()

	// Authentication comes before the project's slot and any wake: a
	// client that cannot log in costs the project nothing.
	ip := clientIP(c.conn)
	paid, waited, err := s.throttle.admit(ctx, ip)
	if waited {
		p.countAuth(false, true)
	}
	var th *throttled
	if errors.As(err, &th) {
		s.refuse(c.conn, name, pgwire.CodeTooManyConnections,
			fmt.Sprintf("too many failed logins from %s; try again in %s", th.addr, th.retry.Round(time.Second)+time.Second), "")
		return
	}
	if err != nil {
		return
	}
	cred, err := p.credentials()
	if err != nil {
		s.refuse(c.conn, name, pgwire.CodeInternalError, err.Error(), "")
		return
	}
	if cred != nil && startup.Parameters["user"] != cred.user {
		cred = nil // another role: the server knows its password, pgwake does not
	}
	if cred != nil {
		if err := c.authenticate(cred); err != nil {
			s.throttle.failed(ip, paid)
			p.countAuth(true, false)
			var ae *authError
			if !errors.As(err, &ae) {
				s.log.Debug("authentication", "project", name, "remote", c.conn.RemoteAddr(), "err", err)
				return // the client went away
			}
			s.log.Info("authentication failed", "project", name, "remote", c.conn.RemoteAddr(), "err", ae.err)
			if ae.code == pgwire.CodeInvalidPassword {
				// Answered no sooner than the server itself would
				// (its fork and login, timed on pgwake's own), so a
				// wrong password is no faster to try here than
				// against Postgres.
				waitUntil(ctx, time.Now().Add(p.loginTime()))
			}
			s.refuse(c.conn, name, ae.code, ae.msg, "")
			return
		}
	}

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
	defer func() {
		releaseTotal()
		p.release()
	}()

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
	awake := p.running()
	if !awake {
		wctx, stopWatch = c.watchHangup(ctx)
	}
	w0, loginStart := 0, time.Now()
	if cred != nil && awake {
		w0 = p.wakeCount() // only pgwake's own logins are timed
	}
	up, first, err := p.connect(wctx, packet)
	if err == nil && cred != nil {
		up, first, err = c.login(wctx, p, up, first, packet, cred)
		if err == nil && awake {
			p.noteLogin(time.Since(loginStart), w0)
		}
	}
	early := stopWatch()
	if err != nil && errors.Is(context.Cause(wctx), errClientGone) {
		s.log.Debug("client hung up while parked", "project", name, "remote", c.conn.RemoteAddr())
		return
	}
	if err != nil {
		code, msg := pgwire.CodeConnectionFailure, err.Error()
		var held *HeldError
		if errors.As(err, &held) {
			code = pgwire.CodeCannotConnectNow
		}
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
		if cred != nil {
			// An authenticating client waits for AuthenticationOk; bytes
			// before it are not a session to pass on.
			return
		}
		if _, err := up.Write(early); err != nil {
			return
		}
	}
	in, out := pipe(c, first, func(code string) {
		if code == pgwire.CodeInvalidPassword && cred == nil {
			// The server refused a pass-through login: it counts
			// against the address like a failure at the proxy.
			s.throttle.failed(ip, paid)
			p.countAuth(true, false)
		}
	})
	if s.opts.OnConnDone != nil {
		s.opts.OnConnDone(name, in, out)
	}
}

// login logs in to the server on up with the project's password (and, if
// it is refused while a rotation is under way, with the pending one on a
// new connection), tells the authenticated client AuthenticationOk, and
// returns the header of the server's next message for relayStartup. A
// refusal the server sends is passed to the client as it is: first is
// then that whole ErrorResponse.
func (c *clientConn) login(ctx context.Context, p *project, up net.Conn, first, packet []byte, cred *credentials) (net.Conn, []byte, error) {
	for i, pw := range cred.passwords {
		if i > 0 {
			var err error
			if up, first, err = p.connect(ctx, packet); err != nil {
				return nil, nil, err
			}
		}
		ok, err := login(up, first, cred.user, pw, cred.logins)
		var le *loginError
		if errors.As(err, &le) && le.code == pgwire.CodeInvalidPassword && i < len(cred.passwords)-1 {
			up.Close()
			continue
		}
		if errors.As(err, &le) {
			c.srv.log.Warn("the server refused pgwake's login with the project's password", "project", p.name, "sqlstate", le.code)
			return up, le.msg, nil
		}
		if err != nil {
			up.Close()
			return nil, nil, fmt.Errorf("log in to project %q: %w", p.name, err)
		}
		if _, err := c.conn.Write(ok); err != nil {
			up.Close()
			return nil, nil, err
		}
		var h pgwire.ReplyHeader
		if _, err := io.ReadFull(up, h[:]); err != nil {
			up.Close()
			return nil, nil, fmt.Errorf("log in to project %q: %w", p.name, err)
		}
		return up, h[:], nil
	}
	return nil, nil, errors.New("no password to log in with")
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

// route picks the project for a startup message and rewrites the
// message's routing key, so the server sees what it would have seen from a
// direct connection:
//   - on a project's own port (port routing) every client reaches that
//     project and the database name passes through untouched;
//   - a user name USER.PROJECT (the multi-tenant pooler convention)
//     reaches PROJECT as USER, the database passed through;
//   - a database name that names a project reaches it, rewritten to the
//     project's real database;
//   - the TLS server name (SNI, "myapp.localhost" -> myapp), database
//     passed through.
//
// key is what the client asked for, for the 3D000 message when p is nil.
func (c *clientConn) route(m *pgproto3.StartupMessage) (p *project, key string) {
	s := c.srv
	params := m.Parameters
	user, db := params["user"], params["database"]
	if c.fixed != "" {
		// USER.PROJECT names this project too; strip it, as the shared
		// port does, so one user name works on both.
		if u, proj, ok := splitUserProject(user); ok && proj == c.fixed {
			setUser(params, user, u)
		}
		return s.project(c.fixed), c.fixed
	}
	if db == "" {
		db = user // libpq's default, as Postgres does
	}
	key = db
	if u, proj, ok := splitUserProject(user); ok {
		if p = s.project(proj); p != nil {
			setUser(params, user, u)
			return p, proj
		}
		key = proj
	}
	if p = s.project(db); p != nil {
		params["database"] = p.spec().Database
		return p, db
	}
	if label, _, _ := strings.Cut(c.serverName, "."); label != "" {
		if p = s.project(label); p != nil {
			return p, label
		}
	}
	return nil, key
}

// splitUserProject splits "USER.PROJECT" at its last dot: project names
// have no dots, user names may.
func splitUserProject(user string) (u, project string, ok bool) {
	i := strings.LastIndexByte(user, '.')
	if i <= 0 || i == len(user)-1 {
		return "", "", false
	}
	return user[:i], user[i+1:], true
}

// setUser replaces the routed user name with the real one. A database
// name left to default to the user name (absent, or sent as libpq sends
// it: the full user name) defaults to the real user, as it would on a
// direct connection.
func setUser(params map[string]string, routed, real string) {
	params["user"] = real
	if db := params["database"]; db == "" || db == routed {
		params["database"] = real
	}
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

// pipe relays the startup phase from the server (learning the session's
// BackendKeyData for cancels), then copies bytes both ways until either
// side closes, then closes both. It returns the bytes each way. Between two
// *net.TCPConn, relay.Copy splices on Linux; with TLS on either side it
// copies through user space.
func pipe(c *clientConn, first []byte, refused func(code string)) (fromClient, toClient int64) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fromClient = copyClientToServer(c)
	}()
	toClient = copyServerToClient(c, first, refused)
	c.close()
	<-done
	return fromClient, toClient
}

func copyClientToServer(c *clientConn) int64 {
	n, _ := relay.Copy(c.upstream, c.conn)
	c.close()
	return n
}

func copyServerToClient(c *clientConn, first []byte, refused func(code string)) int64 {
	addr := c.upstream.RemoteAddr().String()
	var issued []byte
	n, err := relayStartup(c.conn, c.upstream, first, func(key []byte) []byte {
		tagged, tag := c.srv.cancelTag()
		issued = c.srv.cancels.issue(tagged, tag, key, addr)
		return issued
	}, refused)
	if issued != nil {
		defer c.srv.cancels.remove(issued)
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
// ReadyForQuery or an error. The server's BackendKeyData (pid + secret) is
// handed to rekey, and the client gets the key rekey returns instead; an
// ErrorResponse that ends the startup has its SQLSTATE handed to refused.
func relayStartup(client io.Writer, up io.Reader, first []byte, rekey func(key []byte) []byte, refused func(code string)) (n int64, err error) {
	write := func(b []byte) error {
		w, err := client.Write(b)
		n += int64(w)
		return err
	}
	if err := write(first); err != nil {
		return n, err
	}
	if len(first) < 5 || first[0] == 'E' {
		if len(first) > 5 && first[0] == 'E' {
			reportRefusal(first[5:], refused)
		}
		return n, nil // a whole error message was passed on
	}
	h := pgwire.ReplyHeader(first[:5])
	var buf []byte // reused: a dozen small messages per session
	for {
		body := h.BodyLen()
		if body < 0 || body > maxStartupMessage {
			return n, fmt.Errorf("server message with length %d during startup", h.Len())
		}
		if cap(buf) < body {
			buf = make([]byte, body)
		}
		buf = buf[:body]
		if _, err := io.ReadFull(up, buf); err != nil {
			return n, err
		}
		out := buf
		// Protocol 3.0: 4-byte pid + 4-byte key; 3.2 (PG18): up to 256.
		if h.Type() == 'K' && len(buf) >= 8 {
			out = rekey(buf)
		}
		if err := write(out); err != nil {
			return n, err
		}
		switch h.Type() {
		case 'E':
			reportRefusal(buf, refused)
			return n, nil
		case 'Z':
			return n, nil
		}
		if _, err := io.ReadFull(up, h[:]); err != nil {
			return n, err
		}
		if err := write(h[:]); err != nil {
			return n, err
		}
	}
}

func reportRefusal(body []byte, refused func(code string)) {
	if refused == nil {
		return
	}
	var e pgproto3.ErrorResponse
	if e.Decode(body) == nil && e.Severity != "NOTICE" {
		refused(e.Code)
	}
}
