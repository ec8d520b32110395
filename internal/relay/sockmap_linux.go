package relay

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Kernel is the kernel's socket splicing: an eBPF sockmap with a stream
// verdict program that sends whatever arrives on one socket of a pair out
// of the other, in softirq context, without waking this process. Bytes
// then never reach user space, so a pair is handed over only once the
// proxy has nothing more to learn from them (after the startup phase), and
// never with TLS on either side.
//
// The proxy does not use it: for the small request and reply of a
// pgbench -S transaction it measured slower than splice(2), 16.5 against
// 11.8 µs per round trip on a quiet 2-CPU machine (BenchmarkPingPongKernel),
// because a redirect to the peer's egress goes through the socket's
// backlog work queue, a kworker wake-up per message. It stays, with its
// benchmarks, for bulk transfer (BenchmarkBulkKernel), where that cost is
// spread over more bytes.
//
// The program looks the receiving socket up by its cookie in a hash map
// (cookie -> peer's slot in the sockmap, bytes moved), counts the bytes
// and redirects to the peer's slot. It always returns SK_PASS: with a
// redirect set that sends the data to the peer; without one (no entry, a
// peer already gone) the data stays on its socket for a user-space read,
// so nothing is ever dropped.
type Kernel struct {
	socks *ebpf.Map // SockMap: slot -> socket
	peers *ebpf.Map // Hash: cookie -> peerEntry
	prog  *ebpf.Program

	mu   sync.Mutex
	free []uint32 // free pairs of slots, by their even slot
	next uint32   // the next even slot never used
	max  uint32
}

// peerEntry is the hash map's value, shared with the program's layout.
type peerEntry struct {
	Peer  uint32
	_     uint32
	Bytes uint64
}

// skPass is the verdict that keeps data (or, with a redirect set, sends it
// on).
const skPass = 1

// NewKernel loads the sockmap, the map of peers and the verdict program,
// for up to pairs spliced pairs at a time. It fails, with an error that
// says why, where the kernel or the process's privileges do not allow it
// (not root, no BPF, kernels before 5.13); callers then keep relaying
// through user space.
func NewKernel(pairs int) (*Kernel, error) {
	if pairs <= 0 || pairs > 1<<20 {
		return nil, fmt.Errorf("sockmap: %d pairs out of range", pairs)
	}
	// A no-op on kernels that account BPF memory to the cgroup (5.11+).
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("sockmap: %w", err)
	}
	k := &Kernel{max: uint32(2 * pairs)}
	var err error
	k.socks, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "pgwake_socks", Type: ebpf.SockMap,
		KeySize: 4, ValueSize: 4, MaxEntries: k.max,
	})
	if err != nil {
		return nil, fmt.Errorf("sockmap: create map: %w", err)
	}
	k.peers, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "pgwake_peers", Type: ebpf.Hash,
		KeySize: 8, ValueSize: 16, MaxEntries: k.max,
	})
	if err != nil {
		k.socks.Close()
		return nil, fmt.Errorf("sockmap: create peer map: %w", err)
	}
	k.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "pgwake_verdict",
		Type:    ebpf.SkSKB,
		License: "Apache-2.0",
		Instructions: asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1), // the __sk_buff
			asm.FnGetSocketCookie.Call(),
			asm.StoreMem(asm.RFP, -8, asm.R0, asm.DWord),
			asm.LoadMapPtr(asm.R1, k.peers.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -8),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "keep"),
			asm.LoadMem(asm.R2, asm.R6, 0, asm.Word), // skb->len
			asm.AddAtomic.Mem(asm.R0, asm.R2, asm.DWord, 8),
			asm.LoadMem(asm.R3, asm.R0, 0, asm.Word), // the peer's slot
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.LoadMapPtr(asm.R2, k.socks.FD()),
			asm.Mov.Imm(asm.R4, 0), // to the peer's egress
			asm.FnSkRedirectMap.Call(),
			asm.Mov.Imm(asm.R0, skPass).WithSymbol("keep"),
			asm.Return(),
		},
	})
	if err != nil {
		k.peers.Close()
		k.socks.Close()
		return nil, fmt.Errorf("sockmap: load verdict program: %w", err)
	}
	err = link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: k.socks.FD(), Program: k.prog, Attach: ebpf.AttachSkSKBStreamVerdict,
	})
	if err != nil {
		k.Close()
		return nil, fmt.Errorf("sockmap: attach verdict program: %w", err)
	}
	return k, nil
}

// Close releases the maps and the program. Pairs still spliced keep
// working until their sockets close: the sockets hold the map.
func (k *Kernel) Close() error {
	return errors.Join(k.prog.Close(), k.peers.Close(), k.socks.Close())
}

// Pair is two sockets spliced in the kernel.
type Pair struct {
	k            *Kernel
	slot         uint32
	cookA, cookB uint64
	once         sync.Once
	ab, ba       uint64
}

// ErrFull is returned by Splice when every pair of slots is in use.
var ErrFull = errors.New("sockmap: all slots in use")

