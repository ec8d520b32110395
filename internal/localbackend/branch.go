package localbackend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/pgauth"
)

var _ backend.Brancher = (*Backend)(nil)

// A project's snapshots live in its directory, so that rm --volumes takes
// them too: snapshots/LABEL/data is the copy and snapshots/LABEL/meta.json
// says when it was taken and its size. A copy is made in .partial-LABEL
// (no label starts with a dot) and renamed when complete.
func (b *Backend) snapDir(p string) string { return filepath.Join(b.dir(p), "snapshots") }
func (b *Backend) snapPath(p, label string) string {
	// filepath.Base: a label is one name, never a path out of the folder.
	return filepath.Join(b.snapDir(p), filepath.Base(filepath.Clean("/"+label)))
}

const partialPrefix = ".partial-"

// cpArgs copy a folder with its owners and modes, sharing blocks where the
// filesystem can: GNU cp's reflink, macOS's clonefile.
func cpArgs() []string {
	if runtime.GOOS == "darwin" {
		return []string{"-c", "-a"}
	}
	return []string{"-a", "--reflink=auto"}
}

type snapMeta struct {
	Taken time.Time `json:"taken"`
	Bytes int64     `json:"bytes"`
}

// fill copies src's data into dir, which must not exist: a base backup
// from its running server (live), or its stopped data directory, copied
// with cp --reflink=auto (copy-on-write on btrfs and XFS, a plain copy
// elsewhere). The files copied are the server's own to the last byte; a
// pid file a crash left is not copied.
func (b *Backend) fill(ctx context.Context, src backend.Spec, dir string, live bool) error {
	pf, pm := b.postmaster(src.Name)
	if _, err := os.Stat(filepath.Join(b.dataDir(src.Name), "PG_VERSION")); err != nil {
		return fmt.Errorf("project %q has no data: %w", src.Name, backend.ErrNotFound)
	}
	if !live {
		if pm == pmLive {
			return fmt.Errorf("copy the files of project %q: %w", src.Name, backend.ErrNotStopped)
		}
		if err := b.copyStopped(ctx, b.dataDir(src.Name), dir); err != nil {
			return err
		}
		for _, f := range []string{"postmaster.pid", "postmaster.opts"} {
			if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
		return nil
	}
	if pm != pmLive {
		return fmt.Errorf("back up project %q: its server is not running", src.Name)
	}
	// -X stream keeps the WAL the backup needs however busy the server is;
	// -c fast checkpoints at once rather than spread over minutes.
	cmd := b.command(ctx, "pg_basebackup", "-h", b.sockDir(src.Name), "-p", strconv.Itoa(pf.port),
		"-U", src.User, "-D", dir, "-X", "stream", "-c", "fast", "--no-password")
	cmd.Env = append(cmd.Env, "PGPASSWORD="+src.Password)
	if err := b.mkdirOwned(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	_, err := b.run(cmd)
	return err
}

// copyStopped copies a stopped cluster's data directory to dir (which
// must not exist), less the WAL it no longer needs: after a clean shutdown
// the segment of its last checkpoint (and the next, should the record
// cross into it); the rest of pg_wal are old segments kept for reuse, as
// large as the data itself after a bulk load. Anything else (a crashed
// server, a pg_wal elsewhere) is copied whole.
func (b *Backend) copyStopped(ctx context.Context, data, dir string) error {
	wal, ok := b.neededWAL(ctx, data)
	if !ok {
		_, err := b.run(exec.CommandContext(ctx, "cp", append(cpArgs(), data, dir)...))
		return err
	}
	entries, err := os.ReadDir(data)
	if err != nil {
		return err
	}
	if err := b.mkdirOwned(dir, 0o700); err != nil {
		return err
	}
	args := cpArgs()
	for _, e := range entries {
		if e.Name() != "pg_wal" {
			args = append(args, filepath.Join(data, e.Name()))
		}
	}
	if _, err := b.run(exec.CommandContext(ctx, "cp", append(args, dir)...)); err != nil {
		return err
	}
	if err := b.mkdirOwned(filepath.Join(dir, "pg_wal", "archive_status"), 0o700); err != nil {
		return err
	}
	if err := b.mkdirOwned(filepath.Join(dir, "pg_wal"), 0o700); err != nil {
		return err
	}
	args = cpArgs()
	for _, w := range wal {
		args = append(args, filepath.Join(data, "pg_wal", w))
	}
	_, err = b.run(exec.CommandContext(ctx, "cp", append(args, filepath.Join(dir, "pg_wal"))...))
	return err
}

// neededWAL lists the files of pg_wal a cleanly shut down cluster needs
// (see copyStopped); false when it is not one or cannot tell.
func (b *Backend) neededWAL(ctx context.Context, data string) ([]string, bool) {
	if fi, err := os.Lstat(filepath.Join(data, "pg_wal")); err != nil || !fi.IsDir() {
		return nil, false
	}
	cmd := b.command(ctx, "pg_controldata", data)
	out, err := cmd.Output()
	if err != nil {
		return nil, false
	}
	var state, redo string
	for line := range strings.SplitSeq(string(out), "\n") {
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "Database cluster state":
			state = strings.TrimSpace(v)
		case "Latest checkpoint's REDO WAL file":
			redo = strings.TrimSpace(v)
		}
	}
	if state != "shut down" || redo == "" {
		return nil, false
	}
	entries, err := os.ReadDir(filepath.Join(data, "pg_wal"))
	if err != nil {
		return nil, false
	}
	var wal []string
	found, next := false, false
	for _, e := range entries { // sorted by name: segments in order
		n := e.Name()
		switch {
		case strings.HasSuffix(n, ".history"):
			wal = append(wal, n)
		case n == redo:
			wal, found = append(wal, n), true
		case found && !next && len(n) == len(redo) && n > redo:
			wal, next = append(wal, n), true
		}
	}
	return wal, found
}

// Branch implements backend.Brancher: dst's project directory is made
// here (it must not exist) and its data renamed into place once whole,
// with dst's password set in single-user mode. A failure removes it again.
func (b *Backend) Branch(ctx context.Context, src, dst backend.Spec, live bool) (passwordSet bool, err error) {
	if src.Name == dst.Name {
		return false, fmt.Errorf("branch %q from itself", dst.Name)
	}
	roleSQL, err := pgauth.SetPasswordSQL(dst.User, dst.Password)
	if err != nil {
		return false, err
	}
	// Both locks, in name order: two branches the other way round must
	// not deadlock.
	first, second := src.Name, dst.Name
	if second < first {
		first, second = second, first
	}
	defer b.lock(first)()
	defer b.lock(second)()
	dir := b.dir(dst.Name)
	if _, err := os.Lstat(dir); err == nil {
		return false, fmt.Errorf("branch %q: %s: %w", dst.Name, dir, backend.ErrDataExists)
	}
	if _, err := b.mkdirNew(dir, 0o700); err != nil {
		return false, fmt.Errorf("project dir: %w", err)
	}
	defer func() {
		if err != nil {
			if rerr := os.RemoveAll(dir); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	if err := mark(dir); err != nil {
		return false, err
	}
	if err := b.mkdirOwned(b.sockDir(dst.Name), 0o700); err != nil {
		return false, err
	}
	staged := filepath.Join(dir, "data.copy")
	if err := b.fill(ctx, src, staged, live); err != nil {
		return false, fmt.Errorf("branch %q from %q: %w", dst.Name, src.Name, err)
	}
	// A base backup finishes its recovery here too: the branch's first
	// start has none left to do.
	if err := b.singleUser(ctx, staged, roleSQL); err != nil {
		return false, fmt.Errorf("branch %q: set its password: %w", dst.Name, err)
	}
	syscall.Sync() // the copy is on disk before it is published
	return true, os.Rename(staged, b.dataDir(dst.Name))
}

// Snapshot implements backend.Brancher.
func (b *Backend) Snapshot(ctx context.Context, spec backend.Spec, label string, live bool) (_ backend.Snapshot, err error) {
	defer b.lock(spec.Name)()
	final := b.snapPath(spec.Name, label)
	if _, err := os.Lstat(final); err == nil {
		return backend.Snapshot{}, fmt.Errorf("project %q already has a snapshot %q: %w", spec.Name, label, backend.ErrDataExists)
	}
	partial := filepath.Join(b.snapDir(spec.Name), partialPrefix+label)
	if err := os.RemoveAll(partial); err != nil {
		return backend.Snapshot{}, err
	}
	// Both levels owned by the server's account: pg_basebackup runs as it.
	for _, d := range []string{b.snapDir(spec.Name), partial} {
		if err := b.mkdirOwned(d, 0o700); err != nil {
			return backend.Snapshot{}, err
		}
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(partial)
		}
	}()
	taken := time.Now().UTC().Truncate(time.Second)
	if err := b.fill(ctx, spec, filepath.Join(partial, "data"), live); err != nil {
		return backend.Snapshot{}, fmt.Errorf("snapshot %q of %q: %w", label, spec.Name, err)
	}
	meta := snapMeta{Taken: taken, Bytes: dirSize(filepath.Join(partial, "data"))}
	data, err := json.Marshal(meta)
	if err != nil {
		return backend.Snapshot{}, err
	}
	if err := os.WriteFile(filepath.Join(partial, "meta.json"), data, 0o600); err != nil {
		return backend.Snapshot{}, err
	}
	syscall.Sync()
	if err := os.Rename(partial, final); err != nil {
		return backend.Snapshot{}, err
	}
	return backend.Snapshot{Label: label, Taken: meta.Taken, Bytes: meta.Bytes}, nil
}

// dirSize sums the sizes of the regular files below dir.
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// Snapshots implements backend.Brancher.
func (b *Backend) Snapshots(_ context.Context, spec backend.Spec, _ bool) ([]backend.Snapshot, error) {
	entries, err := os.ReadDir(b.snapDir(spec.Name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []backend.Snapshot
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		var m snapMeta
		raw, err := os.ReadFile(filepath.Join(b.snapDir(spec.Name), e.Name(), "meta.json"))
		if err != nil || json.Unmarshal(raw, &m) != nil {
			continue // not a snapshot this backend made
		}
		out = append(out, backend.Snapshot{Label: e.Name(), Taken: m.Taken, Bytes: m.Bytes})
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Taken.Equal(out[j].Taken) {
			return out[i].Taken.Before(out[j].Taken)
		}
		return out[i].Label < out[j].Label
	})
	return out, nil
}

// Restore implements backend.Brancher. The copy is staged beside the data
// directory and swapped in by two renames (data → data.old, the copy →
// data); Ensure finishes a swap a crash interrupted (see recoverSwap), so
// the project never starts without data, nor with a half-copied one.
func (b *Backend) Restore(ctx context.Context, spec backend.Spec, label string) error {
	defer b.lock(spec.Name)()
	snap := filepath.Join(b.snapPath(spec.Name, label), "data")
	if _, err := os.Stat(filepath.Join(snap, "PG_VERSION")); err != nil {
		return fmt.Errorf("project %q has no snapshot %q: %w", spec.Name, label, backend.ErrNotFound)
	}
	if _, pm := b.postmaster(spec.Name); pm == pmLive {
		return fmt.Errorf("restore project %q: %w", spec.Name, backend.ErrNotStopped)
	}
	if err := b.recoverSwap(spec.Name); err != nil {
		return err
	}
	dir := b.dir(spec.Name)
	staged := filepath.Join(dir, "data.restore")
	if err := os.RemoveAll(staged); err != nil {
		return err
	}
	if _, err := b.run(exec.CommandContext(ctx, "cp", append(cpArgs(), snap, staged)...)); err != nil {
		_ = os.RemoveAll(staged)
		return fmt.Errorf("restore project %q from snapshot %q: %w", spec.Name, label, err)
	}
	syscall.Sync()
	old := filepath.Join(dir, "data.old")
	if err := os.Rename(b.dataDir(spec.Name), old); err != nil && !errors.Is(err, fs.ErrNotExist) {
		_ = os.RemoveAll(staged)
		return err
	}
	if err := os.Rename(staged, b.dataDir(spec.Name)); err != nil {
		return errors.Join(err, b.recoverSwap(spec.Name))
	}
	return os.RemoveAll(old)
}

// recoverSwap finishes or undoes a Restore's swap that was interrupted:
// data.old is the data from before it, whole. With a whole data directory
// beside it the swap was done; without, the old data goes back.
func (b *Backend) recoverSwap(project string) error {
	dir := b.dir(project)
	old := filepath.Join(dir, "data.old")
	if _, err := os.Lstat(old); err != nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(b.dataDir(project), "PG_VERSION")); err == nil {
		return os.RemoveAll(old)
	}
	if err := os.RemoveAll(b.dataDir(project)); err != nil {
		return err
	}
	return os.Rename(old, b.dataDir(project))
}

// DeleteSnapshot implements backend.Brancher.
func (b *Backend) DeleteSnapshot(_ context.Context, spec backend.Spec, label string) error {
	defer b.lock(spec.Name)()
	path := b.snapPath(spec.Name, label)
	if _, err := os.Stat(filepath.Join(path, "meta.json")); err != nil {
		return fmt.Errorf("project %q has no snapshot %q: %w", spec.Name, label, backend.ErrNotFound)
	}
	return os.RemoveAll(path)
}
