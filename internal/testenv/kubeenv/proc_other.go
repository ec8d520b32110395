//go:build !linux

package kubeenv

import (
	"os/exec"
	"syscall"
)

// sysProcAttr has no parent-death signal outside Linux: a test binary that
// dies there leaves its control plane running until killed by hand.
func sysProcAttr() *syscall.SysProcAttr { return nil }

type spawner struct{}

func newSpawner() *spawner                   { return &spawner{} }
func (s *spawner) start(cmd *exec.Cmd) error { return cmd.Start() }
func (s *spawner) close()                    {}
