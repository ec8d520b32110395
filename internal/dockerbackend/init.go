package dockerbackend

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/pgwake/pgwake/internal/backend"
)

// Init scripts run through the image's own /docker-entrypoint-initdb.d, as
// the official postgres image defines it: at the first start, on an empty
// PGDATA, in lexical order, .sql and .sql.gz through psql with
// ON_ERROR_STOP, .sh executed if executable and sourced otherwise. pgwake
// copies them into the container before its first start and puts a small
// sourced step script before each (it records which script runs) and one
// after the last (it records completion), all in PGDATA, so that the
// markers live and die with the data:
//
//	.pgwake-init-begun   the name of the script that runs (or ran last)
//	.pgwake-init-done    every script completed
//	.pgwake-init-failed  written by pgwake: the failed script and its error
//
// The official entrypoint runs initdb.d only while PGDATA is empty, so a
// script that fails leaves data behind that its next start would serve
// half-initialised. A start that finds "begun" without "done" refuses
// instead, with the recorded error.
const (
	initDir        = "/docker-entrypoint-initdb.d"
	markerBegun    = ".pgwake-init-begun"
	markerDone     = ".pgwake-init-done"
	markerFailed   = ".pgwake-init-failed"
	initStepSuffix = "-0-pgwake-init.sh"
	initDoneScript = "9999-pgwake-init-done.sh"
	// LabelInit marks a container created with init scripts.
	LabelInit = "dev.pgwake.init"
	// maxInitScripts keeps the step names fixed-width (lexical order is
	// numeric order, in any locale's collation).
	maxInitScripts = 9998
)

// initName is the name a script has in the container: its position first,
// so the glob the entrypoint runs sorts them as given.
func initName(i int, src string) string {
	return fmt.Sprintf("%04d-1-%s", i+1, filepath.Base(src))
}

