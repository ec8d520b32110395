package kubeenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// process is one control-plane binary the env runs, its output going to
// <dir>/<name>.log.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once the process has exited
	waitErr error         // cmd.Wait's result; read only after done
}

// startProcess runs bin with args through sp (see spawner), with stdout and
// stderr appended to dir/name.log.
func startProcess(sp *spawner, dir, name, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := sp.start(cmd); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// stop asks the process to exit (SIGTERM) and kills it if it has not
// within grace. It returns once the process is gone.
func (p *process) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exitErr is non-nil once the process has exited: why, with its log's tail.
func (p *process) exitErr() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.name, p.waitErr, p.logPath, p.tail(30))
	default:
		return nil
	}
}

// tail returns the last n lines of the process's log.
func (p *process) tail(n int) string {
	return tailFile(p.logPath, n)
}

// tailFile returns the last n lines of the file at path (at most its
// last 64 KiB are read).
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	defer f.Close()
	const window = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > window {
		_, _ = f.Seek(-window, io.SeekEnd)
	}
	data, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitReady polls url every 100 ms until it answers 200 with a body
// containing want, the process exits (an error with its log's tail) or ctx
// ends (an error naming the last answer, with the log's tail).
func (p *process) waitReady(ctx context.Context, url, token string, tlsConf *tls.Config, want string) error {
	hc := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: tlsConf, DisableKeepAlives: true},
	}
	last := "no answer yet"
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte(want)) {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, firstLines(string(body), 20))
		} else {
			last = err.Error()
		}
		select {
		case <-p.done:
			return p.exitErr()
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s (%v; last answer: %s); last lines of %s:\n%s",
				p.name, url, ctx.Err(), last, p.logPath, p.tail(30))
		case <-tick.C:
		}
	}
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(strings.TrimSpace(s), "\n", n+1)
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "\n")
}

// freePort returns a loopback TCP port nobody listened on a moment ago. The
// port is free only until somebody else takes it; a start that fails on
// "address already in use" is retried with new ports (see isPortClash).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// isPortClash reports whether a start failed because a port picked by
// freePort was taken in between.
func isPortClash(err error) bool {
	return err != nil && (errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use"))
}
