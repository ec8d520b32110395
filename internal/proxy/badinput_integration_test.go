package proxy_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
)

// rawConn dials the proxy and returns the socket for hand-written packets.
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

func startupPacket(t *testing.T, params map[string]string) []byte {
	t.Helper()
	b, err := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: params}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readError reads one ErrorResponse and then expects the proxy to close.
func readError(t *testing.T, c net.Conn) *pgproto3.ErrorResponse {
	t.Helper()
	fe := pgproto3.NewFrontend(c, io.Discard)
	msg, err := fe.Receive()
	if err != nil {
		t.Fatalf("want an ErrorResponse, got %v", err)
	}
	er, ok := msg.(*pgproto3.ErrorResponse)
	if !ok {
		t.Fatalf("want an ErrorResponse, got %T", msg)
	}
	copied := *er
	if _, err := fe.Receive(); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("after the error the proxy should close; got %v", err)
	}
	return &copied
}

// expectClosed expects the proxy to close without sending a byte.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	var b [1]byte
	n, err := c.Read(b[:])
	if n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("want a silent close, got %d bytes, %v", n, err)
	}
}

func TestIntegrationBadInput(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		h := newHarness(t, k, harnessOptions{proxy: proxy.Options{
			StartupTimeout:  300 * time.Millisecond,
			MaxProjectConns: 2,
		}})
		spec := h.addProject("quiet", backend.SleepStop, 0)
		h.addProject("other", backend.SleepStop, 0)
		starts := k.startCounter(t, h, spec)

		withCode := func(code string) func(*testing.T, net.Conn) {
			return func(t *testing.T, c net.Conn) {
				if er := readError(t, c); er.Code != code {
					t.Fatalf("code %s (%s), want %s", er.Code, er.Message, code)
				}
			}
		}
		tests := []struct {
			name  string
			send  func(t *testing.T, c net.Conn)
			check func(t *testing.T, c net.Conn)
		}{
			{
				name: "unknown project lists the known ones",
				send: func(t *testing.T, c net.Conn) {
					c.Write(startupPacket(t, map[string]string{"user": "postgres", "database": "nope"}))
				},
				check: func(t *testing.T, c net.Conn) {
					er := readError(t, c)
					if er.Code != "3D000" || !strings.Contains(er.Message, `"nope"`) ||
						!strings.Contains(er.Hint, "other") || !strings.Contains(er.Hint, "quiet") {
						t.Fatalf("got %s %q hint %q", er.Code, er.Message, er.Hint)
					}
				},
			},
			{
				name: "database defaults to the user name",
				send: func(t *testing.T, c net.Conn) {
					c.Write(startupPacket(t, map[string]string{"user": "nobody"}))
				},
				check: withCode("3D000"),
			},
			{
				name: "oversized startup packet",
				send: func(t *testing.T, c net.Conn) {
					c.Write(binary.BigEndian.AppendUint32(nil, 10000+4+1))
				},
				check: withCode("08P01"),
			},
			{
				name: "unsupported protocol version",
				send: func(t *testing.T, c net.Conn) {
					b := binary.BigEndian.AppendUint32(nil, 8+6)
					b = binary.BigEndian.AppendUint32(b, 2<<16)
					c.Write(append(b, "user\x00\x00"...))
				},
				check: withCode("08P01"),
			},
			{
				name: "garbage",
				send: func(t *testing.T, c net.Conn) {
					c.Write([]byte("GET / HTTP/1.1\r\nHost: quiet\r\n\r\n"))
				},
				check: withCode("08P01"),
			},
			{
				name:  "nothing at all",
				send:  func(t *testing.T, c net.Conn) { c.(*net.TCPConn).CloseWrite() },
				check: expectClosed,
			},
			{
				name: "incomplete startup packet times out",
				send: func(t *testing.T, c net.Conn) {
					full := startupPacket(t, map[string]string{"user": "postgres", "database": "quiet"})
					c.Write(full[:len(full)-3])
				},
				check: func(t *testing.T, c net.Conn) {
					er := readError(t, c)
					if er.Code != "08P01" || !strings.Contains(er.Message, "timeout") {
						t.Fatalf("got %s %q", er.Code, er.Message)
					}
				},
			},
			{
				name: "cancel request for a sleeping project",
				send: func(t *testing.T, c net.Conn) {
					b, _ := (&pgproto3.CancelRequest{ProcessID: 1234, SecretKey: []byte{1, 2, 3, 4}}).Encode(nil)
					c.Write(b)
				},
				check: expectClosed,
			},
			{
				name: "ssl request then garbage",
				send: func(t *testing.T, c net.Conn) {
					b := binary.BigEndian.AppendUint32(nil, 8)
					c.Write(binary.BigEndian.AppendUint32(b, 80877103))
					var n [1]byte
					if _, err := io.ReadFull(c, n[:]); err != nil || n[0] != 'N' {
						t.Fatalf("SSLRequest answer %q, %v; want N", n[0], err)
					}
					c.Write([]byte{0, 0, 0, 3})
				},
				check: withCode("08P01"),
			},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				c := rawConn(t, h.addr)
				tt.send(t, c)
				tt.check(t, c)
			})
		}

		// None of that may have woken anything.
		for _, name := range []string{"quiet", "other"} {
			if st := h.status(name); st.State != proxy.StateSleeping || st.Wakes != 0 {
				t.Errorf("%s: state %s wakes %d after bad input, want sleeping and 0", name, st.State, st.Wakes)
			}
		}
		if n := starts(); n != 0 {
			t.Errorf("the %s runtime saw %d server starts after bad input, want 0", k.name(), n)
		}

	})
}

// TestIntegrationProjectConnectionCap: a slot is taken only by an
// authenticated client, so the third client of a project capped at two is
// refused (53300) after its password is checked. (Not in BadInput's
// harness: a real client's SCRAM under load can outlast its 300 ms
// startup deadline, which is for the silent sockets there.)
func TestIntegrationProjectConnectionCap(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		h := newHarness(t, k, harnessOptions{proxy: proxy.Options{MaxProjectConns: 2}})
		spec := h.addProject("capped", backend.SleepStop, 0)
		ctx := t.Context()
		h.connect(ctx, spec)
		h.connect(ctx, spec)
		conn, err := pgx.Connect(ctx, h.url(spec))
		if err == nil {
			conn.Close(ctx)
			t.Fatal("third connection accepted, want 53300")
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "53300" {
			t.Fatalf("third connection: %v, want 53300", err)
		}
	})
}

func TestIntegrationTotalConnectionCap(t *testing.T) {
	forEachBackend(t, func(t *testing.T, k kit) {
		h := newHarness(t, k, harnessOptions{proxy: proxy.Options{MaxConns: 1}})
		a := h.addProject("capa", backend.SleepStop, 0)
		h.addProject("capb", backend.SleepStop, 0)
		h.connect(t.Context(), a)
		c := rawConn(t, h.addr)
		c.Write(startupPacket(t, map[string]string{"user": "postgres", "database": "capb"}))
		if er := readError(t, c); er.Code != "53300" {
			t.Fatalf("code %s (%s), want 53300", er.Code, er.Message)
		}
		if st := h.status("capb"); st.Wakes != 0 {
			t.Fatalf("refused connection woke capb")
		}
	})
}
