package dockerbackend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/volume"
	"github.com/moby/moby/client"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/pgauth"
)

// Labels of a snapshot volume (besides the project's) and of the helper
// containers that copy data.
const (
	LabelSnapshot = "dev.pgwake.snapshot"       // the snapshot's label
	LabelTaken    = "dev.pgwake.snapshot-taken" // RFC 3339, when the copy began
	LabelRole     = "dev.pgwake.role"           // "copy" on helper containers
)

var _ backend.Brancher = (*Backend)(nil)

// layout is where an image keeps its data: the volume's mount target
// and PGDATA, at or below it.
type layout struct{ target, pgdata string }

func (b *Backend) layout(ctx context.Context, image string) (layout, error) {
	img, err := b.ensureImage(ctx, image)
	if err != nil {
		return layout{}, err
	}
	var env []string
	var vols map[string]struct{}
	if cfg := img.Config; cfg != nil {
		env, vols = cfg.Env, cfg.Volumes
	}
	l := layout{target: dataMountTarget(env, vols)}
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PGDATA="); ok {
			l.pgdata = v
		}
	}
	if l.pgdata == "" {
		l.pgdata = l.target
	}
	return l, nil
}

// below is pgdata's place relative to target ("" or "/18/docker").
func (l layout) below() string { return strings.TrimPrefix(l.pgdata, l.target) }

// source says where a copy reads from and how.
type source struct {
	mounts  []mount.Mount
	netMode container.NetworkMode
	env     []string
	fill    string
}

// sourceOf checks src's server against live and returns how to read its
// data: a base backup over the server's loopback (the helper joins its
// network namespace, so no port is opened and the image's pg_hba.conf
// lines for 127.0.0.1 apply), or a copy of the stopped volume, mounted
// read-only.
func (b *Backend) sourceOf(ctx context.Context, src backend.Spec, l layout, live bool) (source, error) {
	c, err := b.inspect(ctx, src)
	if err != nil {
		return source{}, err
	}
	if c == nil {
		return source{}, fmt.Errorf("project %q: %w", src.Name, backend.ErrNotFound)
	}
	running := c.State != nil && (c.State.Running || c.State.Paused)
	if !live {
		if running {
			return source{}, fmt.Errorf("copy the files of project %q: %w", src.Name, backend.ErrNotStopped)
		}
		// Mounted by name, a missing volume would be made (unlabelled):
		// only this instance's own is read.
		vol := b.VolumeName(src.Name)
		res, err := b.cli.VolumeInspect(ctx, vol, client.VolumeInspectOptions{})
		if err != nil {
			return source{}, fmt.Errorf("volume %q of project %q: %w", vol, src.Name, err)
		}
		if !b.owns(res.Volume.Labels, src.Name) {
			return source{}, notOwned("volume", vol, res.Volume.Labels)
		}
		return source{
			mounts: []mount.Mount{{Type: mount.TypeVolume, Source: vol, Target: backend.SrcMount, ReadOnly: true}},
			fill:   backend.FillCopyStopped(backend.SrcMount + l.below()),
		}, nil
	}
	if c.State == nil || !c.State.Running || c.State.Paused {
		return source{}, fmt.Errorf("back up project %q: its server is not running", src.Name)
	}
	return source{
		netMode: container.NetworkMode("container:" + c.ID),
		env:     []string{"PGPASSWORD=" + src.Password, "PGUSER=" + src.User, "PGDATABASE=" + src.Database},
		// -X stream keeps the WAL the backup needs however busy the server
		// is; -c fast checkpoints at once rather than spread over minutes.
		fill: `pg_basebackup -h 127.0.0.1 -p 5432 -D "$S" -X stream -c fast --no-password`,
	}, nil
}

// Branch implements backend.Brancher. dst's volume is made here, labelled
// as dst's, and removed again if the copy fails. The helper gives the copy
// dst's password (the SCRAM verifier goes in its environment, which only
// those who can read the server's own, with the password in it, can read).
func (b *Backend) Branch(ctx context.Context, src, dst backend.Spec, live bool) (passwordSet bool, err error) {
	defer markUnavailable(&err)
	l, err := b.layout(ctx, src.Image)
	if err != nil {
		return false, err
	}
	s, err := b.sourceOf(ctx, src, l, live)
	if err != nil {
		return false, err
	}
	roleSQL, err := pgauth.SetPasswordSQL(dst.User, dst.Password)
	if err != nil {
		return false, err
	}
	vol := b.VolumeName(dst.Name)
	made, err := b.ensureVolume(ctx, dst, vol)
	if err != nil {
		return false, err
	}
	if !made {
		return false, fmt.Errorf("branch %q: volume %q: %w", dst.Name, vol, backend.ErrDataExists)
	}
	mounts := append(s.mounts, mount.Mount{Type: mount.TypeVolume, Source: vol, Target: l.target})
	env := append(s.env, "PGDATA="+l.pgdata, "S="+l.pgdata+"/"+backend.StagingDir, "MODE=publish", "FILL="+s.fill, "ROLE_SQL="+roleSQL)
	// Labelled as dst's, whose volume it writes: rm --volumes of dst
	// sweeps one a crash left.
	writer := dst
	writer.Image = src.Image
	if _, err := b.runHelper(ctx, writer, mounts, s.netMode, env); err != nil {
		return false, errors.Join(fmt.Errorf("branch %q from %q: %w", dst.Name, src.Name, err), b.rollbackVolume(ctx, vol))
	}
	return true, nil
}

