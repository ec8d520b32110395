package relay

// Tests of the kernel splice (sockmap) with real sockets on loopback. They
// need what pgwake needs for it: root (CAP_BPF, CAP_NET_ADMIN) and a
// kernel with sockmap stream verdicts; where that is missing they say so
// and skip, as pgwake itself falls back to user space.

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"os"
	"testing"
)

func newKernel(t *testing.T, pairs int) *Kernel {
	t.Helper()
	k, err := NewKernel(pairs)
	if err != nil {
		if os.Geteuid() == 0 && os.Getenv("PGWAKE_REQUIRE_SOCKMAP") != "" {
			t.Fatalf("PGWAKE_REQUIRE_SOCKMAP set, but: %v", err)
		}
		t.Skipf("no kernel splice here: %v", err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// splicedProxy is a proxy's two sockets spliced in the kernel: client talks
// to in, out talks to server, and in and out are spliced.
func splicedProxy(t *testing.T, k *Kernel) (client, server *net.TCPConn, p *Pair, done chan [2]int64) {
	client, in := tcpPair(t)
	out, server := tcpPair(t)
	p, err := k.Splice(in, out)
	if err != nil {
		t.Fatal(err)
	}
	done = make(chan [2]int64, 1)
	go func() {
		// A proxy's two waits: each ends when its side closes, then
		// closes both, as pgwake's pipe does.
		up := make(chan int64, 1)
		go func() {
			n, _ := CopySpliced(out, in)
			in.Close()
			out.Close()
			up <- n
		}()
		n, _ := CopySpliced(in, out)
		in.Close()
		out.Close()
		done <- [2]int64{<-up, n}
	}()
	return client, server, p, done
}

func TestKernelSpliceBothWays(t *testing.T) {
	k := newKernel(t, 4)
	client, server, p, done := splicedProxy(t, k)

	// Request and reply, many times, as a protocol does.
	for i := range 200 {
		q := []byte("query number ")
		q = append(q, byte('0'+i%10))
		if _, err := client.Write(q); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(q))
		if _, err := io.ReadFull(server, got); err != nil || !bytes.Equal(got, q) {
			t.Fatalf("round %d: server read %q, %v; want %q", i, got, err, q)
		}
		r := append([]byte("reply to "), q...)
		if _, err := server.Write(r); err != nil {
			t.Fatal(err)
		}
		got = make([]byte, len(r))
		if _, err := io.ReadFull(client, got); err != nil || !bytes.Equal(got, r) {
			t.Fatalf("round %d: client read %q, %v; want %q", i, got, err, r)
		}
	}
	// A bulk transfer larger than any socket buffer, as COPY is.
	bulk := make([]byte, 32<<20)
	rand.Read(bulk)
	go func() {
		client.Write(bulk)
	}()
	got := make([]byte, len(bulk))
	if _, err := io.ReadFull(server, got); err != nil || !bytes.Equal(got, bulk) {
		t.Fatalf("bulk: %v, equal %v", err, bytes.Equal(got, bulk))
	}

	ab, ba := p.Remove()
	wantAB := uint64(200*len("query number 0") + len(bulk))
	wantBA := uint64(200 * len("reply to query number 0"))
	if ab != wantAB || ba != wantBA {
		t.Errorf("kernel counted %d and %d bytes, want %d and %d", ab, ba, wantAB, wantBA)
	}
	// After Remove the sockets are ordinary again: the user-space wait
	// relays, so the session goes on.
	if _, err := client.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	after := make([]byte, 5)
	if _, err := io.ReadFull(server, after); err != nil || string(after) != "after" {
		t.Fatalf("after Remove the server read %q, %v", after, err)
	}

	// The client hanging up ends both waits and reaches the server.
	client.Close()
	if n, err := server.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("server read %d, %v after the client closed; want EOF", n, err)
	}
	counts := <-done
	if counts[0] != 5 || counts[1] != 0 {
		t.Errorf("user space relayed %v bytes, want [5 0] (only what came after Remove)", counts)
	}
}

// TestKernelSpliceServerCloses: the server side closing first is seen too.
func TestKernelSpliceServerCloses(t *testing.T) {
	k := newKernel(t, 1)
	client, server, p, done := splicedProxy(t, k)
	server.Write([]byte("bye"))
	server.Close()
	got, err := io.ReadAll(client)
	if err != nil || string(got) != "bye" {
		t.Fatalf("client read %q, %v; want \"bye\" then EOF", got, err)
	}
	<-done
	if _, ba := p.Remove(); ba != 3 {
		t.Errorf("kernel counted %d bytes server to client, want 3", ba)
	}
}

// TestKernelSpliceFull: slots run out cleanly and come back.
func TestKernelSpliceFull(t *testing.T) {
	k := newKernel(t, 1)
	_, a := tcpPair(t)
	b, _ := tcpPair(t)
	p, err := k.Splice(a, b)
	if err != nil {
		t.Fatal(err)
	}
	_, c := tcpPair(t)
	d, _ := tcpPair(t)
	if _, err := k.Splice(c, d); err != ErrFull {
		t.Fatalf("second pair with one slot pair: %v, want ErrFull", err)
	}
	p.Remove()
	p2, err := k.Splice(c, d)
	if err != nil {
		t.Fatalf("after Remove: %v", err)
	}
	p2.Remove()
}

// BenchmarkPingPongKernel: one small request and reply through a relay, as a
// pgbench -S transaction is, through user space (splice) and through the
// kernel splice. Reports the relay's round trip; compare with -cpu 1,2.
func BenchmarkPingPongKernel(b *testing.B) {
	bothRelays(b, func(b *testing.B, client, server *net.TCPConn) {
		q, r := make([]byte, 100), make([]byte, 300)
		buf := make([]byte, 300)
		b.ResetTimer()
		for b.Loop() {
			client.Write(q)
			io.ReadFull(server, buf[:len(q)])
			server.Write(r)
			io.ReadFull(client, buf[:len(r)])
		}
	})
}

// BenchmarkBulkKernel: 1 MiB one way through a relay, as a COPY is, through
// user space (splice) and through the kernel splice.
func BenchmarkBulkKernel(b *testing.B) {
	bothRelays(b, func(b *testing.B, client, server *net.TCPConn) {
		chunk := make([]byte, 64<<10)
		b.SetBytes(1 << 20)
		b.ResetTimer()
		for b.Loop() {
			done := make(chan struct{})
			go func() {
				io.ReadFull(server, make([]byte, 1<<20))
				close(done)
			}()
			for range 16 {
				client.Write(chunk)
			}
			<-done
		}
	})
}

// bothRelays runs a benchmark of client and server talking through a
// relay in user space (splice) and through the kernel splice.
func bothRelays(b *testing.B, run func(b *testing.B, client, server *net.TCPConn)) {
	b.Run("splice", func(b *testing.B) {
		client, in := tcpPair(b)
		out, server := tcpPair(b)
		go Copy(out, in)
		go Copy(in, out)
		run(b, client, server)
	})
	b.Run("sockmap", func(b *testing.B) {
		k, err := NewKernel(1)
		if err != nil {
			b.Skip(err)
		}
		defer k.Close()
		client, in := tcpPair(b)
		out, server := tcpPair(b)
		p, err := k.Splice(in, out)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Remove()
		go CopySpliced(out, in)
		go CopySpliced(in, out)
		run(b, client, server)
	})
}
