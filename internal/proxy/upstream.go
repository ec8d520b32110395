package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgwake/pgwake/internal/pgwire"
	"github.com/pgwake/pgwake/internal/relay"
)

// upstream dials project servers and reads their first replies. It knows
// addresses, not projects: whether an address still belongs to the server a
// project started is the project's question (project.confirm). project,
// conn and cancel call it; it calls nothing above it.
type upstream struct {
	tls *tls.Config // nil: plaintext
}

// dial opens a TCP connection to addr. TLS, if any, is negotiated by
// exchange, so a caller can check the server's identity concurrently with
// the handshake.
func (u *upstream) dial(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, &dialError{addr: addr, err: err}
	}
	return c, nil
}

// dialError is a failed TCP connect: nothing of the server was reached.
type dialError struct {
	addr string
	err  error
}

func (e *dialError) Error() string { return fmt.Sprintf("dial %s: %v", e.addr, e.err) }
func (e *dialError) Unwrap() error { return e.err }

// exchange negotiates upstream TLS if configured, sends the startup packet
// and reads the first reply's header (a whole ErrorResponse when that is
// the reply). It returns the connection to use from now on (TLS over c, or
// c) and the bytes read. retry reports a failure a booting or stopping
// server produces: 57P03, or a close without a byte. On error c is closed.
func (u *upstream) exchange(ctx context.Context, c net.Conn, addr string, packet []byte) (_ net.Conn, first []byte, retry bool, err error) {
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	if dl, has := ctx.Deadline(); has {
		_ = c.SetDeadline(dl)
	}
	// A cancelled exchange (the server proved not ours, the client left,
	// the drain ended) must not wait out a server that never replies.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if u.tls != nil {
		tc, retry, err := startUpstreamTLS(c, u.tls, addr)
		if err != nil {
			return nil, nil, retry, err
		}
		c = tc
	}
	if _, err := c.Write(packet); err != nil {
		return nil, nil, true, fmt.Errorf("send startup packet: %w", err)
	}
	var h pgwire.ReplyHeader
	if n, err := io.ReadFull(c, h[:]); err != nil {
		if n == 0 && (errors.Is(err, io.EOF) || isReset(err)) {
			return nil, nil, true, errors.New("server closed the connection before replying")
		}
		return nil, nil, false, fmt.Errorf("read first reply: %w", err)
	}
	first = h[:]
	if h.Type() == 'E' {
		e, body, err := pgwire.DecodeUpstreamError(c, h)
		if err != nil {
			return nil, nil, false, err
		}
		if e.Code == pgwire.CodeCannotConnectNow {
			return nil, nil, true, fmt.Errorf("%w: %s", errStartingUp, e.Message)
		}
		first = append(first, body...)
	}
	if !stop() {
		return nil, nil, false, ctx.Err()
	}
	_ = c.SetDeadline(time.Time{})
	ok = true
	return c, first, false, nil
}

// probe reports whether Postgres at addr accepts a startup packet: any
// reply other than 57P03 (an authentication request, even an
// authentication error) proves it serves. It reads the rest of the reply
// before closing, since closing with unread input resets the connection
// and Postgres logs that.
func (u *upstream) probe(ctx context.Context, addr string, packet []byte, timeout time.Duration) (accepted time.Time, retry bool, err error) {
	// One attempt is bounded on its own: something that accepts and never
	// answers must not hold the wake's checks up until its deadline.
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := u.dial(ctx, addr)
	if err != nil {
		return time.Time{}, true, err
	}
	accepted = time.Now()
	c, first, retry, err := u.exchange(ctx, c, addr, packet)
	if err != nil {
		if !errors.Is(err, errStartingUp) {
			// Nothing of Postgres answered: a connect that succeeds
			// may be a port forwarder's, before the server listens.
			accepted = time.Time{}
		}
		return accepted, retry, err
	}
	defer c.Close()
	if h := pgwire.ReplyHeader(first[:5]); h.BodyLen() > 0 && h.BodyLen() < 1<<16 && len(first) == 5 {
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		_, _ = io.CopyN(io.Discard, c, int64(h.BodyLen()))
	}
	return accepted, false, nil
}

// errStartingUp is a server's 57P03: its process answers, Postgres does
// not serve yet.
var errStartingUp = errors.New("server not ready")

// probeTimeout bounds the first readiness probe of a wake; a timed-out
// probe is retried with twice the bound, up to maxProbeTimeout. A path
// that is slow rather than dead (a port-forward through a busy API server
// can take seconds to answer) then still sees the server serve, where a
// fixed bound timed every probe out until the wake failed.
const (
	probeTimeout    = 2 * time.Second
	maxProbeTimeout = 16 * time.Second
)

// probePacket is the startup packet of the readiness probe: the project's
// own user and database, and an application_name that shows in the
// server's log what the connection was.
func probePacket(user, database string) ([]byte, error) {
	probe := &pgproto3.StartupMessage{
		ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{
			"user": user, "database": database, "application_name": "pgwake-probe",
		},
	}
	return probe.Encode(nil)
}

// cancel delivers a CancelRequest packet to addr and waits for the server
// to close the connection, which keeps the cancel ahead of anything the
// client does next.
func (u *upstream) cancel(ctx context.Context, addr string, packet []byte) error {
	c, err := u.dial(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if u.tls != nil {
		// The key is a credential: keep it off the wire in the clear.
		tc, _, err := startUpstreamTLS(c, u.tls, addr)
		if err != nil {
			return err
		}
		defer tc.Close()
		c = tc
	}
	if _, err := c.Write(packet); err != nil {
		return err
	}
	var b [1]byte
	_, _ = c.Read(b[:])
	return nil
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
