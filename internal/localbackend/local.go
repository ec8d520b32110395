// Package localbackend runs each project's Postgres as a server process of
// this machine's own PostgreSQL binaries, for laptops and CI runners
// without Docker. Each project has a data directory, a private socket
// directory and a log file under the backend's root; the server listens on
// 127.0.0.1 on a port of its own.
package localbackend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pgwake/pgwake/internal/backend"
)

// Options configures a Backend.
type Options struct {
	// BinDir holds postgres, initdb and pg_ctl; empty means FindBinDir.
	BinDir string
	// Root holds one directory per project.
	Root   string
	Logger *slog.Logger
}

// Backend implements backend.Backend with local postgres processes.
type Backend struct {
	bin  string
	root string
	log  *slog.Logger
	// cred runs the server as an unprivileged user when pgwake runs as
	// root: postgres refuses to run as root.
	cred *syscall.Credential

	mu    sync.Mutex
	locks map[string]*sync.Mutex // per project: initdb and start must not interleave
}

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Logger  = (*Backend)(nil)
)

// ErrNoBinaries is returned when no PostgreSQL server binaries are found.
var ErrNoBinaries = errors.New("no PostgreSQL server binaries found")

// FindBinDir locates a directory with postgres, initdb and pg_ctl: on PATH,
// then `pg_config --bindir`, then Debian's /usr/lib/postgresql/N/bin
// (newest N first).
func FindBinDir() (string, error) {
	var candidates []string
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(real))
		}
		candidates = append(candidates, filepath.Dir(p))
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(out)))
	}
	debian, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(debian, func(i, j int) bool { return versionOf(debian[i]) > versionOf(debian[j]) })
	candidates = append(candidates, debian...)
	for _, dir := range candidates {
		if hasBinaries(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("%w (looked on PATH, in pg_config --bindir and /usr/lib/postgresql/*/bin)", ErrNoBinaries)
}

func versionOf(bindir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(bindir)))
	return n
}

func hasBinaries(dir string) bool {
	for _, b := range []string{"postgres", "initdb", "pg_ctl"} {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
			return false
		}
	}
	return true
}

// New checks the binaries and the root directory.
func New(ctx context.Context, opts Options) (*Backend, error) {
	bin := opts.BinDir
	if bin == "" {
		var err error
		if bin, err = FindBinDir(); err != nil {
			return nil, err
		}
	} else if !hasBinaries(bin) {
		return nil, fmt.Errorf("%w in %s (it needs postgres, initdb and pg_ctl)", ErrNoBinaries, bin)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Backend{bin: bin, root: opts.Root, log: log, locks: map[string]*sync.Mutex{}}
	if os.Geteuid() == 0 {
		cred, err := serverUser()
		if err != nil {
			return nil, err
		}
		b.cred = cred
	}
	if err := os.MkdirAll(opts.Root, 0o755); err != nil {
		return nil, fmt.Errorf("local backend root: %w", err)
	}
	if b.cred != nil {
		// The server user must reach its own directories below root.
		if err := os.Chmod(opts.Root, 0o755); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// serverUser picks the account postgres runs as when pgwake is root.
func serverUser() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("running as root, and postgres refuses to: create a postgres user or run pgwake as an ordinary user")
}

// BinDir is the directory the binaries come from.
func (b *Backend) BinDir() string { return b.bin }

// Name implements backend.Backend.
func (b *Backend) Name() string { return "local" }

// Close implements backend.Backend. Servers keep running; a restarted
// pgwake adopts them.
func (b *Backend) Close() error { return nil }

func (b *Backend) lock(name string) func() {
	b.mu.Lock()
	l, ok := b.locks[name]
	if !ok {
		l = &sync.Mutex{}
		b.locks[name] = l
	}
	b.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func (b *Backend) dir(p string) string     { return filepath.Join(b.root, p) }
func (b *Backend) dataDir(p string) string { return filepath.Join(b.dir(p), "data") }
func (b *Backend) sockDir(p string) string { return filepath.Join(b.dir(p), "run") }

// LogFile is the server log of a project.
func (b *Backend) LogFile(p string) string { return filepath.Join(b.dir(p), "postgres.log") }

func (b *Backend) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(b.bin, name), args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	if b.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred}
	}
	return cmd
}

func (b *Backend) run(cmd *exec.Cmd) error {
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 && len(msg) > 400 {
			msg = msg[i+1:]
		}
		return fmt.Errorf("%s: %w: %s", filepath.Base(cmd.Path), err, msg)
	}
	return nil
}

