//go:build !linux

package daemon

import "syscall"

// raiseNoFile returns the limit on open files in effect. Elsewhere than
// Linux it leaves the limit alone: Go has already raised it as far as the
// system allows (on macOS the hard limit is often unlimited, which
// setrlimit refuses, and Go stops at kern.maxfilesperproc).
func raiseNoFile() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	return uint64(rl.Cur), nil
}
