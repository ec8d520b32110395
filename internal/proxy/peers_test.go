package proxy_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
)

// sharedScript adds backend.Shared to the FAKE runtime: the peers' answers
// are scripted. It exists for the one thing a real control plane cannot
// be made to do at a chosen instant: let a peer's client arrive between
// the idle check and the sleep. The real multi-process tests are in
// cmd/pgwake (TestIntegrationKubernetesPeers*).
type sharedScript struct {
	*scriptBackend
	mu      sync.Mutex
	answers []backend.PeerUse // PeerUse's next answers; the last repeats
	errs    []error
	asked   int
	uses    []backend.Use // what Use was told, in order
}

func (s *sharedScript) Use(_ string, u backend.Use) {
	s.mu.Lock()
	s.uses = append(s.uses, u)
	s.mu.Unlock()
}

func (s *sharedScript) PeerUse(context.Context, string) (backend.PeerUse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := min(s.asked, len(s.answers)-1)
	s.asked++
	var err error
	if i < len(s.errs) {
		err = s.errs[i]
	}
	return s.answers[i], err
}

func (s *sharedScript) lastUse() backend.Use {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.uses) == 0 {
		return backend.Use{}
	}
	return s.uses[len(s.uses)-1]
}

// serveShared runs a proxy whose project "app" runs on be, adopted as
// running at up's address, and sleeps after 1 ms idle.
func serveShared(t *testing.T, be *sharedScript, up *scriptedUpstream) (*proxy.Server, string) {
	t.Helper()
	be.set(backend.Status{State: backend.StateRunning, Addr: up.ln.Addr().String(), ID: "run-1"})
	be.start = func() (backend.Endpoint, error) {
		be.status = backend.Status{State: backend.StateRunning, Addr: up.ln.Addr().String(), ID: "run-2"}
		return backend.Endpoint{Addr: up.ln.Addr().String(), ID: "run-2"}, nil
	}
	p := proxy.Project{Spec: backend.Spec{Name: "app", User: "u", Database: "app"}, Backend: be, SleepAfter: time.Millisecond}
	return serveProject(t, p, proxy.Options{SweepInterval: 5 * time.Millisecond})
}

// waitStatus polls the project's status until ok holds.
func waitStatus(t *testing.T, srv *proxy.Server, what string, ok func(proxy.Status) bool) proxy.Status {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, _ := srv.ProjectStatus("app")
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: status %+v", what, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPeersKeepASharedServerAwake(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		use  backend.PeerUse
		err  error
		want string
	}{
		{"peer connections", backend.PeerUse{Use: backend.Use{Conns: 3}, Peers: []string{"replica-b"}}, nil, "3 connection(s) on other pgwake processes (replica-b)"},
		{"peer waking", backend.PeerUse{Use: backend.Use{Waking: true}, Peers: []string{"replica-c"}}, nil, "another pgwake process is waking it (replica-c)"},
		{"doubt", backend.PeerUse{}, errors.New("a peer's lease expired 2s ago"), "cannot tell whether other pgwake processes use it"},
		{"read error", backend.PeerUse{}, errors.New("list peer leases: connection refused"), "connection refused"},
		{"a peer's recent use", backend.PeerUse{Use: backend.Use{LastActive: time.Now().Add(time.Hour)}}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			be := &sharedScript{scriptBackend: &scriptBackend{}, answers: []backend.PeerUse{tc.use}, errs: []error{tc.err}}
			srv, _ := serveShared(t, be, newScriptedUpstream(t))
			// Asked, and (while they say busy) asked again later: the sweep
			// goes on, yet never sleeps it. A peer's recent use is asked no
			// more before it can make the project due.
			asked := 2
			if tc.want == "" {
				asked = 1
			}
			waitStatus(t, srv, "peers asked", func(proxy.Status) bool {
				be.mu.Lock()
				defer be.mu.Unlock()
				return be.asked >= asked
			})
			for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
				if st, _ := srv.ProjectStatus("app"); st.State != proxy.StateRunning {
					t.Fatalf("state %s: slept although the peers spoke against it", st.State)
				}
			}
			st, _ := srv.ProjectStatus("app")
			if st.State != proxy.StateRunning || !strings.Contains(st.PeersBusy, tc.want) {
				t.Fatalf("state %s, peers_busy %q; want running, %q", st.State, st.PeersBusy, tc.want)
			}
			if err := srv.Sleep(t.Context(), "app"); err == nil && tc.want != "" {
				t.Fatal("an explicit sleep went ahead while peers use the server")
			} else if tc.want != "" && !strings.Contains(err.Error(), tc.want) {
				t.Errorf("explicit sleep refused with %q, want %q", err, tc.want)
			}
		})
	}
}

// TestPeerClientDuringSleepWakesItBack: the peers said idle, the server
// went to sleep, and the check right after finds a peer's client that
// arrived in between: the server is woken again at once.
func TestPeerClientDuringSleepWakesItBack(t *testing.T) {
	t.Parallel()
	be := &sharedScript{scriptBackend: &scriptBackend{}, answers: []backend.PeerUse{
		{}, // before the sleep: idle everywhere
		{Use: backend.Use{Conns: 1}, Peers: []string{"replica-b"}}, // right after it
	}}
	srv, _ := serveShared(t, be, newScriptedUpstream(t))
	st := waitStatus(t, srv, "woken again", func(st proxy.Status) bool { return st.State == proxy.StateRunning && st.Wakes == 1 })
	if be.startCount() != 1 {
		t.Fatalf("%d starts, want 1", be.startCount())
	}
	var slept, again bool
	for _, e := range st.Events {
		slept = slept || strings.Contains(e.Msg, "asleep")
		again = again || strings.Contains(e.Msg, "waking again: 1 connection(s) on other pgwake processes (replica-b)")
	}
	if !slept || !again {
		t.Fatalf("events %v: want the sleep, then the wake for the peer's client", st.Events)
	}
}

// TestUseIsPublished: what the proxy tells a shared backend follows its
// clients: a held connection, then none.
func TestUseIsPublished(t *testing.T) {
	t.Parallel()
	be := &sharedScript{scriptBackend: &scriptBackend{}, answers: []backend.PeerUse{{Use: backend.Use{Conns: 1}}}}
	_, paddr := serveShared(t, be, newScriptedUpstream(t))
	conn := connectKeep(t, paddr)
	deadline := time.Now().Add(30 * time.Second)
	for be.lastUse().Conns != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("use %+v, want 1 connection", be.lastUse())
		}
		time.Sleep(5 * time.Millisecond)
	}
	conn.Close(context.Background())
	for u := be.lastUse(); u.Conns != 0 || u.LastActive.IsZero(); u = be.lastUse() {
		if time.Now().After(deadline) {
			t.Fatalf("use %+v after the client left, want 0 connections and when it left", u)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// connectKeep connects through the proxy and leaves the session open.
func connectKeep(t *testing.T, addr string) *pgconn.PgConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, "postgres://u@"+addr+"/app?sslmode=disable")
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