// SnapshotVolume is the volume that keeps a project's snapshot.
func (b *Backend) SnapshotVolume(project, label string) string {
	// "." is in no project name: no two projects' snapshot names, nor a
	// project's data volume, can meet.
	return b.ContainerName(project) + ".snap." + label
}

// Snapshot implements backend.Brancher.
func (b *Backend) Snapshot(ctx context.Context, spec backend.Spec, label string, live bool) (_ backend.Snapshot, err error) {
	defer markUnavailable(&err)
	l, err := b.layout(ctx, spec.Image)
	if err != nil {
		return backend.Snapshot{}, err
	}
	s, err := b.sourceOf(ctx, spec, l, live)
	if err != nil {
		return backend.Snapshot{}, err
	}
	vol := b.SnapshotVolume(spec.Name, label)
	if _, err := b.cli.VolumeInspect(ctx, vol, client.VolumeInspectOptions{}); err == nil {
		return backend.Snapshot{}, fmt.Errorf("project %q already has a snapshot %q: %w", spec.Name, label, backend.ErrDataExists)
	} else if !cerrdefs.IsNotFound(err) {
		return backend.Snapshot{}, fmt.Errorf("inspect volume %q: %w", vol, err)
	}
	taken := time.Now().UTC().Truncate(time.Second)
	labels := b.labels(spec)
	labels[LabelSnapshot] = label
	labels[LabelTaken] = taken.Format(time.RFC3339)
	if _, err := b.cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: vol, Labels: labels}); err != nil {
		return backend.Snapshot{}, fmt.Errorf("create volume %q: %w", vol, err)
	}
	mounts := append(s.mounts, mount.Mount{Type: mount.TypeVolume, Source: vol, Target: backend.SnapMount})
	env := append(s.env, "PGDATA="+l.pgdata, "SNAP="+backend.SnapMount, "S="+backend.SnapMount+"/data.partial", "MODE=snapshot", "FILL="+s.fill)
	out, err := b.runHelper(ctx, spec, mounts, s.netMode, env)
	if err != nil {
		return backend.Snapshot{}, errors.Join(fmt.Errorf("snapshot %q of %q: %w", label, spec.Name, err), b.rollbackVolume(ctx, vol))
	}
	snap := backend.Snapshot{Label: label, Taken: taken}
	if fields := strings.Fields(out); len(fields) > 0 {
		if kb, err := strconv.ParseInt(fields[len(fields)-1], 10, 64); err == nil {
			snap.Bytes = kb * 1024
		}
	}
	return snap, nil
}

// Snapshots implements backend.Brancher. Sizes come from the engine's disk
// usage report (local volume driver only; 0 otherwise).
func (b *Backend) Snapshots(ctx context.Context, spec backend.Spec, withSizes bool) (_ []backend.Snapshot, err error) {
	defer markUnavailable(&err)
	f := b.projectFilter(spec.Name).Add("label", LabelSnapshot)
	res, err := b.cli.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	sizes := map[string]int64{}
	// The engine's disk usage report measures every volume on the host
	// (seconds on a busy one): only for a listing that shows sizes.
	if withSizes && len(res.Items) > 0 {
		for _, v := range b.diskUsage(ctx) {
			if v.UsageData != nil && v.UsageData.Size > 0 {
				sizes[v.Name] = v.UsageData.Size
			}
		}
	}
	var out []backend.Snapshot
	for _, v := range res.Items {
		if !b.owns(v.Labels, spec.Name) || v.Name != b.SnapshotVolume(spec.Name, v.Labels[LabelSnapshot]) {
			continue
		}
		taken, _ := time.Parse(time.RFC3339, v.Labels[LabelTaken])
		out = append(out, backend.Snapshot{Label: v.Labels[LabelSnapshot], Taken: taken, Bytes: sizes[v.Name]})
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Taken.Equal(out[j].Taken) {
			return out[i].Taken.Before(out[j].Taken)
		}
		return out[i].Label < out[j].Label
	})
	return out, nil
}

