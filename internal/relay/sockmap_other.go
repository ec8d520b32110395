//go:build !linux

package relay

import (
	"errors"
	"net"
)

// Kernel is the kernel's socket splicing, Linux only; see sockmap_linux.go.
type Kernel struct{}

// Pair is two sockets spliced in the kernel.
type Pair struct{}

// ErrFull is returned by Splice when every pair of slots is in use.
var ErrFull = errors.New("sockmap: all slots in use")

var errNoSockmap = errors.New("sockmap: Linux only")

// NewKernel fails: only Linux has sockmaps.
func NewKernel(pairs int) (*Kernel, error) { return nil, errNoSockmap }

// Close does nothing.
func (k *Kernel) Close() error { return nil }

// Splice fails: only Linux has sockmaps.
func (k *Kernel) Splice(a, b *net.TCPConn) (*Pair, error) { return nil, errNoSockmap }

// Remove does nothing.
func (p *Pair) Remove() (ab, ba uint64) { return 0, 0 }

// CopySpliced is Copy: nothing is ever spliced in the kernel here.
func CopySpliced(dst, src *net.TCPConn) (int64, error) { return Copy(dst, src) }
