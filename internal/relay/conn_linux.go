package relay

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Conn returns c with its Read and Write issued as raw syscalls, for data
// that must pass through user space (TLS): the same saving as Copy's
// splice, for the same reason (package comment). Anything but a
// *net.TCPConn is returned unchanged. Deadlines and Close work as on c.
// Like a net.Conn, it allows one Read and one Write at a time, each from
// its own goroutine.
func Conn(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	q := &quietConn{Conn: tc, rc: rc}
	q.r.fn, q.w.fn = q.r.read, q.w.write
	return q
}

// quietConn embeds net.Conn rather than *net.TCPConn so that io.Copy finds
// no ReadFrom or WriteTo to bypass Read and Write with.
type quietConn struct {
	net.Conn
	rc   syscall.RawConn
	r, w ioState
}

// ioState is one direction's call in progress; fn is bound once so a call
// does not allocate a closure.
type ioState struct {
	b     []byte
	n     int
	errno unix.Errno
	fn    func(fd uintptr) bool
}

func (s *ioState) read(fd uintptr) bool {
	for {
		r, _, errno := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&s.b[0])), uintptr(len(s.b)))
		switch errno {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
			s.n = int(r)
		default:
			s.errno = errno
		}
		return true
	}
}

func (s *ioState) write(fd uintptr) bool {
	for s.n < len(s.b) {
		r, _, errno := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&s.b[s.n])), uintptr(len(s.b)-s.n))
		switch errno {
		case 0:
			s.n += int(r)
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			s.errno = errno
			return true
		}
	}
	return true
}

func (c *quietConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	s := &c.r
	s.b, s.n, s.errno = b, 0, 0
	err := c.rc.Read(s.fn)
	s.b = nil
	switch {
	case err != nil:
		return 0, err
	case s.errno != 0:
		return 0, c.opError("read", s.errno)
	case s.n == 0:
		return 0, io.EOF
	}
	return s.n, nil
}

func (c *quietConn) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	s := &c.w
	s.b, s.n, s.errno = b, 0, 0
	err := c.rc.Write(s.fn)
	n := s.n
	s.b = nil
	switch {
	case err != nil:
		return n, err
	case s.errno != 0:
		return n, c.opError("write", s.errno)
	}
	return n, nil
}

func (c *quietConn) opError(op string, errno unix.Errno) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}