func (b *Backend) mkdirOwned(path string, mode os.FileMode) error {
	if err := os.MkdirAll(path, mode); err != nil {
		return err
	}
	if err := os.Chmod(path, mode); err != nil {
		return err
	}
	if b.cred != nil {
		return os.Chown(path, int(b.cred.Uid), int(b.cred.Gid))
	}
	return nil
}

// Ensure implements backend.Backend: initdb on first use with the spec's
// password (scram-sha-256), then the spec's database, created in
// single-user mode so no port is ever open before the server really runs.
func (b *Backend) Ensure(ctx context.Context, spec backend.Spec) error {
	defer b.lock(spec.Name)()
	return b.ensureLocked(ctx, spec)
}

func (b *Backend) ensureLocked(ctx context.Context, spec backend.Spec) error {
	data := b.dataDir(spec.Name)
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err == nil {
		return nil
	}
	if err := b.mkdirOwned(b.dir(spec.Name), 0o700); err != nil {
		return fmt.Errorf("project dir: %w", err)
	}
	if err := b.mkdirOwned(b.sockDir(spec.Name), 0o700); err != nil {
		return fmt.Errorf("socket dir: %w", err)
	}
	// A half-made data directory from an interrupted initdb is useless.
	if err := os.RemoveAll(data); err != nil {
		return err
	}
	pwfile := filepath.Join(b.dir(spec.Name), ".pwfile")
	if err := os.WriteFile(pwfile, []byte(spec.Password+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(pwfile)
	if b.cred != nil {
		if err := os.Chown(pwfile, int(b.cred.Uid), int(b.cred.Gid)); err != nil {
			return err
		}
	}
	b.log.Info("initdb", "project", spec.Name, "data", data)
	if err := b.run(b.command(ctx, "initdb", "-D", data, "-U", spec.User, "--pwfile="+pwfile,
		"--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-instructions")); err != nil {
		return fmt.Errorf("initdb for project %q: %w", spec.Name, err)
	}
	conf := fmt.Sprintf("\n# pgwake\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nlog_timezone = 'UTC'\n",
		b.sockDir(spec.Name))
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(conf); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	// initdb makes only the postgres database; the official image also
	// makes POSTGRES_DB, and so does this.
	if spec.Database != "" && spec.Database != "postgres" {
		cmd := b.command(ctx, "postgres", "--single", "-D", data, "-j", "postgres")
		cmd.Stdin = strings.NewReader(`CREATE DATABASE "` + strings.ReplaceAll(spec.Database, `"`, `""`) + `";` + "\n")
		if err := b.run(cmd); err != nil {
			return fmt.Errorf("create database %q: %w", spec.Database, err)
		}
	}
	return nil
}

// pidFile reads postmaster.pid: the server's pid and port, when it runs.
func (b *Backend) pidFile(project string) (pid, port int, ok bool) {
	f, err := os.Open(filepath.Join(b.dataDir(project), "postmaster.pid"))
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() && len(lines) < 4 {
		lines = append(lines, sc.Text())
	}
	if len(lines) < 4 {
		return 0, 0, false
	}
	pid, err1 := strconv.Atoi(strings.TrimSpace(lines[0]))
	port, err2 := strconv.Atoi(strings.TrimSpace(lines[3]))
	if err1 != nil || err2 != nil || pid <= 0 {
		return 0, 0, false
	}
	// Signal 0 checks the process exists; EPERM means it does but is not
	// ours to signal.
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return 0, 0, false
	}
	return pid, port, true
}

// Status implements backend.Backend.
func (b *Backend) Status(ctx context.Context, spec backend.Spec) (backend.Status, error) {
	if _, err := os.Stat(filepath.Join(b.dataDir(spec.Name), "PG_VERSION")); err != nil {
		return backend.Status{State: backend.StateMissing}, nil
	}
	if _, port, ok := b.pidFile(spec.Name); ok {
		return backend.Status{State: backend.StateRunning, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}, nil
	}
	return backend.Status{State: backend.StateStopped}, nil
}

// Start implements backend.Backend: pg_ctl start without waiting; the
// proxy's readiness probe does the waiting, at a finer grain.
func (b *Backend) Start(ctx context.Context, spec backend.Spec) (backend.Endpoint, error) {
	defer b.lock(spec.Name)()
	if err := b.ensureLocked(ctx, spec); err != nil {
		return backend.Endpoint{}, err
	}
	if _, port, ok := b.pidFile(spec.Name); ok {
		return backend.Endpoint{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}, nil
	}
	port, err := b.port(spec.Name)
	if err != nil {
		return backend.Endpoint{}, err
	}
	logf := b.LogFile(spec.Name)
	if err := b.touchOwned(logf); err != nil {
		return backend.Endpoint{}, err
	}
	opts := fmt.Sprintf("-p %d -k %s", port, b.sockDir(spec.Name))
	if err := b.run(b.command(ctx, "pg_ctl", "start", "-W", "-D", b.dataDir(spec.Name), "-l", logf, "-o", opts)); err != nil {
		return backend.Endpoint{}, fmt.Errorf("start project %q: %w (see %s)", spec.Name, err, logf)
	}
	return backend.Endpoint{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}, nil
}

func (b *Backend) touchOwned(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	if b.cred != nil {
		return os.Chown(path, int(b.cred.Uid), int(b.cred.Gid))
	}
	return nil
}

// port returns the project's port: the one it used last if still free, so
// connection strings to the server itself stay stable, else a new free one.
func (b *Backend) port(project string) (int, error) {
	path := filepath.Join(b.dir(project), "port")
	if data, err := os.ReadFile(path); err == nil {
		if p, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && portFree(p) {
			return p, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	p := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	if err := os.WriteFile(path, []byte(strconv.Itoa(p)+"\n"), 0o600); err != nil {
		return 0, err
	}
	return p, nil
}

func portFree(p int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// Sleep implements backend.Backend with a fast shutdown. Local servers
// cannot be frozen safely, so pause is refused (see SupportsPause).
func (b *Backend) Sleep(ctx context.Context, spec backend.Spec, mode backend.SleepMode) error {
	if mode == backend.SleepPause {
		return errors.New("the local backend cannot pause a server; use sleep mode stop")
	}
	defer b.lock(spec.Name)()
	if _, _, ok := b.pidFile(spec.Name); !ok {
		return nil
	}
	if err := b.run(b.command(ctx, "pg_ctl", "stop", "-D", b.dataDir(spec.Name), "-m", "fast", "-w", "-t", "120")); err != nil {
		return fmt.Errorf("stop project %q: %w", spec.Name, err)
	}
	return nil
}

// SupportsPause reports false: see Sleep.
func (b *Backend) SupportsPause() bool { return false }

// Remove implements backend.Backend. Without volumes the data directory is
// kept for a project created again under the same name.
func (b *Backend) Remove(ctx context.Context, spec backend.Spec, volumes bool) error {
	if err := b.Sleep(ctx, spec, backend.SleepStop); err != nil {
		return err
	}
	if !volumes {
		return nil
	}
	defer b.lock(spec.Name)()
	return os.RemoveAll(b.dir(spec.Name))
}

// Logs implements backend.Logger by reading the server's log file.
func (b *Backend) Logs(ctx context.Context, spec backend.Spec, follow bool, tail int) (io.ReadCloser, error) {
	f, err := os.Open(b.LogFile(spec.Name))
	if errors.Is(err, os.ErrNotExist) {
		return io.NopCloser(strings.NewReader("")), nil
	}
	if err != nil {
		return nil, err
	}
	if tail > 0 {
		if err := seekTail(f, tail); err != nil {
			f.Close()
			return nil, err
		}
	}
	if !follow {
		return f, nil
	}
	pr, pw := io.Pipe()
	go func() {
		defer f.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := f.Read(buf)
			if n > 0 {
				if _, werr := pw.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err == io.EOF {
				// The log is a plain file: poll for growth.
				select {
				case <-ctx.Done():
					pw.Close()
					return
				case <-time.After(200 * time.Millisecond):
				}
				continue
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
		}
	}()
	return pr, nil
}

// seekTail positions f at the start of its last n lines.
func seekTail(f *os.File, n int) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	const chunk = 8 << 10
	lines := 0
	for off := size; off > 0; {
		start := max(off-chunk, 0)
		buf := make([]byte, off-start)
		if _, err := f.ReadAt(buf, start); err != nil {
			return err
		}
		for i := len(buf) - 1; i >= 0; i-- {
			if buf[i] == '\n' && start+int64(i) != size-1 {
				lines++
				if lines == n {
					_, err := f.Seek(start+int64(i)+1, io.SeekStart)
					return err
				}
			}
		}
		off = start
	}
	_, err = f.Seek(0, io.SeekStart)
	return err
}

// Check implements backend.Checker: the binaries are still there.
func (b *Backend) Check(context.Context) error {
	if !hasBinaries(b.bin) {
		return fmt.Errorf("%w in %s", ErrNoBinaries, b.bin)
	}
	return nil
}
