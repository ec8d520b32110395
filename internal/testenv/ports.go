package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Test port blocks lie below Linux's ephemeral range (32768-60999), so no
// outgoing connection of another program takes one of them.
const (
	portBase   = 20000
	portBlocks = 500
	blockSize  = 20
)

// PortRange claims a block of ports for one test's pgwake (its port_range,
// "LOW-HIGH") for as long as the test runs. Projects keep their port
// across a restart, and go test runs packages as parallel processes, so
// two tests given the same range could take each other's ports between a
// down and an up; the claim is an flock on a file per block, held by this
// process, so it is exclusive across test processes and released even if
// the process dies.
func PortRange(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(os.TempDir(), "pgwake-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatalf("testenv: port blocks: %v", err)
	}
	// Start where this process's id points, so parallel processes rarely
	// try the same blocks first.
	start := os.Getpid() % portBlocks
	for i := range portBlocks {
		b := (start + i) % portBlocks
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprint(b)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			t.Fatalf("testenv: port blocks: %v", err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			continue
		}
		if err != nil {
			f.Close()
			t.Fatalf("testenv: lock port block: %v", err)
		}
		t.Cleanup(func() { f.Close() })
		low := portBase + b*blockSize
		return fmt.Sprintf("%d-%d", low, low+blockSize-1)
	}
	t.Fatal("testenv: every test port block is taken")
	return ""
}
