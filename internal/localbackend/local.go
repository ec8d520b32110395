// Package localbackend runs each project's Postgres as a server process of
// this machine's own PostgreSQL binaries, for laptops and CI runners
// without Docker. Each project has a data directory, a private socket
// directory and a log file under the backend's root; the server listens on
// 127.0.0.1 on a port of its own.
package localbackend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

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
	runs  map[string]*child      // per project: the server this Backend last started

	beforeLaunch func(port int) // tests: runs between choosing a port and starting on it
}

var (
	_ backend.Backend        = (*Backend)(nil)
	_ backend.Logger         = (*Backend)(nil)
	_ backend.Checker        = (*Backend)(nil)
	_ backend.Initializer    = (*Backend)(nil)
	_ backend.Sweeper        = (*Backend)(nil)
	_ backend.PauseSupporter = (*Backend)(nil)
	_ backend.InitChecker    = (*Backend)(nil)
)

// projectMarker is written into every project directory at its first
// Ensure: RemoveAll touches only directories that carry it (or, made
// before it existed, pgwake's layout: data/PG_VERSION beside run/).
const projectMarker = ".pgwake-project"

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
	// An absolute root: postgres resolves a relative -D against its own
	// working directory, records the result in postmaster.pid, and reads -k
	// after changing into the data directory.
	if opts.Root == "" {
		return nil, errors.New("local backend root: not set")
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, fmt.Errorf("local backend root: %w", err)
	}
	b := &Backend{bin: bin, root: root, log: log, locks: map[string]*sync.Mutex{}, runs: map[string]*child{}}
	if os.Geteuid() == 0 {
		cred, err := serverUser()
		if err != nil {
			return nil, err
		}
		b.cred = cred
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("local backend root: %w", err)
	}
	if b.cred != nil {
		// The server user must reach its own directories below root.
		if err := os.Chmod(root, 0o755); err != nil {
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
	cmd.Env = b.env()
	if b.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred}
	}
	return cmd
}

func (b *Backend) env() []string { return append(os.Environ(), "LC_ALL=C", "TZ=UTC") }

// run runs cmd and returns its combined output; an error carries the end
// of it.
func (b *Backend) run(cmd *exec.Cmd) ([]byte, error) {
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 && len(msg) > 400 {
			msg = msg[i+1:]
		}
		return out, fmt.Errorf("%s: %w: %s", filepath.Base(cmd.Path), err, msg)
	}
	return out, nil
}

// singleUser runs sql (one statement per line) in a single-user backend on
// the stopped cluster dir, as the server's account: no server start, no
// socket. exit_on_error makes a failed statement end it with a non-zero
// status (it would go on and exit 0), and the error is its FATAL line.
func (b *Backend) singleUser(ctx context.Context, dir, sql string) error {
	cmd := b.command(ctx, "postgres", "--single", "-D", dir, "-c", "exit_on_error=on", "template1")
	cmd.Stdin = strings.NewReader(sql + "\n")
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		if i := strings.Index(line, "FATAL:  "); i >= 0 {
			return fmt.Errorf("single-user postgres: %s", strings.TrimSpace(line[i:]))
		}
	}
	return fmt.Errorf("single-user postgres: %w: %s", err, bytes.TrimSpace(out))
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

// mkdirNew is mkdirOwned, reporting whether path did not exist before.
func (b *Backend) mkdirNew(path string, mode os.FileMode) (bool, error) {
	_, err := os.Lstat(path)
	created := errors.Is(err, fs.ErrNotExist)
	if err := b.mkdirOwned(path, mode); err != nil {
		if created {
			_ = os.RemoveAll(path)
		}
		return false, err
	}
	return created, nil
}

// mark writes the project marker into dir unless it is there.
func mark(dir string) error {
	path := filepath.Join(dir, projectMarker)
	if _, err := os.Lstat(path); err == nil {
		return nil
	}
	return os.WriteFile(path, []byte("a pgwake project directory: pgwake may stop its server and delete it\n"), 0o644)
}

