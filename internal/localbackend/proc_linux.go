package localbackend

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
)

// postmasterAlive reports whether pid is a live postmaster of dataDir. A
// postmaster killed outside pgwake (SIGKILL, the OOM killer) leaves its
// postmaster.pid behind, and the pid may since have been given to any
// process, which kill(pid, 0) would take for the server.
//
// It reads /proc/<pid>/cmdline, which any user may read: /proc/<pid>/exe
// and cwd of another user's process need privileges, and pgwake runs
// either as the server's user or as root with the server as postgres. A
// zombie's cmdline is empty: a postmaster that exited is not alive.
func postmasterAlive(pid int, dataDir string) bool {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && procMounted() {
			return false
		}
		return signalAlive(pid)
	}
	return isPostmasterCmdline(raw, dataDir)
}

func procMounted() bool {
	_, err := os.Stat("/proc/self/cmdline")
	return err == nil
}
