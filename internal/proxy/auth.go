package proxy

import (
	"crypto/md5"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/xdg-go/scram"

	"github.com/pgwake/pgwake/internal/pgwire"
)

// Authentication at the proxy. For a project whose password pgwake holds,
// a client that logs in as the project's user runs SCRAM-SHA-256 with
// pgwake itself, before anything wakes: a port scan, a stale password or a
// misconfigured job gets 28P01 from pgwake and the database stays asleep.
// Once the client is authenticated, pgwake wakes the project, logs in to
// the server with the password it holds, and splices. The client's
// password never reaches the server, and pgwake's never reaches the client.
//
// SCRAM-SHA-256-PLUS (channel binding tls-server-end-point) is offered on
// pgwake's own TLS, so a client that requires channel binding can connect
// through the TLS-terminating proxy. Any other user name, and projects
// whose password pgwake does not know (some adopted ones), authenticate
// with the server as before (pass-through).

// Auth modes, as Status reports them.
const (
	AuthSCRAM       = "scram"        // pgwake authenticates the project's user
	AuthPassThrough = "pass-through" // the server authenticates every client
)

// SCRAM mechanism names, as Postgres spells them.
const (
	mechSCRAM     = "SCRAM-SHA-256"
	mechSCRAMPlus = "SCRAM-SHA-256-PLUS"
)

// scramIterations is Postgres's default scram_iterations: a client pays
// for the same key derivation as against the server itself.
const scramIterations = 4096

// credentials is what pgwake verifies a project's user against: SCRAM's
// stored and server keys under pgwake's own salt, derived once per
// password, and the passwords for the login to the server (the current
// one first; a second while a rotation is under way).
type credentials struct {
	user      string
	password  string // what the keys were derived from
	stored    scram.StoredCredentials
	passwords []string
	logins    *loginClients
}

// loginClients keeps one SCRAM client per password for pgwake's own login
// to the server: a client caches its key derivation per salt, so only the
// first login pays for 4096 rounds of PBKDF2.
type loginClients struct {
	mu sync.Mutex
	by map[string]*scram.Client
}

func (l *loginClients) get(user, password string) (*scram.Client, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.by[password]; c != nil {
		return c, nil
	}
	c, err := scram.SHA256.NewClient(user, password, "")
	if err != nil {
		return nil, err
	}
	if l.by == nil {
		l.by = map[string]*scram.Client{}
	}
	l.by[password] = c
	return c, nil
}

func newCredentials(user, password string) (*credentials, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	cl, err := scram.SHA256.NewClient(user, password, "")
	if err != nil {
		return nil, fmt.Errorf("password of %q: %w", user, err)
	}
	stored, err := cl.GetStoredCredentialsWithError(scram.KeyFactors{Salt: string(salt), Iters: scramIterations})
	if err != nil {
		return nil, fmt.Errorf("password of %q: %w", user, err)
	}
	return &credentials{user: user, password: password, stored: stored, logins: &loginClients{}}, nil
}

// authError is a failed client authentication: the SQLSTATE and message
// the client gets.
type authError struct {
	code, msg string
	err       error // for the log
}

func (e *authError) Error() string { return e.msg + ": " + e.err.Error() }

func passwordFailed(user string, err error) *authError {
	return &authError{code: pgwire.CodeInvalidPassword, msg: fmt.Sprintf("password authentication failed for user %q", user), err: err}
}

func authProtocol(msg string, err error) *authError {
	return &authError{code: pgwire.CodeProtocolViolation, msg: msg, err: err}
}

// maxSASLMessage bounds a client's SASL message; real ones are a few
// hundred bytes.
const maxSASLMessage = 8 << 10

