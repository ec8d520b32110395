package testenv_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"

	"github.com/pgwake/pgwake/internal/testenv"
)

// TestStopLocalServersSignalsOnlyTheirServers: a postmaster.pid left by a
// server killed with SIGKILL names a pid the kernel may since have given
// to another process (a container's Postgres, say); StopLocalServers must
// stop the servers that run in their data directories and leave that
// process alone.
func TestStopLocalServersSignalsOnlyTheirServers(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("tells a server by its working directory in /proc")
	}
	root := t.TempDir()
	// start runs a stand-in process in dir (its data directory when dir
	// is "") and writes a postmaster.pid naming it for project name.
	start := func(name, dir string) *exec.Cmd {
		t.Helper()
		data := filepath.Join(root, name, "data")
		if err := os.MkdirAll(data, 0o700); err != nil {
			t.Fatal(err)
		}
		if dir == "" {
			dir = data
		}
		cmd := exec.Command("sleep", "600")
		cmd.Dir = dir
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		pidfile := strconv.Itoa(cmd.Process.Pid) + "\n" + data + "\n"
		if err := os.WriteFile(filepath.Join(data, "postmaster.pid"), []byte(pidfile), 0o600); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	server := start("live", "")
	other := start("stale", t.TempDir())

	testenv.StopLocalServers(root)

	// StopLocalServers returns once the server is gone: a zombie to reap.
	var ws syscall.WaitStatus
	if pid, err := syscall.Wait4(server.Process.Pid, &ws, syscall.WNOHANG, nil); err != nil || pid == 0 || !ws.Signaled() || ws.Signal() != syscall.SIGQUIT {
		t.Fatalf("the server in its data directory: wait4 = %d, %v, status %v; want it ended by SIGQUIT", pid, err, ws)
	}
	if pid, err := syscall.Wait4(other.Process.Pid, &ws, syscall.WNOHANG, nil); err != nil || pid != 0 {
		t.Fatalf("the process given a dead server's pid: wait4 = %d, %v, status %v; want it still running", pid, err, ws)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("root after StopLocalServers: %v, want it removed", err)
	}
}
