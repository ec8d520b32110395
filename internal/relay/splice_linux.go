package relay

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// maxSplice is what one splice asks for; the pipe's capacity (64 KiB by
// default) is the real bound.
const maxSplice = 1 << 20

const spliceFlags = unix.SPLICE_F_MOVE | unix.SPLICE_F_NONBLOCK

// pipe is a kernel pipe used as splice's buffer. It is only ever taken from
// the pool empty and put back empty.
type pipe struct{ r, w int }

// free holds empty pipes between messages, so a connection waiting for
// data holds none: 500 idle sessions cost 2000 fewer file descriptors than
// with io.Copy, which keeps one pipe per direction for a connection's life.
// A pipe is only out of the list while a message is in flight, so a few
// dozen cover a busy proxy; beyond that pipes are closed rather than kept.
// (A sync.Pool would keep an unbounded number until the next GC.)
var free = make(chan *pipe, 64)

func getPipe() (*pipe, error) {
	select {
	case p := <-free:
		return p, nil
	default:
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("%w: %w", errNoPipe, os.NewSyscallError("pipe2", err))
	}
	return &pipe{r: fds[0], w: fds[1]}, nil
}

// putPipe returns an empty pipe to the free list.
func putPipe(p *pipe) {
	select {
	case free <- p:
	default:
		p.close()
	}
}

func (p *pipe) close() {
	unix.Close(p.r)
	unix.Close(p.w)
}

// errNoPipe is a failure to create a pipe (out of file descriptors, say).
var errNoPipe = errors.New("no pipe for splice")

// spliceCopy is Copy between two TCP sockets. handled is false when the
// kernel refuses to splice these sockets (EINVAL) or no pipe can be had
// before any byte of the current message was taken: the caller then
// finishes the session through user space.
func spliceCopy(dst, src *net.TCPConn) (written int64, handled bool, err error) {
	rc, err := src.SyscallConn()
	if err != nil {
		return 0, false, nil
	}
	wc, err := dst.SyscallConn()
	if err != nil {
		return 0, false, nil
	}
	s := &splicer{}
	// Bound once: a closure per message would allocate per message.
	fill, drain := s.fill, s.drain
	for {
		s.n, s.sent, s.err = 0, 0, nil
		err := rc.Read(fill)
		if err == nil {
			err = s.err
		}
		if (err != nil || s.n == 0) && s.p != nil {
			putPipe(s.p) // still empty
			s.p = nil
		}
		if err == unix.EINVAL || errors.Is(err, errNoPipe) {
			// Nothing of this message was taken yet: finish the
			// session through user space rather than end it.
			return written, false, nil
		}
		if err != nil {
			return written, true, wrap(err)
		}
		if s.n == 0 {
			return written, true, nil // EOF
		}
		err = wc.Write(drain)
		if err == nil {
			err = s.err
		}
		written += int64(s.sent)
		if err != nil {
			// The pipe may still hold unsent bytes: never reuse it.
			s.p.close()
			s.p = nil
			return written, true, wrap(err)
		}
		putPipe(s.p)
		s.p = nil
	}
}

// splicer is one direction's state while a message moves through a pipe.
type splicer struct {
	p    *pipe // taken for the message in flight
	n    int   // bytes in p
	sent int   // bytes of them written out
	err  error // from the syscall, for the Read or Write callback's caller
}

// fill, run by RawConn.Read, moves what src has (up to a pipe's worth)
// into a pipe from the free list. It reports false, making Read wait for
// src to become readable, when there is nothing to read yet.
func (s *splicer) fill(fd uintptr) bool {
	if s.p == nil {
		if s.p, s.err = getPipe(); s.err != nil {
			return true
		}
	}
	for {
		r, _, errno := unix.RawSyscall6(unix.SYS_SPLICE, fd, 0, uintptr(s.p.w), 0, maxSplice, spliceFlags)
		switch errno {
		case 0:
			s.n = int(r)
			return true
		case unix.EINTR:
		case unix.EAGAIN:
			// The pipe is empty, so this is the socket: wait for it
			// without holding the pipe.
			putPipe(s.p)
			s.p = nil
			return false
		default:
			s.err = errno
			return true
		}
	}
}

// drain, run by RawConn.Write, writes the message in the pipe to dst. It
// reports false, making Write wait, whenever dst's send buffer is full.
func (s *splicer) drain(fd uintptr) bool {
	for s.sent < s.n {
		r, _, errno := unix.RawSyscall6(unix.SYS_SPLICE, uintptr(s.p.r), 0, fd, 0, uintptr(s.n-s.sent), spliceFlags)
		switch errno {
		case 0:
			if r == 0 {
				s.err = io.ErrShortWrite // cannot happen with data in the pipe; never spin
				return true
			}
			s.sent += int(r)
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			s.err = errno
			return true
		}
	}
	return true
}

func wrap(err error) error {
	if errno, ok := err.(unix.Errno); ok {
		return os.NewSyscallError("splice", errno)
	}
	return err
}
