package relay

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/pgwake/pgwake/internal/certs"
)

// tcpPair returns the two ends of a real loopback TCP connection.
func tcpPair(t testing.TB) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-accepted
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	// A broken relay must fail the test, not hang it.
	deadline := time.Now().Add(2 * time.Minute)
	a.SetDeadline(deadline)
	b.SetDeadline(deadline)
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

// proxied is client <-> (in, out) <-> server with Copy running both ways
// between in and out, as the proxy does.
type proxied struct {
	client, server *net.TCPConn
	in, out        *net.TCPConn
	toServer       chan result // Copy(out, in) finished
	toClient       chan result // Copy(in, out) finished
}

type result struct {
	n   int64
	err error
}

func newProxied(t testing.TB) *proxied {
	t.Helper()
	p := &proxied{toServer: make(chan result, 1), toClient: make(chan result, 1)}
	p.client, p.in = tcpPair(t)
	p.out, p.server = tcpPair(t)
	go func() {
		n, err := Copy(p.out, p.in)
		p.out.CloseWrite()
		p.toServer <- result{n, err}
	}()
	go func() {
		n, err := Copy(p.in, p.out)
		p.in.CloseWrite()
		p.toClient <- result{n, err}
	}()
	return p
}

// wait returns a Copy's result, failing the test if it never ends.
func wait(t *testing.T, ch chan result, what string) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: Copy did not return", what)
		return result{}
	}
}

// halfCloser is a connection that can end its sending side.
type halfCloser interface {
	io.ReadWriter
	CloseWrite() error
}

// exchange sends size random bytes from a to b and from b to a at once,
// each side then closing its sending half, and fails the test unless both
// arrive intact. Receivers read readSize bytes at a time: small reads keep
// them slower than the senders, so writes in between hit full buffers.
func exchange(t *testing.T, a, b halfCloser, size, readSize int) {
	t.Helper()
	up, down := make([]byte, size), make([]byte, size)
	rand.Read(up)
	rand.Read(down)
	var wg sync.WaitGroup
	var gotUp, gotDown []byte
	var errUp, errDown error
	send := func(c halfCloser, data []byte) {
		defer wg.Done()
		c.Write(data)
		c.CloseWrite()
	}
	receive := func(c io.Reader, into *[]byte, errp *error) {
		defer wg.Done()
		var buf bytes.Buffer
		_, *errp = io.CopyBuffer(&buf, struct{ io.Reader }{c}, make([]byte, readSize))
		*into = buf.Bytes()
	}
	wg.Add(4)
	go send(a, up)
	go send(b, down)
	go receive(b, &gotUp, &errUp)
	go receive(a, &gotDown, &errDown)
	wg.Wait()
	if errUp != nil || errDown != nil {
		t.Fatalf("read errors: %v, %v", errUp, errDown)
	}
	if sha256.Sum256(gotUp) != sha256.Sum256(up) || sha256.Sum256(gotDown) != sha256.Sum256(down) {
		t.Fatalf("data corrupted: got %d/%d bytes, want %d each", len(gotUp), len(gotDown), size)
	}
}

func TestCopyBulkBothWays(t *testing.T) {
	t.Parallel()
	p := newProxied(t)
	const size = 8 << 20
	exchange(t, p.client, p.server, size, 1000)
	for what, ch := range map[string]chan result{"to server": p.toServer, "to client": p.toClient} {
		if r := wait(t, ch, what); r.err != nil || r.n != size {
			t.Errorf("%s: Copy = %d, %v; want %d, nil", what, r.n, r.err, size)
		}
	}
}

// TestCopyPingPong sends many small messages one at a time, the pattern of
// a query and its reply, and checks each arrives whole and in order.
func TestCopyPingPong(t *testing.T) {
	t.Parallel()
	p := newProxied(t)
	go io.Copy(p.server, p.server) // echo
	msg := make([]byte, 300)
	reply := make([]byte, len(msg))
	for i := range 2000 {
		n := 1 + i%len(msg)
		for j := range n {
			msg[j] = byte(i + j)
		}
		if _, err := p.client.Write(msg[:n]); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(p.client, reply[:n]); err != nil {
			t.Fatalf("round trip %d: %v", i, err)
		}
		if !bytes.Equal(reply[:n], msg[:n]) {
			t.Fatalf("round trip %d: reply differs", i)
		}
	}
}

// TestCopyEndsWhenSourceClosed: the proxy closes both sockets when one side
// ends; a Copy blocked on the other must return, not hang.
func TestCopyEndsWhenSourceClosed(t *testing.T) {
	t.Parallel()
	p := newProxied(t)
	p.in.Close()
	r := wait(t, p.toServer, "to server")
	if !errors.Is(r.err, net.ErrClosed) {
		t.Fatalf("Copy after its source was closed = %d, %v; want net.ErrClosed", r.n, r.err)
	}
}

// TestCopyFailsWhenPeerGone: the destination's peer disappears with a
// reset; Copy reports an error instead of spinning or hanging.
func TestCopyFailsWhenPeerGone(t *testing.T) {
	t.Parallel()
	p := newProxied(t)
	p.server.SetLinger(0)
	p.server.Close() // RST
	go func() {
		chunk := make([]byte, 64<<10)
		for {
			if _, err := p.client.Write(chunk); err != nil {
				return // ends when the test's cleanup closes the client
			}
		}
	}()
	if r := wait(t, p.toServer, "to server"); r.err == nil {
		t.Fatalf("Copy to a reset peer = %d, nil; want an error", r.n)
	}
}