// isProjectDir reports whether the root's entry name is a project
// directory of this backend: a directory (not a link) with the marker, or
// pgwake's layout from before the marker (data/PG_VERSION beside run/).
func (b *Backend) isProjectDir(name string) bool {
	dir := b.dir(name)
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return false
	}
	if fi, err := os.Lstat(filepath.Join(dir, projectMarker)); err == nil && fi.Mode().IsRegular() {
		return true
	}
	v, err1 := os.Lstat(filepath.Join(dir, "data", "PG_VERSION"))
	r, err2 := os.Lstat(filepath.Join(dir, "run"))
	return err1 == nil && v.Mode().IsRegular() && err2 == nil && r.IsDir()
}

// Ensure implements backend.Backend: initdb on first use with the spec's
// password (scram-sha-256), then the spec's database, created in
// single-user mode so no port is ever open before the server really runs.
// A failed Ensure removes what it made.
func (b *Backend) Ensure(ctx context.Context, spec backend.Spec) error {
	defer b.lock(spec.Name)()
	return b.ensureLocked(ctx, spec)
}

func (b *Backend) ensureLocked(ctx context.Context, spec backend.Spec) (err error) {
	dir, data := b.dir(spec.Name), b.dataDir(spec.Name)
	// A restore a crash interrupted left the old data beside: finish or
	// undo it before anything could take the missing data for new.
	if err := b.recoverSwap(spec.Name); err != nil {
		return fmt.Errorf("finish an interrupted restore of project %q: %w", spec.Name, err)
	}
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err == nil {
		// A project made before the marker existed gets one now.
		if err := mark(dir); err != nil {
			b.log.Warn("write project marker", "project", spec.Name, "err", err)
		}
		return nil
	}
	// Everything this call makes goes again when it fails, last first: a
	// half-made project is of no use to the next Ensure, and RemoveAll
	// would otherwise have to tell it from somebody else's directory.
	var made []string
	defer func() {
		if err == nil {
			return
		}
		for i := len(made) - 1; i >= 0; i-- {
			if rerr := os.RemoveAll(made[i]); rerr != nil {
				b.log.Warn("clean up after a failed create", "project", spec.Name, "path", made[i], "err", rerr)
			}
		}
	}()
	created, err := b.mkdirNew(dir, 0o700)
	if err != nil {
		return fmt.Errorf("project dir: %w", err)
	}
	if created {
		made = append(made, dir)
	}
	// In a project directory made here, removing it removes all below.
	track := func(path string) {
		if !created {
			made = append(made, path)
		}
	}
	marker := filepath.Join(dir, projectMarker)
	if _, err := os.Lstat(marker); errors.Is(err, fs.ErrNotExist) {
		track(marker)
		if err := mark(dir); err != nil {
			return fmt.Errorf("project marker: %w", err)
		}
	}
	sockMade, err := b.mkdirNew(b.sockDir(spec.Name), 0o700)
	if err != nil {
		return fmt.Errorf("socket dir: %w", err)
	}
	if sockMade {
		track(b.sockDir(spec.Name))
	}
	// initdb works in a directory of its own, renamed to data once the
	// server is complete (configured, its database made): a data directory
	// with PG_VERSION is a finished one, whatever stopped an earlier call
	// (a crash of pgwake cannot clean up). What such a call left is of no
	// use.
	tmp := filepath.Join(dir, "data.initdb")
	for _, stale := range []string{tmp, data} {
		if err := os.RemoveAll(stale); err != nil {
			return err
		}
	}
	track(tmp)
	pwfile := filepath.Join(dir, ".pwfile")
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
	if _, err := b.run(b.command(ctx, "initdb", "-D", tmp, "-U", spec.User, "--pwfile="+pwfile,
		"--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-instructions")); err != nil {
		return fmt.Errorf("initdb for project %q: %w", spec.Name, err)
	}
	conf := fmt.Sprintf("\n# pgwake\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nlog_timezone = 'UTC'\n",
		b.sockDir(spec.Name))
	f, err := os.OpenFile(filepath.Join(tmp, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
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
		if err := b.singleUser(ctx, tmp, "CREATE DATABASE "+pgx.Identifier{spec.Database}.Sanitize()); err != nil {
			return fmt.Errorf("create database %q: %w", spec.Database, err)
		}
	}
	// With PG_VERSION, atomically: the first start runs them.
	if len(spec.Init) > 0 {
		if err := writePending(tmp); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, data); err != nil {
		return fmt.Errorf("initdb for project %q: %w", spec.Name, err)
	}
	return nil
}

// pidFile is what a postmaster writes into postmaster.pid as it starts.
type pidFile struct {
	pid     int
	dataDir string // line 2
	start   string // line 3: when the postmaster started, in Unix seconds
	port    int    // line 4
	listen  string // line 6: its first TCP address, written once it holds that socket
	status  string // line 8: "starting", "ready", ...; written after its sockets
}

// listening reports whether the postmaster holds its TCP port. Postgres
// writes line 6 only after a bind succeeded; until then the port is
// anybody's (it was free when Start chose it), and something else that
// took it meanwhile would answer a connection there: a pgwake proxy's
// "project does not exist", say, taken for this server serving.
func (p pidFile) listening() bool { return p.listen != "" }

// socketOnly reports whether the postmaster has made its sockets without a
// TCP one (the server init scripts run against): it never listens.
func (p pidFile) socketOnly() bool { return p.listen == "" && p.status != "" }

// id is the run's identity (backend.Status.ID): a pid is reused, a pid
// together with the second its process started is not.
func (p pidFile) id() string { return strconv.Itoa(p.pid) + "@" + p.start }

func (p pidFile) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

var errPidFile = errors.New("malformed postmaster.pid")

// readPidFile reads data/postmaster.pid. Postgres writes its first lines
// at once when it creates the file, so a file being written reads as
// malformed, not as wrong.
func readPidFile(data string) (pidFile, error) {
	raw, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return pidFile{}, err
	}
	lines := strings.Split(string(raw), "\n")
	if len(lines) < 4 {
		return pidFile{}, errPidFile
	}
	pid, err1 := strconv.Atoi(strings.TrimSpace(lines[0]))
	start := strings.TrimSpace(lines[2])
	_, err2 := strconv.ParseInt(start, 10, 64)
	port, err3 := strconv.Atoi(strings.TrimSpace(lines[3]))
	// A single-user backend (Ensure's CREATE DATABASE) writes its pid
	// negated: it is no server.
	if err1 != nil || err2 != nil || err3 != nil || pid <= 0 || start == "" {
		return pidFile{}, errPidFile
	}
	pf := pidFile{pid: pid, dataDir: lines[1], start: start, port: port}
	if len(lines) > 5 {
		pf.listen = strings.TrimSpace(lines[5])
	}
	if len(lines) > 7 {
		pf.status = strings.TrimSpace(lines[7])
	}
	return pf, nil
}

