// Package relay copies bytes between two connections the way a
// wire-protocol proxy needs it: on Linux, between two TCP sockets, through
// splice(2) (zero-copy, like io.Copy) but without the per-call scheduler
// overhead of the standard library's splice path, and with no pipe held by
// an idle connection. Anywhere else it is io.Copy.
//
// Why not io.Copy: io.Copy between two *net.TCPConn already splices, but it
// issues every splice as a blocking-capable syscall (entersyscall and
// exitsyscall). When the process has been idle, the runtime's sysmon thread
// is parked, and the first syscall after the idle period wakes it; a proxy
// relaying one small query or reply per wake-up pays that futex wake and
// sysmon's following 20 µs polling naps for nearly every message. Measured
// with pgbench -S at a fixed 6000 transactions per second on 2 vCPUs, the
// daemon went from 75 to 53 µs of CPU and from 3.5 to 1.8 context switches
// per transaction (bench/README.md). The sockets are non-blocking, so
// splice never blocks and can be a raw syscall; waiting for readiness
// still goes through the runtime's netpoller (syscall.RawConn), exactly as
// the standard library does.
//
// The price of a raw syscall is that its thread keeps the scheduler's P
// while in the kernel. On non-blocking sockets and pipes these calls do not
// sleep, short of a brief wait for a socket lock or memory reclaim under
// pressure, when the whole machine is slowed anyway.
package relay

import (
	"io"
	"net"
)

// Copy copies from src to dst until src reaches EOF or an error occurs, and
// returns the number of bytes written to dst. As with io.Copy, a clean EOF
// is not an error. Closing either connection from another goroutine ends a
// Copy that is waiting for it.
func Copy(dst, src net.Conn) (int64, error) {
	var written int64
	d, dok := dst.(*net.TCPConn)
	s, sok := src.(*net.TCPConn)
	if dok && sok {
		n, handled, err := spliceCopy(d, s)
		if handled {
			return n, err
		}
		written = n
	}
	// Through user space (TLS on a side): 16 KiB is a TLS record's most.
	n, err := io.CopyBuffer(Conn(dst), Conn(src), make([]byte, 16<<10))
	return written + n, err
}