// TestFailedDrainLeaksNoBytes: a relay whose destination resets while a
// message is still in its pipe must not hand that pipe, bytes and all, to
// the next message of another session.
func TestFailedDrainLeaksNoBytes(t *testing.T) {
	for round := range 5 {
		p := newProxied(t)
		p.server.SetLinger(0)
		p.server.Close() // RST
		go func() {
			chunk := bytes.Repeat([]byte{'x'}, 256<<10)
			for {
				if _, err := p.client.Write(chunk); err != nil {
					return
				}
			}
		}()
		if r := wait(t, p.toServer, "to server"); r.err == nil {
			t.Fatalf("round %d: Copy to a reset peer = %d, nil; want an error", round, r.n)
		}
		q := newProxied(t)
		msg := []byte("only this")
		q.client.Write(msg)
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(q.server, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("round %d: next session received %q, %v; want %q", round, got, err, msg)
		}
	}
}

// TestCopyNonTCP: anything but two TCP sockets goes through io.Copy.
func TestCopyNonTCP(t *testing.T) {
	t.Parallel()
	a, b := net.Pipe()
	c, d := net.Pipe()
	done := make(chan result, 1)
	go func() {
		n, err := Copy(c, b)
		done <- result{n, err}
	}()
	go func() { a.Write([]byte("hello")); a.Close() }()
	got := make([]byte, 5)
	if _, err := io.ReadFull(d, got); err != nil || string(got) != "hello" {
		t.Fatalf("read %q, %v", got, err)
	}
	if r := wait(t, done, "net.Pipe"); r.err != nil || r.n != 5 {
		t.Fatalf("Copy = %d, %v; want 5, nil", r.n, r.err)
	}
}

// BenchmarkPingPong measures one small message relayed each way per
// iteration: Copy against io.Copy (the standard library's splice path).
func BenchmarkPingPong(b *testing.B) {
	for _, bc := range []struct {
		name string
		copy func(dst, src net.Conn) (int64, error)
	}{
		{"relay.Copy", Copy},
		{"io.Copy", func(dst, src net.Conn) (int64, error) { return io.Copy(dst, src) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			client, in := tcpPair(b)
			out, server := tcpPair(b)
			go bc.copy(out, in)
			go bc.copy(in, out)
			go io.Copy(server, server)
			msg := make([]byte, 100)
			b.SetBytes(int64(2 * len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				client.Write(msg)
				if _, err := io.ReadFull(client, msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestConnTLS runs TLS over Conn on both ends of a real TCP connection and
// moves 4 MiB each way through it, as the proxy does for TLS clients.
func TestConnTLS(t *testing.T) {
	t.Parallel()
	a, b := tcpPair(t)
	conf, err := certs.ServerConfig(t.TempDir(), "", "", []string{"localhost"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	srv := tls.Server(Conn(a), conf)
	cli := tls.Client(Conn(b), &tls.Config{InsecureSkipVerify: true})
	exchange(t, cli, srv, 4<<20, 16<<10)
}

// TestConnSemantics: EOF, deadlines and Close behave as on the TCP conn.
func TestConnSemantics(t *testing.T) {
	t.Parallel()
	a, b := tcpPair(t)
	q := Conn(a)
	if _, ok := q.(*net.TCPConn); ok && runtime.GOOS == "linux" {
		t.Fatal("Conn returned the *net.TCPConn itself on Linux")
	}
	if _, ok := q.(io.ReaderFrom); ok {
		t.Fatal("Conn exposes ReadFrom, which io.Copy would use instead of Read")
	}

	q.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := q.Read(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past the deadline = %v, want os.ErrDeadlineExceeded", err)
	}
	q.SetReadDeadline(time.Time{})

	b.Write([]byte("hi"))
	b.CloseWrite()
	got, err := io.ReadAll(q)
	if err != nil || string(got) != "hi" {
		t.Fatalf("ReadAll = %q, %v; want \"hi\" then EOF", got, err)
	}
	if n, err := q.Write([]byte("back")); err != nil || n != 4 {
		t.Fatalf("Write = %d, %v", n, err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "back" {
		t.Fatalf("peer read %q, %v", buf, err)
	}

	done := make(chan error, 1)
	go func() {
		_, err := b.Read(make([]byte, 1)) // never arrives: nothing is sent
		done <- err
	}()
	blocked := make(chan error, 1)
	go func() {
		_, err := q.Read(make([]byte, 1))
		blocked <- err
	}()
	q.Close()
	select {
	case err := <-blocked:
		if err == nil {
			t.Fatal("Read on a closed Conn returned no error")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not end a Read waiting on the Conn")
	}
	if err := <-done; err != io.EOF {
		t.Fatalf("peer of a closed Conn read %v, want EOF", err)
	}

	c, d := net.Pipe()
	defer c.Close()
	defer d.Close()
	if Conn(c) != c {
		t.Fatal("Conn wrapped a non-TCP connection")
	}
}