// initArchive is a tar of the init scripts with their step scripts, to be
// extracted at / in the container.
func initArchive(scripts []string) ([]byte, error) {
	if len(scripts) > maxInitScripts {
		return nil, fmt.Errorf("%d init scripts: at most %d", len(scripts), maxInitScripts)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	add := func(name string, mode int64, data []byte) error {
		hdr := &tar.Header{Name: strings.TrimPrefix(initDir, "/") + "/" + name, Mode: mode, Size: int64(len(data)), ModTime: now, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for i, src := range scripts {
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("init script: %w", err)
		}
		fi, err := os.Stat(src)
		if err != nil {
			return nil, fmt.Errorf("init script: %w", err)
		}
		name := filepath.Base(src)
		step := fmt.Sprintf("# pgwake: records that %s runs (see pgwake's README, init scripts)\nprintf '%%s\\n' %s > \"$PGDATA/%s\"\n",
			name, shellQuote(name), markerBegun)
		if err := add(fmt.Sprintf("%04d%s", i+1, initStepSuffix), 0o644, []byte(step)); err != nil {
			return nil, err
		}
		// Executable .sh scripts are executed, others sourced: keep the bit.
		mode := int64(0o644)
		if fi.Mode()&0o100 != 0 {
			mode = 0o755
		}
		if err := add(initName(i, src), mode, data); err != nil {
			return nil, err
		}
	}
	done := fmt.Sprintf("# pgwake: records that every init script completed\nprintf 'done\\n' > \"$PGDATA/%s\"\n", markerDone)
	if err := add(initDoneScript, 0o644, []byte(done)); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// containerScript is the part of a script's path in the container that
// its own name does not have.
var containerScript = regexp.MustCompile(regexp.QuoteMeta(initDir) + `/[0-9]{4}-1-`)

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// copyInit puts spec's init scripts into a container made but not started.
func (b *Backend) copyInit(ctx context.Context, id string, spec backend.Spec) error {
	archive, err := initArchive(spec.Init)
	if err != nil {
		return err
	}
	if _, err := b.cli.CopyToContainer(ctx, id, client.CopyToContainerOptions{DestinationPath: "/", Content: bytes.NewReader(archive)}); err != nil {
		return fmt.Errorf("copy init scripts into container %q: %w", b.ContainerName(spec.Name), err)
	}
	return nil
}

// initState remembers, per container ID, what its data's markers said:
// data whose init completed (or that never had any) is checked once per
// container, not on every wake, and a failure is not read again.
type initState struct {
	mu     sync.Mutex
	ok     map[string]bool
	failed map[string]*backend.InitError
}

func (s *initState) get(id string) (ok bool, failed *backend.InitError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ok[id], s.failed[id]
}

func (s *initState) setOK(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ok == nil {
		s.ok = map[string]bool{}
	}
	s.ok[id] = true
}

func (s *initState) setFailed(id string, e *backend.InitError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed == nil {
		s.failed = map[string]*backend.InitError{}
	}
	s.failed[id] = e
}

// pgdataOf is PGDATA in a container's environment.
func pgdataOf(env []string) string {
	pgdata := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PGDATA="); ok {
			pgdata = v
		}
	}
	if pgdata == "" {
		return defaultPGDATA
	}
	return pgdata
}

// exists reports whether path exists in the container (its volumes
// included; the engine mounts them for a stopped container too).
func (b *Backend) exists(ctx context.Context, id, p string) (bool, error) {
	_, err := b.cli.ContainerStatPath(ctx, id, client.ContainerStatPathOptions{Path: p})
	switch {
	case err == nil:
		return true, nil
	case cerrdefs.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("check init markers: %w", err)
}

// checkInit returns an *backend.InitError when the data of a container that
// is not running holds an init that began and did not complete, and nil
// otherwise. The answer is kept per container: data that completed init
// (or was initialised without it) stays so.
func (b *Backend) checkInit(ctx context.Context, spec backend.Spec, id string, env []string) error {
	ok, failed := b.init.get(id)
	if ok {
		return nil
	}
	if failed != nil {
		return failed
	}
	pgdata := pgdataOf(env)
	begun, err := b.exists(ctx, id, path.Join(pgdata, markerBegun))
	if err != nil {
		return err
	}
	if !begun {
		// Initialised without init scripts (or before pgwake had them):
		// nothing will ever run on this data. Fresh data is checked again
		// at the next start, after its first.
		if v, err := b.exists(ctx, id, path.Join(pgdata, "PG_VERSION")); err == nil && v {
			b.init.setOK(id)
		}
		return nil
	}
	done, err := b.exists(ctx, id, path.Join(pgdata, markerDone))
	if err != nil {
		return err
	}
	if done {
		b.init.setOK(id)
		return nil
	}
	ie := b.initFailure(ctx, spec, id, pgdata)
	b.init.setFailed(id, ie)
	return ie
}

// checkInitOf is checkInit for a container known by its ID only.
func (b *Backend) checkInitOf(ctx context.Context, spec backend.Spec, id string) error {
	res, err := b.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		return fmt.Errorf("inspect container %q: %w", b.ContainerName(spec.Name), err)
	}
	var env []string
	if res.Container.Config != nil {
		env = res.Container.Config.Env
	}
	return b.checkInit(ctx, spec, id, env)
}

// failureRecord is what .pgwake-init-failed holds.
type failureRecord struct {
	Script  string `json:"script"`
	Message string `json:"message"`
}

// initFailure reads the recorded failure of an init that began and did not
// complete; the first time, it takes it from the container's log (the
// script that ran last and what followed) and records it with the data, so
// that it outlives the container and its log.
func (b *Backend) initFailure(ctx context.Context, spec backend.Spec, id, pgdata string) *backend.InitError {
	ie := &backend.InitError{Project: spec.Name}
	if rec, err := b.readFile(ctx, id, path.Join(pgdata, markerFailed)); err == nil {
		var fr failureRecord
		if json.Unmarshal(rec, &fr) == nil {
			ie.Script, ie.Message = fr.Script, fr.Message
			return ie
		}
	}
	if name, err := b.readFile(ctx, id, path.Join(pgdata, markerBegun)); err == nil {
		ie.Script = strings.TrimSpace(string(name))
	}
	ie.Message = b.initLog(ctx, id, ie.Script)
	if ie.Message == "" {
		ie.Message = "the start was interrupted while it ran (its output is gone)"
	}
	data, _ := json.Marshal(failureRecord{Script: ie.Script, Message: ie.Message})
	if err := b.writeFile(ctx, id, pgdata, markerFailed, data); err != nil {
		b.log.Warn("could not record the init failure with the data", "project", spec.Name, "err", err)
	}
	return ie
}

// initLogLines bounds what an init failure's message keeps of the log.
const initLogLines = 8

// initLog is what the container's log holds after the entrypoint began
// running script (the failed one), on one line: psql's error, or a
// script's own output.
func (b *Backend) initLog(ctx context.Context, id, script string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rc, err := b.cli.ContainerLogs(ctx, id, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Tail: "500"})
	if err != nil {
		return ""
	}
	defer rc.Close()
	var buf bytes.Buffer
	lw := &limitedWriter{w: &buf, n: 256 << 10}
	if _, err := stdcopy.StdCopy(lw, lw, rc); err != nil && !errors.Is(err, errLimit) {
		return ""
	}
	var lines []string
	for l := range strings.Lines(buf.String()) {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	// The entrypoint announces each script ("running .../0002-1-x.sql");
	// what follows the last announcement of the failed one is its output.
	from := -1
	for i, l := range lines {
		if script != "" && strings.Contains(l, initDir+"/") && strings.HasSuffix(l, "-1-"+script) {
			from = i + 1
		}
	}
	var out []string
	if from >= 0 {
		for _, l := range lines[from:] {
			if strings.Contains(l, initStepSuffix) || strings.Contains(l, initDoneScript) {
				continue
			}
			out = append(out, l)
		}
	} else if len(lines) > 0 {
		out = lines
	}
	out = errorLines(out)
	if len(out) > initLogLines {
		out = out[:initLogLines]
	}
	for i, l := range out {
		// psql names the file as the container has it; show the user's name.
		l = containerScript.ReplaceAllString(l, "")
		out[i] = l
		if len(l) > maxLogLine {
			out[i] = l[:maxLogLine] + "..."
		}
	}
	return strings.Join(out, " | ")
}

// serverLine is a line of the server's own log (the temporary server
// logs to the container's output too).
var serverLine = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:.]+ [A-Z]+ \[[0-9]+\] `)

// errorLines keeps what says why a script failed: psql's error and its
// context rather than the server's log of the same error, from the first
// error on (what the script did before it succeeded).
func errorLines(lines []string) []string {
	isErr := func(l string) bool { return strings.Contains(l, "ERROR:") || strings.Contains(l, "FATAL:") }
	client := false
	for _, l := range lines {
		client = client || !serverLine.MatchString(l) && isErr(l)
	}
	var out []string
	for _, l := range lines {
		if client && serverLine.MatchString(l) {
			continue
		}
		if len(out) == 0 && !isErr(l) && slices.ContainsFunc(lines, isErr) {
			continue
		}
		out = append(out, l)
	}
	return out
}

// readFile reads one small file from a container.
func (b *Backend) readFile(ctx context.Context, id, p string) ([]byte, error) {
	res, err := b.cli.CopyFromContainer(ctx, id, client.CopyFromContainerOptions{SourcePath: p})
	if err != nil {
		return nil, err
	}
	defer res.Content.Close()
	tr := tar.NewReader(res.Content)
	if _, err := tr.Next(); err != nil {
		return nil, err
	}
	return io.ReadAll(io.LimitReader(tr, 64<<10))
}

// writeFile writes one small file into dir of a container.
func (b *Backend) writeFile(ctx context.Context, id, dir, name string, data []byte) error {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: time.Now(), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	_, err := b.cli.CopyToContainer(ctx, id, client.CopyToContainerOptions{DestinationPath: dir, Content: &buf})
	return err
}

// InitFailure implements backend.InitChecker: the recorded init failure of
// the project's data, if its container is not running and its init began
// and did not complete.
func (b *Backend) InitFailure(ctx context.Context, spec backend.Spec) (err error) {
	defer markUnavailable(&err)
	c, err := b.inspect(ctx, spec)
	if err != nil || c == nil || c.Config == nil {
		return err
	}
	if c.State != nil && (c.State.Running || c.State.Paused) {
		return nil
	}
	return b.checkInit(ctx, spec, c.ID, c.Config.Env)
}
