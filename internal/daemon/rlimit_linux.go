//go:build linux

package daemon

import "syscall"

// raiseNoFile raises the soft limit on open files to the hard limit, so a
// flood of connections meets the proxy's own caps before the kernel's. Go
// does the same for its own process on start-up (since 1.19); this only
// acts when that did not happen. It returns the limit in effect.
func raiseNoFile() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Cur >= rl.Max {
		return rl.Cur, nil
	}
	want := rl
	want.Cur = rl.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return rl.Cur, err
	}
	return want.Cur, nil
}