// startedSince reports whether the postmaster started at t or later (to
// the second postgres records).
func (p pidFile) startedSince(t time.Time) bool {
	s, err := strconv.ParseInt(p.start, 10, 64)
	return err == nil && s >= t.Unix()-1
}

// pmState is what postmaster.pid says about a project's server.
type pmState int

const (
	pmNone  pmState = iota // no postmaster.pid (or one still being written)
	pmStale                // left by a server that is gone
	pmLive                 // names a live postmaster of this data directory
)

// postmaster reads the project's postmaster.pid and checks that the server
// it names runs. A server killed outside pgwake leaves the file behind,
// and its pid may since have been given to any process: the pid must be a
// postmaster (see postmasterAlive) and the file must be this data
// directory's own (not a copy of another's).
func (b *Backend) postmaster(project string) (pidFile, pmState) {
	data := b.dataDir(project)
	pf, err := readPidFile(data)
	if err != nil {
		return pidFile{}, pmNone
	}
	if !samePath(pf.dataDir, data) || !postmasterAlive(pf.pid, data) {
		return pf, pmStale
	}
	return pf, pmLive
}

// samePath reports whether a and b name the same directory.
func samePath(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// signalAlive reports whether a process pid exists: signal 0 checks
// without sending; EPERM means it exists but is not ours to signal.
func signalAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// isPostmasterCmdline reports whether a process's NUL-separated argv is a
// postmaster's for dataDir. The postmaster keeps the argv it was started
// with (its children retitle themselves "postgres: checkpointer" and so
// on): argv[0] is the postgres binary, -D the data directory. pgwake and
// pg_ctl always pass an absolute -D; a postgres without one (a container's,
// with PGDATA in its environment) or with a relative one may be anybody's
// server that was given a dead postmaster's pid, so it does not count.
func isPostmasterCmdline(raw []byte, dataDir string) bool {
	args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	switch filepath.Base(args[0]) {
	case "postgres", "postmaster":
	default:
		return false
	}
	d := ""
	for i := 1; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-D" && i+1 < len(args):
			d = args[i+1]
			i++
		case strings.HasPrefix(a, "-D") && len(a) > 2:
			d = a[2:]
		}
	}
	return filepath.IsAbs(d) && samePath(d, dataDir)
}

