package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// cancelRegistry maps the BackendKeyData of live sessions to the server
// that issued it, so a CancelRequest arriving on a new connection reaches
// the backend running the query. The proxy passes the server's own keys
// through unchanged.
type cancelRegistry struct {
	mu   sync.Mutex
	keys map[string]string // pid+secret bytes -> upstream address
}

func (r *cancelRegistry) add(key []byte, addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keys == nil {
		r.keys = map[string]string{}
	}
	r.keys[string(key)] = addr
}

func (r *cancelRegistry) remove(key []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.keys, string(key))
}

func (r *cancelRegistry) lookup(key []byte) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	addr, ok := r.keys[string(key)]
	return addr, ok
}

// forwardCancel sends a client's CancelRequest to the server owning the
// key. Unknown keys are dropped silently, as Postgres does; a cancel never
// wakes a project (a sleeping one has no sessions and so no keys).
func (s *Server) forwardCancel(m *pgproto3.CancelRequest) {
	key := make([]byte, 4, 4+len(m.SecretKey))
	key[0], key[1], key[2], key[3] = byte(m.ProcessID>>24), byte(m.ProcessID>>16), byte(m.ProcessID>>8), byte(m.ProcessID)
	key = append(key, m.SecretKey...)
	addr, ok := s.cancels.lookup(key)
	if !ok {
		s.log.Debug("cancel request for an unknown key dropped")
		return
	}
	packet, err := m.Encode(nil)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(s.baseCtx, 5*time.Second)
	defer cancel()
	if err := s.up.cancel(ctx, addr, packet); err != nil {
		s.log.Warn("forward cancel request", "addr", addr, "err", err)
	}
}
