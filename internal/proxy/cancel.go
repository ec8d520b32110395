package proxy

import (
	"context"
	"crypto/rand"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// CancelRouter routes CancelRequests among pgwake processes that serve the
// same projects (replicas behind one Service): a cancel arrives on a new
// connection, maybe at another replica than the one carrying the session.
// The keys a proxy hands out name it by a tag, and a key with another
// process's tag is forwarded there.
type CancelRouter interface {
	// CancelTag is this process's tag in the keys it issues; zero while it
	// has none.
	CancelTag() byte
	// CancelPeers returns where the live peers issuing tag accept
	// CancelRequests (normally one).
	CancelPeers(ctx context.Context, tag byte) ([]string, error)
}

// session is what a cancel key issued to a client stands for: the server
// carrying the session and the key that server gave.
type session struct {
	addr string
	key  []byte // pid + secret, as the server sent it
}

// cancelRegistry maps the cancel keys pgwake issued to live sessions'
// clients to their servers, so a CancelRequest arriving on a new
// connection reaches the backend running the query. Clients never see a
// server's own key: pgwake issues its own (same pid, same length, a fresh
// secret), which keeps the server's key off the client's side and lets the
// key name the pgwake that issued it.
type cancelRegistry struct {
	mu   sync.Mutex
	keys map[string]session // by the issued pid+secret bytes
}

// issue registers a session whose server sent key (pid + secret) at addr,
// and returns the key its client gets: the server's pid (clients show it
// and pass it to pg_terminate_backend) and a random secret of the same
// length. When tagged, the secret's first byte is tag (zero: this process
// has none yet, and its peers forward nothing for it): a protocol 3.0
// secret then keeps 24 random bits, 3.2's (32 bytes from PG18) 248.
func (r *cancelRegistry) issue(tagged bool, tag byte, key []byte, addr string) []byte {
	out := make([]byte, len(key))
	copy(out, key[:4])
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keys == nil {
		r.keys = map[string]session{}
	}
	for {
		rand.Read(out[4:])
		if tagged {
			out[4] = tag
		}
		if _, taken := r.keys[string(out)]; !taken {
			r.keys[string(out)] = session{addr: addr, key: append([]byte(nil), key...)}
			return out
		}
	}
}

func (r *cancelRegistry) remove(key []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.keys, string(key))
}

func (r *cancelRegistry) lookup(key []byte) (session, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.keys[string(key)]
	return s, ok
}

// cancelTag is the tag this proxy puts in the keys it issues, and whether
// it tags them at all.
func (s *Server) cancelTag() (bool, byte) {
	if s.opts.Cancels == nil {
		return false, 0
	}
	return true, s.opts.Cancels.CancelTag()
}

// forwardCancel sends a client's CancelRequest to the server owning the
// key, with that server's own key. A key another pgwake issued (its tag)
// goes to that pgwake, which does the same. Unknown keys are dropped
// silently, as Postgres does; a cancel never wakes a project (a sleeping
// one has no sessions and so no keys).
func (s *Server) forwardCancel(m *pgproto3.CancelRequest) {
	key := make([]byte, 4, 4+len(m.SecretKey))
	key[0], key[1], key[2], key[3] = byte(m.ProcessID>>24), byte(m.ProcessID>>16), byte(m.ProcessID>>8), byte(m.ProcessID)
	key = append(key, m.SecretKey...)
	ctx, cancel := context.WithTimeout(s.baseCtx, 5*time.Second)
	defer cancel()
	if sess, ok := s.cancels.lookup(key); ok {
		packet, err := (&pgproto3.CancelRequest{ProcessID: m.ProcessID, SecretKey: sess.key[4:]}).Encode(nil)
		if err != nil {
			return
		}
		if err := s.up.cancel(ctx, sess.addr, packet); err != nil {
			s.log.Warn("forward cancel request", "addr", sess.addr, "err", err)
		}
		return
	}
	router := s.opts.Cancels
	if router == nil || len(m.SecretKey) == 0 || m.SecretKey[0] == 0 || m.SecretKey[0] == router.CancelTag() {
		// Not issued here, and naming no other pgwake: one of ours that
		// ended, or nobody's. Never passed on, so a key cannot loop.
		s.log.Debug("cancel request for an unknown key dropped")
		return
	}
	peers, err := router.CancelPeers(ctx, m.SecretKey[0])
	if err != nil {
		s.log.Warn("cancel request for another pgwake: cannot find it", "tag", m.SecretKey[0], "err", err)
		return
	}
	packet, err := m.Encode(nil)
	if err != nil {
		return
	}
	for _, addr := range peers {
		if err := sendCancel(ctx, addr, packet); err != nil {
			s.log.Warn("forward cancel request to a peer", "peer", addr, "err", err)
		} else {
			s.log.Debug("cancel request forwarded to a peer", "peer", addr)
		}
	}
}

// sendCancel hands a CancelRequest to a peer pgwake's listener, as a
// client would, and waits until it closes the connection: by then the
// peer has passed it on to the server.
func sendCancel(ctx context.Context, addr string, packet []byte) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write(packet); err != nil {
		return err
	}
	var b [1]byte
	_, _ = c.Read(b[:])
	return nil
}