// exitLogLines is how many lines of its log a server's exit reason
// carries; logTailBytes bounds what is read for them.
const (
	exitLogLines = 5
	logTailBytes = 8 << 10
)

// logTail returns the last n non-empty lines of the log at path written at
// or after offset from, joined with "; ". It reads at most logTailBytes, at
// the end of the file, however large the log has grown.
func logTail(path string, from int64, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	size := fi.Size()
	if from > size { // truncated since
		from = 0
	}
	start := max(from, size-logTailBytes)
	buf := make([]byte, size-start)
	k, err := f.ReadAt(buf, start)
	if err != nil && err != io.EOF {
		return ""
	}
	buf = buf[:k]
	if start > from { // began mid-line
		i := bytes.IndexByte(buf, '\n')
		buf = buf[i+1:]
	}
	var lines []string
	for l := range strings.SplitSeq(string(buf), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

// child is a postmaster this Backend started, so this process is its
// parent: it learns when and how the server exits, which postmaster.pid
// cannot say (a server that failed at start-up removes the file on its
// way out, exactly as one that never started has none).
type child struct {
	pid     int
	started time.Time
	ready   atomic.Bool   // it wrote its postmaster.pid
	done    chan struct{} // closed when it has exited (and been reaped)
	exit    string        // why it exited, when not cleanly; set before done closes
	log     string        // with exit: the end of what it wrote in this run
}

// exitWait bounds how long Status waits for a postmaster that removed its
// postmaster.pid, as postgres does on its way out, to be gone.
const exitWait = 5 * time.Second

// pidFileTimeout bounds how long Start waits for a postmaster to write
// postmaster.pid and bind its port: it does both early, before it
// allocates shared memory or recovers.
const pidFileTimeout = time.Minute

func (c *child) wait(cmd *exec.Cmd, logf string, from int64) {
	_ = cmd.Wait() // the exit status is in ProcessState
	c.exit = describeExit(cmd.ProcessState)
	if c.exit != "" {
		c.log = logTail(logf, from, exitLogLines)
	}
	close(c.done)
}

// describeExit says how a process ended, or "" for a clean exit (a fast
// shutdown by Sleep or by hand).
func describeExit(ps *os.ProcessState) string {
	if ps == nil {
		return "lost (could not wait for it)"
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("killed by signal %d (%v)", int(ws.Signal()), ws.Signal())
	}
	if code := ps.ExitCode(); code != 0 {
		return fmt.Sprintf("exited with code %d", code)
	}
	return ""
}

// exitReason returns why the child stopped. A child that wrote its
// postmaster.pid and no longer has it is on its way out: postgres removes
// the file as it exits, so the reason is moments away and worth a bounded
// wait (a wake polling Status would otherwise see a stopped server without
// a reason). A child still starting (a concurrent Start) has none.
func (c *child) exitReason(ctx context.Context) (exit, log string) {
	select {
	case <-c.done:
		return c.exit, c.log
	default:
	}
	if !c.ready.Load() {
		return "", ""
	}
	t := time.NewTimer(exitWait)
	defer t.Stop()
	select {
	case <-c.done:
		return c.exit, c.log
	case <-ctx.Done():
	case <-t.C:
	}
	return fmt.Sprintf("postmaster (pid %d) lost its postmaster.pid and is shutting down", c.pid), ""
}

func (b *Backend) child(project string) *child {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs[project]
}

// Status implements backend.Backend. A server this Backend started and
// that died says why (its exit status and the end of its log); so does one
// that left a stale postmaster.pid behind.
func (b *Backend) Status(ctx context.Context, spec backend.Spec) (backend.Status, error) {
	if _, err := os.Stat(filepath.Join(b.dataDir(spec.Name), "PG_VERSION")); err != nil {
		return backend.Status{State: backend.StateMissing}, nil
	}
	pf, pm := b.postmaster(spec.Name)
	c := b.child(spec.Name)
	if pm == pmLive {
		if c != nil && c.pid == pf.pid {
			c.ready.Store(true) // also when the Start that launched it gave up waiting
		}
		if !pf.listening() {
			// Booting, or the socket-only server of init scripts: no
			// address is its own yet (Start returns once it is).
			return backend.Status{State: backend.StateStopped}, nil
		}
		return backend.Status{State: backend.StateRunning, Addr: pf.addr(), ID: pf.id()}, nil
	}
	st := backend.Status{State: backend.StateStopped}
	if c != nil {
		st.Exit, st.Log = c.exitReason(ctx)
	}
	if st.Exit == "" && pm == pmStale {
		st.Exit = fmt.Sprintf("killed or crashed: its postmaster.pid names pid %d, which is not this server", pf.pid)
		st.Log = logTail(b.LogFile(spec.Name), 0, exitLogLines)
	}
	return st, nil
}

// WillInitialize implements backend.Initializer: a data directory without
// PG_VERSION is initialised by the next start, and one with init scripts
// pending gets them run.
func (b *Backend) WillInitialize(_ context.Context, spec backend.Spec) bool {
	_, err := os.Stat(filepath.Join(b.dataDir(spec.Name), "PG_VERSION"))
	return err != nil || b.initPending(spec.Name)
}

// Start implements backend.Backend: it starts the postmaster and returns
// once postmaster.pid (which gives the run's ID) says it holds its port,
// without waiting for it to serve; the proxy's readiness probe does that
// waiting, at a finer grain, and so must reach this server and no other.
// A postmaster that exits before then fails Start with its reason, unless
// another socket took its port first: then it starts on a new one.
func (b *Backend) Start(ctx context.Context, spec backend.Spec) (backend.Endpoint, error) {
	defer b.lock(spec.Name)()
	_, statErr := os.Stat(filepath.Join(b.dataDir(spec.Name), "PG_VERSION"))
	first := statErr != nil // this start runs initdb
	if err := b.ensureLocked(ctx, spec); err != nil {
		return backend.Endpoint{}, err
	}
	if err := b.initFailure(spec.Name); err != nil {
		// Half-initialised data is never served. A server that runs on it
		// is the socket-only one of an init that a crash of pgwake
		// interrupted: stop it.
		if serr := b.stopLocked(ctx, spec.Name, "fast"); serr != nil {
			b.log.Warn("stop a server of half-initialised data", "project", spec.Name, "err", serr)
		}
		return backend.Endpoint{}, err
	}
	if pf, pm := b.postmaster(spec.Name); pm == pmLive {
		if pf.socketOnly() {
			// The init scripts' server of a pgwake that died before they
			// began: it never listens. The scripts run again below.
			if err := b.stopLocked(ctx, spec.Name, "fast"); err != nil {
				return backend.Endpoint{}, fmt.Errorf("start project %q: stop its socket-only server: %w", spec.Name, err)
			}
		} else {
			// Still booting, maybe: one a Start that gave up launched, or
			// one a pgwake before this process did.
			var err error
			if c := b.child(spec.Name); c != nil && c.pid == pf.pid {
				pf, err = c.waitListening(ctx, b.dataDir(spec.Name))
			} else {
				data := b.dataDir(spec.Name)
				id := pf.id()
				pf, err = waitListening(ctx, data, func(got pidFile) bool { return got.id() == id },
					func() bool { return !postmasterAlive(pf.pid, data) })
			}
			if err != nil {
				return backend.Endpoint{}, fmt.Errorf("start project %q: %w", spec.Name, err)
			}
			return backend.Endpoint{Addr: pf.addr(), ID: pf.id()}, nil
		}
	}
	for attempt := 1; ; attempt++ {
		port, err := b.port(spec.Name)
		if err != nil {
			return backend.Endpoint{}, err
		}
		if b.initPending(spec.Name) {
			first = true
			if err := b.runInitLocked(ctx, spec, port); err != nil {
				return backend.Endpoint{}, err
			}
		}
		if b.beforeLaunch != nil {
			b.beforeLaunch(port)
		}
		c, err := b.launchArgs(spec.Name, append([]string{"-p", strconv.Itoa(port), "-k", b.sockDir(spec.Name)},
			backend.SettingArgs(spec.Settings)...))
		if err != nil {
			return backend.Endpoint{}, fmt.Errorf("start project %q: %w", spec.Name, err)
		}
		pf, err := c.waitListening(ctx, b.dataDir(spec.Name))
		if err == nil {
			return backend.Endpoint{Addr: pf.addr(), ID: pf.id(), First: first}, nil
		}
		if !c.exited() {
			// Given up on (ctx, or no pid file in time): a server that
			// listens later would serve nobody, or be adopted half-seen.
			_ = syscall.Kill(c.pid, syscall.SIGQUIT) // immediate shutdown
		}
		// The port was free when chosen, and another socket can take it
		// before the postmaster binds it (the machine hands the same
		// range out for every ephemeral port). Postgres then exits (its
		// messages are in English: LC_ALL=C); a fresh port serves the
		// wake instead of failing it.
		taken := c.exited() && (strings.Contains(c.log, "could not create any TCP/IP sockets") || !portFree(port))
		if taken && attempt < portAttempts && ctx.Err() == nil {
			b.log.Info("the server's port was taken as it started; trying another", "project", spec.Name, "port", port)
			continue
		}
		return backend.Endpoint{}, fmt.Errorf("start project %q: %w (see %s)", spec.Name, err, b.LogFile(spec.Name))
	}
}

// portAttempts bounds how many ports Start tries when each is taken by
// another socket before the postmaster binds it.
const portAttempts = 3

// launchArgs starts the project's postmaster with args after -D as a child of this process, in a
// session of its own (a Ctrl-C meant for pgwake does not reach it), its
// output appended to the project's log, as pg_ctl start would. Through
// pg_ctl the postmaster's pid and exit status would be lost: a server that
// died while booting could not be told from one not yet booted.
func (b *Backend) launchArgs(project string, args []string) (*child, error) {
	logf := b.LogFile(project)
	f, err := os.OpenFile(logf, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the child has its own copy
	if b.cred != nil {
		if err := f.Chown(int(b.cred.Uid), int(b.cred.Gid)); err != nil {
			return nil, err
		}
	}
	from, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(b.bin, "postgres"), append([]string{"-D", b.dataDir(project)}, args...)...)
	cmd.Env = b.env()
	cmd.Dir = b.dir(project)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: b.cred}
	c := &child{started: time.Now(), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c.pid = cmd.Process.Pid
	b.mu.Lock()
	b.runs[project] = c
	b.mu.Unlock()
	go c.wait(cmd, logf, from)
	return c, nil
}

// waitListening waits until the child has written its postmaster.pid and
// holds its TCP port, or has exited.
func (c *child) waitListening(ctx context.Context, data string) (pidFile, error) {
	// A stale file from an earlier server whose pid the child happens to
	// have is older than the child.
	ours := func(pf pidFile) bool {
		if pf.pid != c.pid || !pf.startedSince(c.started) {
			return false
		}
		c.ready.Store(true)
		return true
	}
	pf, err := waitListening(ctx, data, ours, c.exited)
	if err == nil {
		return pf, nil
	}
	if errors.Is(err, errExited) {
		// It removed its file on the way out: its exit status and log
		// are moments away.
		t := time.NewTimer(exitWait)
		defer t.Stop()
		select {
		case <-c.done:
		case <-t.C:
		}
	}
	select {
	case <-c.done:
		if c.exit == "" {
			return pidFile{}, errors.New("server exited at once")
		}
		if c.log != "" {
			return pidFile{}, fmt.Errorf("server %s; its log ends: %s", c.exit, c.log)
		}
		return pidFile{}, fmt.Errorf("server %s", c.exit)
	default:
	}
	return pidFile{}, fmt.Errorf("server (pid %d): %w", c.pid, err)
}

// exited reports whether the child has exited.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

var errExited = errors.New("server exited")

// waitListening polls data's postmaster.pid until ours accepts it and it
// says the postmaster listens, for pidFileTimeout at most. gone, asked at
// every poll, ends the wait early with errExited; so does a postmaster
// that removed a file ours had accepted, or made its sockets without TCP.
func waitListening(ctx context.Context, data string, ours func(pidFile) bool, gone func() bool) (pidFile, error) {
	ctx, cancel := context.WithTimeout(ctx, pidFileTimeout)
	defer cancel()
	poll := time.Millisecond
	seen := false
	for {
		pf, err := readPidFile(data)
		switch {
		case err == nil && ours(pf):
			if pf.listening() {
				return pf, nil
			}
			if pf.socketOnly() {
				return pidFile{}, errors.New("it listens on its socket only")
			}
			seen = true
		case seen && errors.Is(err, fs.ErrNotExist):
			return pidFile{}, errExited // it removes the file as it exits
		}
		if gone() {
			return pidFile{}, errExited
		}
		select {
		case <-ctx.Done():
			if seen {
				return pidFile{}, fmt.Errorf("did not listen on its port: %w", ctx.Err())
			}
			return pidFile{}, fmt.Errorf("wrote no postmaster.pid: %w", ctx.Err())
		case <-time.After(poll):
		}
		poll = min(2*poll, 20*time.Millisecond)
	}
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
	return b.stopLocked(ctx, spec.Name, "fast")
}

// Kill implements backend.Killer: pg_ctl's immediate shutdown.
func (b *Backend) Kill(ctx context.Context, spec backend.Spec) error {
	defer b.lock(spec.Name)()
	return b.stopLocked(ctx, spec.Name, "immediate")
}

// stopLocked stops the project's server, if it runs, with pg_ctl's
// shutdown mode (fast or immediate).
func (b *Backend) stopLocked(ctx context.Context, project, mode string) error {
	// pg_ctl signals whatever pid postmaster.pid names: only a checked one.
	pf, pm := b.postmaster(project)
	if pm != pmLive {
		return nil
	}
	if _, err := b.run(b.command(ctx, "pg_ctl", "stop", "-D", b.dataDir(project), "-m", mode, "-w", "-t", "120")); err != nil {
		return fmt.Errorf("stop project %q: %w", project, err)
	}
	// pg_ctl returns when postmaster.pid is gone, moments before the
	// postmaster exits; a child of this process is also reaped first.
	if c := b.child(project); c != nil && c.pid == pf.pid {
		t := time.NewTimer(exitWait)
		defer t.Stop()
		select {
		case <-c.done:
		case <-ctx.Done():
		case <-t.C:
		}
	}
	return nil
}

// SupportsPause reports false: see Sleep.
func (b *Backend) SupportsPause() bool { return false }

// Remove implements backend.Backend. Without volumes the data directory is
// kept for a project created again under the same name.
func (b *Backend) Remove(ctx context.Context, spec backend.Spec, volumes bool) error {
	defer b.lock(spec.Name)()
	return b.removeLocked(ctx, spec.Name, volumes)
}

func (b *Backend) removeLocked(ctx context.Context, project string, volumes bool) error {
	if err := b.stopLocked(ctx, project, "fast"); err != nil {
		return err
	}
	if !volumes {
		return nil
	}
	b.mu.Lock()
	delete(b.runs, project)
	b.mu.Unlock()
	return os.RemoveAll(b.dir(project))
}

// RemoveAll implements backend.Sweeper. The root is this instance's, so
// every project directory in it is, whether pgwake still lists it or not
// (a create that failed before it was recorded, a crashed pgwake): each
// server is stopped (fast shutdown) and, with volumes, its directory
// deleted. Anything else in the root (files, links, directories without
// the project marker) is left alone.
func (b *Backend) RemoveAll(ctx context.Context, volumes bool) error {
	entries, err := os.ReadDir(b.root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list projects: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() { // a link to a directory is no directory here
			continue
		}
		if err := b.sweep(ctx, e.Name(), volumes); err != nil {
			errs = append(errs, fmt.Errorf("project %q: %w", e.Name(), err))
		}
	}
	return errors.Join(errs...)
}

func (b *Backend) sweep(ctx context.Context, name string, volumes bool) error {
	defer b.lock(name)()
	if !b.isProjectDir(name) {
		return nil
	}
	b.log.Info("sweep", "project", name, "volumes", volumes)
	return b.removeLocked(ctx, name, volumes)
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
