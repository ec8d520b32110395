package localbackend

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgwake/pgwake/internal/backend"
)

// Init scripts run once, at the first start of data that Ensure made with
// them pending, against a temporary server that listens on the project's
// socket only (as the official image's entrypoint does): .sql and .sql.gz
// through psql with ON_ERROR_STOP, .sh with sh (or executed, when
// executable), in order. Markers in the data directory say how far they
// got, so that a failure is never served and never run again:
//
//	.pgwake-init-pending  Ensure made this data with init scripts to run
//	.pgwake-init-begun    the name of the script that runs (or ran last)
//	.pgwake-init-done     every script completed
//	.pgwake-init-failed   the failed script and its error (JSON)
const (
	markerPending = ".pgwake-init-pending"
	markerBegun   = ".pgwake-init-begun"
	markerDone    = ".pgwake-init-done"
	markerFailed  = ".pgwake-init-failed"
)

// initReadyTimeout bounds how long the temporary server may take to accept
// connections.
const initReadyTimeout = 2 * time.Minute

// initLogLines bounds what an init failure's message keeps of the script's
// output.
const initLogLines = 8

func (b *Backend) marker(project, name string) string {
	return filepath.Join(b.dataDir(project), name)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// writeMarker writes a marker and syncs it: it must survive a crash that
// follows.
func writeMarker(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// failureRecord is what .pgwake-init-failed holds.
type failureRecord struct {
	Script  string `json:"script"`
	Message string `json:"message"`
}

// initFailure returns the *backend.InitError of a project whose init began
// and did not complete, or nil.
func (b *Backend) initFailure(project string) error {
	if !exists(b.marker(project, markerBegun)) || exists(b.marker(project, markerDone)) {
		return nil
	}
	ie := &backend.InitError{Project: project}
	if raw, err := os.ReadFile(b.marker(project, markerFailed)); err == nil {
		var fr failureRecord
		if json.Unmarshal(raw, &fr) == nil {
			ie.Script, ie.Message = fr.Script, fr.Message
			return ie
		}
	}
	if raw, err := os.ReadFile(b.marker(project, markerBegun)); err == nil {
		ie.Script = strings.TrimSpace(string(raw))
	}
	ie.Message = "the start was interrupted while it ran"
	return ie
}

// InitFailure implements backend.InitChecker.
func (b *Backend) InitFailure(_ context.Context, spec backend.Spec) error {
	return b.initFailure(spec.Name)
}

// initPending reports whether the project's data waits for its init
// scripts.
func (b *Backend) initPending(project string) bool {
	return exists(b.marker(project, markerPending)) && !exists(b.marker(project, markerBegun))
}

// runInitLocked runs the project's init scripts against a temporary server
// on its socket only. A script that fails (or a start interrupted while
// they run) leaves the data marked: the error is an *backend.InitError,
// now and at every later start. A temporary server that does not start is
// an ordinary error, and the scripts run at the next start.
func (b *Backend) runInitLocked(ctx context.Context, spec backend.Spec, port int) error {
	psql, err := b.psqlPath()
	if err != nil {
		return err
	}
	c, err := b.launchArgs(spec.Name, append([]string{"-p", strconv.Itoa(port), "-k", b.sockDir(spec.Name), "-c", "listen_addresses="},
		backend.SettingArgs(spec.Settings)...))
	if err != nil {
		return fmt.Errorf("start the server for init scripts: %w", err)
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := b.stopLocked(sctx, spec.Name, "fast"); err != nil {
			b.log.Warn("stop the server init scripts ran against", "project", spec.Name, "err", err)
		}
		select {
		case <-c.done:
		case <-sctx.Done():
		}
	}
	if err := b.waitReady(ctx, c, spec.Name); err != nil {
		stop()
		return fmt.Errorf("start the server for init scripts: %w (see %s)", err, b.LogFile(spec.Name))
	}
	logf, err := os.OpenFile(b.LogFile(spec.Name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		stop()
		return err
	}
	defer logf.Close()
	for _, script := range spec.Init {
		name := filepath.Base(script)
		if err := writeMarker(b.marker(spec.Name, markerBegun), []byte(name+"\n")); err != nil {
			stop()
			return fmt.Errorf("init marker: %w", err)
		}
		fmt.Fprintf(logf, "pgwake: running init script %s\n", name)
		out, err := b.runScript(ctx, spec, psql, port, script)
		logf.Write(out)
		if err != nil {
			ie := &backend.InitError{Project: spec.Name, Script: name, Message: scriptMessage(out, script, err)}
			rec, _ := json.Marshal(failureRecord{Script: ie.Script, Message: ie.Message})
			if werr := writeMarker(b.marker(spec.Name, markerFailed), rec); werr != nil {
				b.log.Warn("could not record the init failure with the data", "project", spec.Name, "err", werr)
			}
			fmt.Fprintf(logf, "pgwake: init script %s failed: %s\n", name, ie.Message)
			stop()
			return ie
		}
	}
	stop()
	if err := writeMarker(b.marker(spec.Name, markerDone), []byte("done\n")); err != nil {
		return fmt.Errorf("init marker: %w", err)
	}
	fmt.Fprintf(logf, "pgwake: init scripts complete\n")
	return nil
}

// psqlPath finds psql beside the server binaries, else on PATH.
func (b *Backend) psqlPath() (string, error) {
	p := filepath.Join(b.bin, "psql")
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
		return p, nil
	}
	if p, err := exec.LookPath("psql"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("init scripts need psql, found neither in %s nor on PATH (install postgresql-client)", b.bin)
}

// waitReady waits until the child's postmaster.pid says it accepts
// connections (its status line, written by every supported Postgres), or
// it exits.
func (b *Backend) waitReady(ctx context.Context, c *child, project string) error {
	ctx, cancel := context.WithTimeout(ctx, initReadyTimeout)
	defer cancel()
	data := b.dataDir(project)
	for {
		raw, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
		if err == nil {
			lines := strings.Split(string(raw), "\n")
			if len(lines) >= 8 && strings.TrimSpace(lines[0]) == strconv.Itoa(c.pid) && strings.TrimSpace(lines[7]) == "ready" {
				c.ready.Store(true)
				return nil
			}
		}
		select {
		case <-c.done:
			if c.log != "" {
				return fmt.Errorf("server %s; its log ends: %s", c.exit, c.log)
			}
			return fmt.Errorf("server exited (%s)", c.exit)
		case <-ctx.Done():
			return fmt.Errorf("server did not accept connections: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// runScript runs one init script and returns its output.
func (b *Backend) runScript(ctx context.Context, spec backend.Spec, psql string, port int, script string) ([]byte, error) {
	env := append(b.env(),
		"PGHOST="+b.sockDir(spec.Name), "PGPORT="+strconv.Itoa(port), "PGUSER="+spec.User,
		"PGPASSWORD="+spec.Password, "PGDATABASE="+spec.Database, "PGDATA="+b.dataDir(spec.Name),
		"POSTGRES_USER="+spec.User, "POSTGRES_PASSWORD="+spec.Password, "POSTGRES_DB="+spec.Database)
	var cmd *exec.Cmd
	switch backend.InitKind(script) {
	case backend.InitSQL, backend.InitSQLGz:
		cmd = exec.CommandContext(ctx, psql, "-v", "ON_ERROR_STOP=1", "--no-psqlrc", "--no-password",
			"--host", b.sockDir(spec.Name), "--port", strconv.Itoa(port), "--username", spec.User, "--dbname", spec.Database,
			"--file", "-") // as a file: errors say where (psql:<stdin>:LINE:)
		// pgwake reads the script (psql may run as another user, who
		// cannot reach pgwake's state dir): psql says <stdin> for it.
		f, err := os.Open(script)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		cmd.Stdin = f
		if backend.InitKind(script) == backend.InitSQLGz {
			zr, err := gzip.NewReader(f)
			if err != nil {
				return nil, fmt.Errorf("read %s: %w", filepath.Base(script), err)
			}
			cmd.Stdin = &gzipCheck{r: zr}
		}
	case backend.InitShell:
		// A copy the server's user can run, in its own socket directory.
		data, err := os.ReadFile(script)
		if err != nil {
			return nil, err
		}
		fi, err := os.Stat(script)
		if err != nil {
			return nil, err
		}
		copied := filepath.Join(b.sockDir(spec.Name), "pgwake-init-"+filepath.Base(script))
		if err := os.WriteFile(copied, data, 0o700); err != nil {
			return nil, err
		}
		defer os.Remove(copied)
		if b.cred != nil {
			if err := os.Chown(copied, int(b.cred.Uid), int(b.cred.Gid)); err != nil {
				return nil, err
			}
		}
		if fi.Mode()&0o100 != 0 {
			cmd = exec.CommandContext(ctx, copied)
		} else {
			cmd = exec.CommandContext(ctx, "sh", copied)
		}
	default:
		return nil, fmt.Errorf("init script %s: not .sql, .sql.gz or .sh", filepath.Base(script))
	}
	cmd.Env = env
	cmd.Dir = b.dir(spec.Name)
	if b.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if gz, ok := cmd.Stdin.(*gzipCheck); ok && err == nil && gz.err != nil {
		err = fmt.Errorf("decompress %s: %w", filepath.Base(script), gz.err)
	}
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return out.Bytes(), err
}

// gzipCheck is a gzip stream whose error (a corrupt file) is kept: psql
// sees only an early end of input and may succeed on what it got.
type gzipCheck struct {
	r   io.Reader
	err error
}

func (g *gzipCheck) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	if err != nil && err != io.EOF {
		g.err = err
	}
	return n, err
}

// scriptMessage is what a failed script said, on one line: its last
// lines, with its path shortened to its name.
func scriptMessage(out []byte, script string, err error) string {
	var lines []string
	for l := range strings.SplitSeq(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			l = strings.ReplaceAll(l, "<stdin>", filepath.Base(script))
			l = strings.ReplaceAll(l, "pgwake-init-"+filepath.Base(script), filepath.Base(script))
			lines = append(lines, l)
		}
	}
	// psql prints the error first and the failed statement's context
	// after it: keep from the first error on.
	for i, l := range lines {
		if strings.Contains(l, "ERROR:") || strings.Contains(l, "FATAL:") {
			lines = lines[i:]
			break
		}
	}
	if len(lines) > initLogLines {
		lines = lines[:initLogLines]
	}
	msg := strings.Join(lines, " | ")
	var ee *exec.ExitError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		msg = strings.TrimSpace("interrupted (" + err.Error() + ") " + msg)
	case msg == "" && errors.As(err, &ee):
		msg = "exited with code " + strconv.Itoa(ee.ExitCode()) + " and printed nothing"
	case msg == "":
		msg = err.Error()
	}
	return msg
}

// writePending marks a data directory made with init scripts to run.
func writePending(data string) error {
	err := writeMarker(filepath.Join(data, markerPending), []byte("init scripts run at the first start\n"))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("init marker: %w", err)
	}
	return err
}
