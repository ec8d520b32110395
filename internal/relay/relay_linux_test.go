package relay

// Tests of the Linux splice path: its pipe free list, descriptor limits and
// /proc/self/fd. Elsewhere Copy is io.Copy and holds no pipes.

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"syscall"
	"testing"
)

// TestOutOfDescriptors: with no descriptor left for a pipe, a session
// goes on through user space instead of ending.
func TestOutOfDescriptors(t *testing.T) {
	client, in := tcpPair(t)
	out, server := tcpPair(t)
	// Empty the free list, so that the relay, started only once no
	// descriptor is left, has to ask for a new pipe.
	for len(free) > 0 {
		(<-free).close()
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = uint64(openFDs(t) + 8)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("cannot lower RLIMIT_NOFILE: %v", err)
	}
	var held []*os.File
	defer func() {
		for _, f := range held {
			f.Close()
		}
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}()
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break // EMFILE: no descriptor left
		}
		held = append(held, f)
	}
	go Copy(out, in)
	for i := range 3 {
		msg := []byte(fmt.Sprintf("message %d", i))
		client.Write(msg)
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(server, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("with no descriptors left, the server read %q, %v; want %q", got, err, msg)
		}
	}
}

// TestIdleRelaysHoldNoPipes: after traffic, idle relays keep only their
// sockets open; io.Copy's splice would keep two more descriptors per
// direction for the connection's life.
func TestIdleRelaysHoldNoPipes(t *testing.T) {
	const n = 50
	before := openFDs(t)
	ps := make([]*proxied, n)
	for i := range ps {
		ps[i] = newProxied(t)
	}
	buf := make([]byte, 5)
	for _, p := range ps {
		// One message each way, delivered before the next relay is used.
		p.client.Write([]byte("query"))
		if _, err := io.ReadFull(p.server, buf); err != nil {
			t.Fatal(err)
		}
		p.server.Write([]byte("reply"))
		if _, err := io.ReadFull(p.client, buf); err != nil {
			t.Fatal(err)
		}
	}
	sockets := 4 * n // client, in, out, server
	pooled := 2 * 2 * runtime.GOMAXPROCS(0)
	if got := openFDs(t) - before; got > sockets+pooled {
		t.Fatalf("%d idle relays hold %d descriptors; want their %d sockets plus at most %d pooled pipe ends", n, got, sockets, pooled)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
