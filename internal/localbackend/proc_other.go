//go:build !linux

package localbackend

// postmasterAlive reports whether pid is alive. Without /proc there is no
// cheap way to read another user's process arguments, so a stale
// postmaster.pid whose pid was reused still counts as a server here; the
// file's own data directory line has been checked.
func postmasterAlive(pid int, dataDir string) bool {
	_ = dataDir
	return signalAlive(pid)
}