// diskUsage is the engine's report of every volume, nil when it cannot
// give one. The engine runs one report at a time and refuses a second
// meanwhile ("a disk usage operation is already running": another pgwake,
// a docker system df): that is worth a few more tries.
func (b *Backend) diskUsage(ctx context.Context) []volume.Volume {
	for attempt, delay := 0, 50*time.Millisecond; ; attempt, delay = attempt+1, min(2*delay, time.Second) {
		du, err := b.cli.DiskUsage(ctx, client.DiskUsageOptions{Volumes: true, Verbose: true})
		if err == nil {
			return du.Volumes.Items
		}
		if attempt == 10 {
			b.log.Debug("volume sizes unknown", "err", err)
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// snapshotVolume returns label's volume for spec, checked to be this
// instance's snapshot of the project.
func (b *Backend) snapshotVolume(ctx context.Context, spec backend.Spec, label string) (string, error) {
	vol := b.SnapshotVolume(spec.Name, label)
	res, err := b.cli.VolumeInspect(ctx, vol, client.VolumeInspectOptions{})
	switch {
	case cerrdefs.IsNotFound(err):
		return "", fmt.Errorf("project %q has no snapshot %q: %w", spec.Name, label, backend.ErrNotFound)
	case err != nil:
		return "", fmt.Errorf("inspect volume %q: %w", vol, err)
	case !b.owns(res.Volume.Labels, spec.Name) || res.Volume.Labels[LabelSnapshot] != label:
		return "", notOwned("volume", vol, res.Volume.Labels)
	}
	return vol, nil
}

// Restore implements backend.Brancher.
func (b *Backend) Restore(ctx context.Context, spec backend.Spec, label string) (err error) {
	defer markUnavailable(&err)
	snap, err := b.snapshotVolume(ctx, spec, label)
	if err != nil {
		return err
	}
	c, err := b.inspect(ctx, spec)
	if err != nil {
		return err
	}
	if c != nil && c.State != nil && (c.State.Running || c.State.Paused) {
		return fmt.Errorf("restore project %q: %w", spec.Name, backend.ErrNotStopped)
	}
	vol := b.VolumeName(spec.Name)
	if _, err := b.ensureVolume(ctx, spec, vol); err != nil {
		return err
	}
	l, err := b.layout(ctx, spec.Image)
	if err != nil {
		return err
	}
	mounts := []mount.Mount{
		{Type: mount.TypeVolume, Source: snap, Target: backend.SnapMount, ReadOnly: true},
		{Type: mount.TypeVolume, Source: vol, Target: l.target},
	}
	fill := backend.FillRestore(backend.SnapMount)
	env := []string{"PGDATA=" + l.pgdata, "S=" + l.pgdata + "/" + backend.StagingDir, "MODE=publish", "FILL=" + fill}
	if _, err := b.runHelper(ctx, spec, mounts, "", env); err != nil {
		return fmt.Errorf("restore project %q from snapshot %q: %w", spec.Name, label, err)
	}
	return nil
}

// DeleteSnapshot implements backend.Brancher.
func (b *Backend) DeleteSnapshot(ctx context.Context, spec backend.Spec, label string) (err error) {
	defer markUnavailable(&err)
	vol, err := b.snapshotVolume(ctx, spec, label)
	if err != nil {
		return err
	}
	if _, err := b.cli.VolumeRemove(ctx, vol, client.VolumeRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove volume %q: %w", vol, err)
	}
	return nil
}

// helperTimeout bounds one copy: a terabyte at disk speed.
const helperTimeout = 2 * time.Hour

// runHelper runs backend.CopyScript in a throwaway container of spec's image (its
// own binaries, so pg_basebackup matches the server's version) and
// returns what it printed. The container is labelled as the project's, so
// Remove and RemoveAll sweep one left by a crash, and as a helper, so its
// start and exit are not mistaken for the server's.
func (b *Backend) runHelper(ctx context.Context, spec backend.Spec, mounts []mount.Mount, netMode container.NetworkMode, env []string) (string, error) {
	// Not stopped when the caller gives up (a client's Ctrl-C): killed
	// while it publishes, a copy would leave the target half replaced.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), helperTimeout)
	defer cancel()
	labels := b.labels(spec)
	labels[LabelRole] = "copy"
	res, err := b.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image:      spec.Image,
			User:       "0",
			Entrypoint: []string{"sh", "-c", backend.CopyScript},
			Cmd:        []string{"pgwake-copy"}, // $0, for its messages
			Env:        env,
			Labels:     labels,
		},
		HostConfig: &container.HostConfig{Mounts: mounts, NetworkMode: netMode},
	})
	if err != nil {
		return "", fmt.Errorf("create helper container: %w", err)
	}
	id := res.ID
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = b.cli.ContainerRemove(rctx, id, client.ContainerRemoveOptions{Force: true})
	}()
	if _, err := b.cli.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil {
		return "", fmt.Errorf("start helper container: %w", err)
	}
	wait := b.cli.ContainerWait(ctx, id, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	var code int64
	select {
	case r := <-wait.Result:
		code = r.StatusCode
		if r.Error != nil && r.Error.Message != "" {
			return "", fmt.Errorf("helper container: %s", r.Error.Message)
		}
	case err := <-wait.Error:
		return "", fmt.Errorf("wait for helper container: %w", err)
	}
	var stdout, stderr bytes.Buffer
	if logs, err := b.cli.ContainerLogs(ctx, id, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true}); err == nil {
		_, _ = stdcopy.StdCopy(&stdout, &stderr, logs)
		logs.Close()
	}
	if code != 0 {
		msg := strings.TrimSpace(stderr.String())
		if lines := strings.Split(msg, "\n"); len(lines) > 5 {
			msg = strings.Join(lines[len(lines)-5:], "\n")
		}
		return "", fmt.Errorf("copy exited with code %d: %s", code, msg)
	}
	return stdout.String(), nil
}