// authenticate runs the server side of SCRAM-SHA-256 with the client,
// ending with AuthenticationSASLFinal. The client then waits for
// AuthenticationOk, which the server's own login supplies.
func (c *clientConn) authenticate(cred *credentials) error {
	mechs := []string{mechSCRAM}
	cb, plus := c.channelBinding()
	if plus {
		// Postgres lists the PLUS variant first.
		mechs = []string{mechSCRAMPlus, mechSCRAM}
	}
	if err := c.send(&pgproto3.AuthenticationSASL{AuthMechanisms: mechs}); err != nil {
		return err
	}
	body, err := readClientMessage(c.conn, 'p')
	if err != nil {
		return authProtocol("expected SASL response", err)
	}
	var init pgproto3.SASLInitialResponse
	if err := init.Decode(body); err != nil {
		return authProtocol("malformed SASL response", err)
	}
	if !slices.Contains(mechs, init.AuthMechanism) {
		return authProtocol("client selected an invalid SASL authentication mechanism", fmt.Errorf("mechanism %q", init.AuthMechanism))
	}
	// The mechanism and the GS2 flag must agree, as Postgres checks:
	// PLUS with binding data, the plain one without.
	binds := len(init.Data) > 0 && init.Data[0] == 'p'
	if binds != (init.AuthMechanism == mechSCRAMPlus) {
		return authProtocol("SCRAM channel binding negotiation error", fmt.Errorf("mechanism %s with GS2 flag %q", init.AuthMechanism, init.Data[:min(1, len(init.Data))]))
	}
	srv, err := scram.SHA256.NewServer(func(string) (scram.StoredCredentials, error) {
		// Postgres ignores the SCRAM user name (libpq sends none): the
		// startup packet's user is the one authenticated.
		return cred.stored, nil
	})
	if err != nil {
		return err
	}
	conv := srv.NewConversation()
	if plus {
		conv = srv.NewConversationWithChannelBinding(cb)
	}
	first, err := conv.Step(string(init.Data))
	if err != nil {
		return authProtocol("malformed SCRAM message", err)
	}
	if err := c.send(&pgproto3.AuthenticationSASLContinue{Data: []byte(first)}); err != nil {
		return err
	}
	body, err = readClientMessage(c.conn, 'p')
	if err != nil {
		return authProtocol("expected SASL response", err)
	}
	var resp pgproto3.SASLResponse
	if err := resp.Decode(body); err != nil {
		return authProtocol("malformed SASL response", err)
	}
	final, err := conv.Step(string(resp.Data))
	if err != nil || !conv.Valid() {
		if final == scram.ErrChannelBindingsDontMatch {
			return authProtocol("SCRAM channel binding check failed", err)
		}
		return passwordFailed(cred.user, err)
	}
	return c.send(&pgproto3.AuthenticationSASLFinal{Data: []byte(final)})
}

// channelBinding is the tls-server-end-point binding of the client's TLS
// session, when it has one pgwake can name.
func (c *clientConn) channelBinding() (scram.ChannelBinding, bool) {
	if _, ok := c.conn.(*tls.Conn); !ok || c.srv.leaf == nil {
		return scram.ChannelBinding{}, false
	}
	// The binding hashes the certificate the server presented; the
	// library computes it from a client's view of the session.
	cb, err := scram.NewTLSServerEndpointBinding(&tls.ConnectionState{PeerCertificates: []*x509.Certificate{c.srv.leaf}})
	if err != nil {
		return scram.ChannelBinding{}, false
	}
	return cb, true
}

// servedLeaf is the certificate every TLS client is shown, or nil when the
// configuration may choose among several (channel binding is then not
// offered, since pgwake could not tell which one a session saw).
func servedLeaf(conf *tls.Config) *x509.Certificate {
	if conf == nil || conf.GetCertificate != nil || conf.GetConfigForClient != nil || len(conf.Certificates) != 1 {
		return nil
	}
	cert := conf.Certificates[0]
	if cert.Leaf != nil {
		return cert.Leaf
	}
	if len(cert.Certificate) == 0 {
		return nil
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil
	}
	return leaf
}

func (c *clientConn) send(m pgproto3.BackendMessage) error {
	buf, err := m.Encode(nil)
	if err != nil {
		return err
	}
	_, err = c.conn.Write(buf)
	return err
}