// Splice hands a and b to the kernel: from now on what arrives on a is
// sent on b and the other way round. Both must be established TCP sockets
// with nothing unread (the caller stops reading them before, and hands
// them over at a point of the protocol where the peers wait for it). Their
// reads then return only EOF or an error (or, should the kernel not
// redirect something, that data), which is how the caller learns that a
// side closed. Remove, or closing either socket, ends the splice.
func (k *Kernel) Splice(a, b *net.TCPConn) (*Pair, error) {
	fa, err := sockFD(a)
	if err != nil {
		return nil, err
	}
	fb, err := sockFD(b)
	if err != nil {
		return nil, err
	}
	slot, err := k.alloc()
	if err != nil {
		return nil, err
	}
	p := &Pair{k: k, slot: slot}
	var ctlB, insertErr error
	ctlA := fa.Control(func(a uintptr) {
		ctlB = fb.Control(func(b uintptr) { insertErr = p.insert(int(a), int(b)) })
	})
	if err := errors.Join(ctlA, ctlB, insertErr); err != nil {
		p.Remove()
		return nil, err
	}
	return p, nil
}

func (p *Pair) insert(a, b int) error {
	k := p.k
	var err error
	if p.cookA, err = unix.GetsockoptUint64(a, unix.SOL_SOCKET, unix.SO_COOKIE); err != nil {
		return fmt.Errorf("sockmap: socket cookie: %w", err)
	}
	if p.cookB, err = unix.GetsockoptUint64(b, unix.SOL_SOCKET, unix.SO_COOKIE); err != nil {
		return fmt.Errorf("sockmap: socket cookie: %w", err)
	}
	// Peers first: a socket in the sockmap whose peer is not there yet
	// keeps its data rather than losing it.
	if err := k.peers.Update(p.cookA, peerEntry{Peer: p.slot + 1}, ebpf.UpdateNoExist); err != nil {
		return fmt.Errorf("sockmap: add peer: %w", err)
	}
	if err := k.peers.Update(p.cookB, peerEntry{Peer: p.slot}, ebpf.UpdateNoExist); err != nil {
		return fmt.Errorf("sockmap: add peer: %w", err)
	}
	if err := k.socks.Update(p.slot, uint32(a), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("sockmap: add socket: %w", err)
	}
	if err := k.socks.Update(p.slot+1, uint32(b), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("sockmap: add socket: %w", err)
	}
	return nil
}

// Remove ends the splice and frees its slots; the sockets stay open, and
// what arrives on them afterwards is theirs to read. It returns the bytes
// the kernel moved from a to b and from b to a. Safe to call more than
// once: later calls return the same counts.
func (p *Pair) Remove() (ab, ba uint64) {
	p.once.Do(func() {
		k := p.k
		var e peerEntry
		if p.cookA != 0 && k.peers.Lookup(p.cookA, &e) == nil {
			p.ab = e.Bytes
		}
		if p.cookB != 0 && k.peers.Lookup(p.cookB, &e) == nil {
			p.ba = e.Bytes
		}
		// Missing entries (a closed socket leaves the sockmap by itself)
		// are not errors here.
		_ = k.socks.Delete(p.slot)
		_ = k.socks.Delete(p.slot + 1)
		if p.cookA != 0 {
			_ = k.peers.Delete(p.cookA)
		}
		if p.cookB != 0 {
			_ = k.peers.Delete(p.cookB)
		}
		k.release(p.slot)
	})
	return p.ab, p.ba
}

func (k *Kernel) alloc() (uint32, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if n := len(k.free); n > 0 {
		s := k.free[n-1]
		k.free = k.free[:n-1]
		return s, nil
	}
	if k.next >= k.max {
		return 0, ErrFull
	}
	s := k.next
	k.next += 2
	return s, nil
}

func (k *Kernel) release(slot uint32) {
	k.mu.Lock()
	k.free = append(k.free, slot)
	k.mu.Unlock()
}

func sockFD(c *net.TCPConn) (syscall.RawConn, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("sockmap: %w", err)
	}
	return rc, nil
}

// bufPool holds the buffers of CopySpliced, which needs one only in the
// rare case that the kernel left data on a spliced socket.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// CopySpliced is Copy for a socket spliced by a Kernel: it waits, holding
// no buffer, until src has something for user space (EOF, an error, or
// data the kernel did not redirect, which it writes to dst), and returns
// at EOF or on an error. The count is only of bytes that passed through
// user space.
func CopySpliced(dst, src *net.TCPConn) (int64, error) {
	rc, err := src.SyscallConn()
	if err != nil {
		return 0, err
	}
	var written int64
	for {
		var peeked int
		var perr error
		err := rc.Read(func(fd uintptr) bool {
			var b [1]byte
			for {
				n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
				switch {
				case err == unix.EINTR:
					continue
				case err == unix.EAGAIN:
					return false
				}
				peeked, perr = n, err
				return true
			}
		})
		if err != nil {
			return written, err
		}
		if perr != nil {
			return written, perr
		}
		if peeked == 0 {
			return written, nil // EOF
		}
		bp := bufPool.Get().(*[]byte)
		n, rerr := src.Read(*bp)
		if n > 0 {
			w, werr := dst.Write((*bp)[:n])
			written += int64(w)
			if werr != nil {
				bufPool.Put(bp)
				return written, werr
			}
		}
		bufPool.Put(bp)
		if rerr != nil {
			return written, rerr
		}
	}
}
