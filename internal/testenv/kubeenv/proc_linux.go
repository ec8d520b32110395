package kubeenv

import (
	"os/exec"
	"runtime"
	"syscall"
)

// sysProcAttr makes the kernel kill a control-plane process when its parent
// thread dies, so a test binary that crashes or is killed (go test's
// -timeout, Ctrl-C, SIGKILL) leaves no etcd or API server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// spawner starts processes from one OS thread that lives as long as the
// env. Linux delivers Pdeathsig when the *thread* that forked the child
// exits, not the process (golang.org/issue/27505), and the Go runtime may
// retire any thread a goroutine ran on; this thread is locked and kept until
// close, and when its goroutine returns still locked the runtime ends the
// thread, which signals any child that is somehow still alive.
type spawner struct {
	reqs chan spawnReq
	done chan struct{}
}

type spawnReq struct {
	cmd   *exec.Cmd
	reply chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnReq), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		defer close(s.done)
		for r := range s.reqs {
			r.reply <- r.cmd.Start()
		}
	}()
	return s
}

func (s *spawner) start(cmd *exec.Cmd) error {
	reply := make(chan error, 1)
	s.reqs <- spawnReq{cmd, reply}
	return <-reply
}

// close ends the spawning thread; call it after stopping every process.
func (s *spawner) close() {
	close(s.reqs)
	<-s.done
}