// readClientMessage reads one typed message of type want and returns its
// body, reading exactly its bytes (the connection is spliced afterwards).
func readClientMessage(r io.Reader, want byte) ([]byte, error) {
	var h pgwire.ReplyHeader
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	if h.Type() != want {
		return nil, fmt.Errorf("message type %q, want %q", h.Type(), want)
	}
	n := h.BodyLen()
	if n < 0 || n > maxSASLMessage {
		return nil, fmt.Errorf("message length %d", h.Len())
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return body, nil
}

// loginError is the server's refusal of pgwake's own login: the whole
// ErrorResponse, to be passed on to the client as the server sent it.
type loginError struct {
	code string
	msg  []byte
}

func (e *loginError) Error() string { return "server refused the login: " + e.code }

// login authenticates to the server on up as user with password, first
// being the header of the server's first reply (or a whole ErrorResponse)
// as exchange returned it. It reads exactly up to and including
// AuthenticationOk, which it returns whole; the server's next messages
// (parameters, key data, ReadyForQuery) are left for relayStartup.
func login(up net.Conn, first []byte, user, password string, logins *loginClients) ([]byte, error) {
	var h pgwire.ReplyHeader
	copy(h[:], first)
	var conv *scram.ClientConversation
	for {
		if h.Type() == 'E' {
			msg := first
			if len(msg) == 5 {
				e, body, err := pgwire.DecodeUpstreamError(up, h)
				if err != nil {
					return nil, err
				}
				return nil, &loginError{code: e.Code, msg: append(h[:], body...)}
			}
			var e pgproto3.ErrorResponse
			_ = e.Decode(msg[5:])
			return nil, &loginError{code: e.Code, msg: msg}
		}
		if h.Type() != 'R' {
			return nil, fmt.Errorf("server sent message %q during authentication", h.Type())
		}
		n := h.BodyLen()
		if n < 4 || n > maxSASLMessage {
			return nil, fmt.Errorf("authentication message with length %d", h.Len())
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(up, body); err != nil {
			return nil, fmt.Errorf("read authentication request: %w", err)
		}
		var reply pgproto3.FrontendMessage
		switch code := binary.BigEndian.Uint32(body); code {
		case pgproto3.AuthTypeOk:
			return append(h[:], body...), nil
		case pgproto3.AuthTypeCleartextPassword:
			reply = &pgproto3.PasswordMessage{Password: password}
		case pgproto3.AuthTypeMD5Password:
			if len(body) != 8 {
				return nil, errors.New("malformed MD5 authentication request")
			}
			reply = &pgproto3.PasswordMessage{Password: md5Password(user, password, body[4:8])}
		case pgproto3.AuthTypeSASL:
			var m pgproto3.AuthenticationSASL
			if err := m.Decode(body); err != nil {
				return nil, err
			}
			if !slices.Contains(m.AuthMechanisms, mechSCRAM) {
				return nil, fmt.Errorf("server offers SASL mechanisms %v, pgwake speaks %s", m.AuthMechanisms, mechSCRAM)
			}
			cl, err := logins.get(user, password)
			if err != nil {
				return nil, err
			}
			conv = cl.NewConversation()
			data, err := conv.Step("")
			if err != nil {
				return nil, err
			}
			reply = &pgproto3.SASLInitialResponse{AuthMechanism: mechSCRAM, Data: []byte(data)}
		case pgproto3.AuthTypeSASLContinue, pgproto3.AuthTypeSASLFinal:
			if conv == nil {
				return nil, errors.New("server continued a SASL exchange that did not begin")
			}
			data, err := conv.Step(string(body[4:]))
			if err != nil {
				return nil, fmt.Errorf("server's SCRAM message: %w", err)
			}
			if code == pgproto3.AuthTypeSASLContinue {
				reply = &pgproto3.SASLResponse{Data: []byte(data)}
			} else if !conv.Valid() {
				return nil, errors.New("server's SCRAM signature does not verify")
			}
		default:
			return nil, fmt.Errorf("server asks for authentication method %d, which pgwake does not speak", code)
		}
		if reply != nil {
			buf, err := reply.Encode(nil)
			if err != nil {
				return nil, err
			}
			if _, err := up.Write(buf); err != nil {
				return nil, err
			}
		}
		if _, err := io.ReadFull(up, h[:]); err != nil {
			return nil, fmt.Errorf("read authentication reply: %w", err)
		}
		first = h[:]
	}
}

// md5Password is the answer to an MD5 request: "md5" followed by
// md5(md5(password + user) + salt), hex.
func md5Password(user, password string, salt []byte) string {
	inner := md5.Sum([]byte(password + user))
	outer := md5.Sum(append([]byte(hex.EncodeToString(inner[:])), salt...))
	return "md5" + hex.EncodeToString(outer[:])
}
