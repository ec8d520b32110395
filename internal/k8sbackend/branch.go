package k8sbackend

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/remotecommand"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/utils/ptr"

	"github.com/pgwake/pgwake/internal/backend"
)

// Labels and annotations of snapshots, copy helpers and holds.
const (
	// LabelSnapshot is on a snapshot's PVC (besides the project's labels,
	// so `rm --volumes` removes it with the data): the snapshot's label.
	LabelSnapshot = "dev.pgwake.snapshot"
	// LabelCopyOf is on a copy helper Pod: the project it copies for. Not
	// LabelProject, which would make it one of the project's Pods.
	LabelCopyOf = "dev.pgwake.copy-of"

	AnnotationTaken = "dev.pgwake.snapshot-taken" // RFC 3339, when the copy began
	// AnnotationBytes is the snapshot's size, set once its copy is
	// complete: a snapshot PVC without it is incomplete.
	AnnotationBytes = "dev.pgwake.snapshot-bytes"
	// AnnotationHeldUntil is on a StatefulSet whose data a pgwake copies
	// from or restores into while its server is stopped: every pgwake's
	// Start waits until it is gone (or past, should its holder have died).
	AnnotationHeldUntil = "dev.pgwake.held-until"
)

var _ backend.Brancher = (*Backend)(nil)

// Timing of copies.
const (
	// holdTTL is how long a hold lasts unless renewed, which its holder
	// does every third of it: a pgwake killed during a copy blocks the
	// project's wakes this long at most.
	holdTTL = time.Minute
	// copyTimeout bounds one copy: a terabyte at disk speed.
	copyTimeout = 2 * time.Hour
	// helperStartTimeout bounds a helper Pod's wait for its volumes and
	// a node.
	helperStartTimeout = 5 * time.Minute
)

// backupScript runs in a live source's Postgres container (kubectl exec)
// and writes a base backup, as one tar with the WAL it needs, to stdout.
// -X fetch collects that WAL at the end, so a temporary replication slot,
// held by the psql session around pg_basebackup, keeps it from being
// recycled meanwhile however busy the server is; the slot goes with the
// session, also when this shell is killed. The connection is the Pod's
// loopback, which the official image's pg_hba.conf admits for
// replication; the password is the container's own env. Done, it waits
// for stdin to end: pgwake closes it once it has read the whole archive.
const backupScript = `set -eu
export PGHOST=127.0.0.1 PGPORT=5432 PGUSER="${POSTGRES_USER:-postgres}" PGPASSWORD="${POSTGRES_PASSWORD:-}" PGDATABASE=postgres
rc=/tmp/pgwake-backup.$$
rm -f "$rc"
exec 3>&1
psql -X -q -v ON_ERROR_STOP=1 >&2 <<EOF
SELECT pg_create_physical_replication_slot('pgwake_copy_$$', true, true) IS NOT NULL AS reserved \gset
\! pg_basebackup -D - -F tar -X fetch -c fast --no-password >&3; echo \$? >$rc
EOF
code=$(cat "$rc" 2>/dev/null || echo none)
rm -f "$rc"
[ "$code" = 0 ] || { echo "pg_basebackup failed (exit $code)" >&2; exit 5; }
cat >/dev/null
`

// fillFromStdin is CopyScript's FILL for a base backup arriving as a tar
// on stdin. pg_basebackup writes backup_manifest last: without it the
// stream ended early and nothing is published. The rest of stdin is read
// to its end, which pgwake makes right after the archive's.
const fillFromStdin = `tar -x -f - -C "$S" && cat >/dev/null; [ -s "$S/backup_manifest" ] || { echo "the base backup stream ended early" >&2; exit 5; }`

// copyJob is one run of backend.CopyScript in a helper Pod.
type copyJob struct {
	project string // whose copy it is (the helper's LabelCopyOf)
	image   string
	claims  map[string]string // PVC name → mount path
	ro      map[string]bool   // PVCs mounted read-only
	env     map[string]string
	source  *corev1.Pod // live: the Pod whose base backup fills the copy
}

// Branch implements backend.Brancher. dst's PVC (the name its
// StatefulSet's claim template gives) is made here, labelled as dst's and
// as large as src's at least, and deleted again if the copy fails. The copy
// keeps src's password: a helper Pod's environment is part of its object,
// readable wherever Pods are, so the caller sets dst's through the server.
func (b *Backend) Branch(ctx context.Context, src, dst backend.Spec, live bool) (bool, error) {
	if err := validName(dst.Name); err != nil {
		return false, err
	}
	job, release, err := b.sourceJob(ctx, src, live)
	if err != nil {
		return false, err
	}
	defer release()
	claim := pvcName(dst.Name)
	if _, err := b.cs.CoreV1().PersistentVolumeClaims(b.ns).Get(ctx, claim, metav1.GetOptions{}); err == nil {
		return false, fmt.Errorf("branch %q: persistentvolumeclaim %q: %w", dst.Name, claim, backend.ErrDataExists)
	} else if !apierrors.IsNotFound(err) {
		return false, b.apiErr(err, "read persistentvolumeclaim "+claim)
	}
	if err := b.createClaim(ctx, src.Name, claim, b.labels(dst.Name), nil); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return false, fmt.Errorf("branch %q: persistentvolumeclaim %q: %w", dst.Name, claim, backend.ErrDataExists)
		}
		return false, err
	}
	job.project = dst.Name
	job.claims[claim] = dataMount
	job.env["PGDATA"] = pgdata
	job.env["S"] = pgdata + "/" + backend.StagingDir
	job.env["MODE"] = "publish"
	if _, err := b.runCopy(ctx, job); err != nil {
		return false, errors.Join(fmt.Errorf("branch %q from %q: %w", dst.Name, src.Name, err), b.deleteClaim(claim))
	}
	return false, nil
}

// SnapshotClaim is the PVC that keeps a project's snapshot. "." is in no
// project name, so no two projects' snapshots, nor a project's data, can
// meet.
func SnapshotClaim(project, label string) string {
	return objectName(project) + ".snap." + label
}

// Snapshot implements backend.Brancher: a PVC of its own, in the source's
// StorageClass.
func (b *Backend) Snapshot(ctx context.Context, spec backend.Spec, label string, live bool) (backend.Snapshot, error) {
	job, release, err := b.sourceJob(ctx, spec, live)
	if err != nil {
		return backend.Snapshot{}, err
	}
	defer release()
	claim := SnapshotClaim(spec.Name, label)
	taken := time.Now().UTC().Truncate(time.Second)
	l := b.labels(spec.Name)
	l[LabelSnapshot] = label
	err = b.createClaim(ctx, spec.Name, claim, l, map[string]string{AnnotationTaken: taken.Format(time.RFC3339)})
	if apierrors.IsAlreadyExists(err) {
		return backend.Snapshot{}, fmt.Errorf("project %q already has a snapshot %q: %w", spec.Name, label, backend.ErrDataExists)
	} else if err != nil {
		return backend.Snapshot{}, err
	}
	job.claims[claim] = backend.SnapMount
	job.env["PGDATA"] = pgdata
	job.env["SNAP"] = backend.SnapMount
	job.env["S"] = backend.SnapMount + "/data.partial"
	job.env["MODE"] = "snapshot"
	out, err := b.runCopy(ctx, job)
	snap := backend.Snapshot{Label: label, Taken: taken}
	if err == nil {
		var kb int64
		if f := strings.Fields(out); len(f) > 0 {
			kb, _ = strconv.ParseInt(f[len(f)-1], 10, 64)
		}
		if kb <= 0 {
			err = fmt.Errorf("the copy printed no size: %q", out)
		} else {
			snap.Bytes = kb * 1024
			err = b.annotateClaim(ctx, claim, map[string]any{AnnotationBytes: strconv.FormatInt(snap.Bytes, 10)})
		}
	}
	if err != nil {
		return backend.Snapshot{}, errors.Join(fmt.Errorf("snapshot %q of %q: %w", label, spec.Name, err), b.deleteClaim(claim))
	}
	return snap, nil
}

// Snapshots implements backend.Brancher. A snapshot's size is measured
// when it is taken; one whose copy never completed shows 0.
func (b *Backend) Snapshots(ctx context.Context, spec backend.Spec, _ bool) ([]backend.Snapshot, error) {
	sel := labels.SelectorFromSet(b.labels(spec.Name)).String() + "," + LabelSnapshot
	list, err := b.cs.CoreV1().PersistentVolumeClaims(b.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, b.apiErr(err, "list persistentvolumeclaims")
	}
	var out []backend.Snapshot
	for _, c := range list.Items {
		label := c.Labels[LabelSnapshot]
		if c.Name != SnapshotClaim(spec.Name, label) || c.DeletionTimestamp != nil {
			continue
		}
		taken, _ := time.Parse(time.RFC3339, c.Annotations[AnnotationTaken])
		size, _ := strconv.ParseInt(c.Annotations[AnnotationBytes], 10, 64)
		out = append(out, backend.Snapshot{Label: label, Taken: taken, Bytes: size})
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Taken.Equal(out[j].Taken) {
			return out[i].Taken.Before(out[j].Taken)
		}
		return out[i].Label < out[j].Label
	})
	return out, nil
}

// snapshotClaim returns label's PVC for spec, checked to be pgwake's
// snapshot of the project and complete.
func (b *Backend) snapshotClaim(ctx context.Context, spec backend.Spec, label string) (*corev1.PersistentVolumeClaim, error) {
	name := SnapshotClaim(spec.Name, label)
	c, err := b.cs.CoreV1().PersistentVolumeClaims(b.ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("project %q has no snapshot %q: %w", spec.Name, label, backend.ErrNotFound)
	case err != nil:
		return nil, b.apiErr(err, "read persistentvolumeclaim "+name)
	case !owned(c.Labels, spec.Name) || c.Labels[LabelSnapshot] != label:
		return nil, notOwned("persistentvolumeclaim", name)
	}
	return c, nil
}

// Restore implements backend.Brancher.
func (b *Backend) Restore(ctx context.Context, spec backend.Spec, label string) error {
	snap, err := b.snapshotClaim(ctx, spec, label)
	if err != nil {
		return err
	}
	if snap.Annotations[AnnotationBytes] == "" {
		return fmt.Errorf("snapshot %q of project %q is incomplete (its copy was interrupted); delete it", label, spec.Name)
	}
	release, err := b.holdStopped(ctx, spec.Name, "restore")
	if err != nil {
		return err
	}
	defer release()
	job := copyJob{
		project: spec.Name,
		image:   spec.Image,
		claims:  map[string]string{snap.Name: backend.SnapMount, pvcName(spec.Name): dataMount},
		ro:      map[string]bool{snap.Name: true},
		env: map[string]string{
			"FILL": backend.FillRestore(backend.SnapMount), "PGDATA": pgdata,
			"S": pgdata + "/" + backend.StagingDir, "MODE": "publish",
		},
	}
	if job.image == "" {
		job.image = b.imageOf(spec.Name)
	}
	if _, err := b.runCopy(ctx, job); err != nil {
		return fmt.Errorf("restore project %q from snapshot %q: %w", spec.Name, label, err)
	}
	return nil
}

// DeleteSnapshot implements backend.Brancher.
func (b *Backend) DeleteSnapshot(ctx context.Context, spec backend.Spec, label string) error {
	c, err := b.snapshotClaim(ctx, spec, label)
	if err != nil {
		return err
	}
	err = b.cs.CoreV1().PersistentVolumeClaims(b.ns).Delete(ctx, c.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &c.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return b.apiErr(err, "delete persistentvolumeclaim "+c.Name)
	}
	return nil
}

// sourceJob checks src's server against live and returns a copy job that
// reads its data, and what ends the hold a stopped source is kept under
// while it is read: a base backup from the running server's Pod, or a
// copy of the stopped server's PVC, mounted read-only.
func (b *Backend) sourceJob(ctx context.Context, src backend.Spec, live bool) (copyJob, func(), error) {
	set, err := b.statefulSet(ctx, src.Name)
	if err != nil {
		return copyJob{}, nil, err
	}
	if set == nil {
		return copyJob{}, nil, fmt.Errorf("project %q: %w", src.Name, backend.ErrNotFound)
	}
	job := copyJob{
		image:  set.Spec.Template.Spec.Containers[0].Image,
		claims: map[string]string{},
		ro:     map[string]bool{},
		env:    map[string]string{},
	}
	if !live {
		release, err := b.holdStopped(ctx, src.Name, "copy")
		if err != nil {
			return copyJob{}, nil, err
		}
		claim := pvcName(src.Name)
		job.claims[claim] = backend.SrcMount
		job.ro[claim] = true
		job.env["FILL"] = backend.FillCopyStopped(backend.SrcMount + strings.TrimPrefix(pgdata, dataMount))
		return job, release, nil
	}
	pod := b.pod(src.Name)
	cs := (*corev1.ContainerStatus)(nil)
	if pod != nil {
		cs = postgresStatus(pod)
	}
	if pod == nil || pod.DeletionTimestamp != nil || !podReady(pod) || cs == nil || cs.State.Running == nil {
		return copyJob{}, nil, fmt.Errorf("back up project %q: its server is not running", src.Name)
	}
	job.source = pod
	job.env["FILL"] = fillFromStdin
	return job, func() {}, nil
}

// holdStopped marks project's StatefulSet held (AnnotationHeldUntil), so
// no pgwake starts its server, and checks that it is stopped: a
// StatefulSet scaled to 0 without Pods. release ends the hold, after
// checking the server stayed stopped (the StatefulSet's spec unchanged).
// A hold whose check fails is ended at once.
func (b *Backend) holdStopped(ctx context.Context, project, why string) (release func(), err error) {
	name := objectName(project)
	hold := func(c context.Context) (*appsv1.StatefulSet, error) {
		set, err := b.patchSet(c, name, map[string]any{AnnotationHeldUntil: time.Now().Add(holdTTL).UTC().Format(time.RFC3339Nano)})
		if err != nil {
			return nil, fmt.Errorf("hold project %q for its %s: %w", project, why, err)
		}
		return set, nil
	}
	set, err := hold(ctx)
	if err != nil {
		return nil, err
	}
	unhold := func() error {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, err := b.patchSet(rctx, name, map[string]any{AnnotationHeldUntil: nil})
		return err
	}
	if !owned(set.Labels, project) {
		return nil, errors.Join(notOwned("statefulset", name), unhold())
	}
	// The Pod list is read afresh: a Pod the cache has not seen yet would
	// be a server that started before the hold.
	pods, err := b.cs.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(b.labels(project)).String()})
	if err != nil {
		return nil, errors.Join(b.apiErr(err, "list pods"), unhold())
	}
	if ptr.Deref(set.Spec.Replicas, 0) != 0 || len(pods.Items) > 0 {
		return nil, errors.Join(fmt.Errorf("copy the files of project %q: %w", project, backend.ErrNotStopped), unhold())
	}
	generation := set.Generation
	stop := make(chan struct{})
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		t := time.NewTicker(holdTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if _, err := hold(rctx); err != nil {
					b.log.Warn("renewing a hold", "project", project, "err", err)
				}
				cancel()
			}
		}
	}()
	return func() {
		close(stop)
		<-renewed
		if set, err := b.cs.AppsV1().StatefulSets(b.ns).Get(context.WithoutCancel(ctx), name, metav1.GetOptions{}); err == nil && set.Generation != generation {
			// Scaled (or changed) despite the hold, by hand or by an old
			// pgwake: say so; the copy's own check (PG_VERSION, the
			// cluster state) is what kept it whole.
			b.log.Warn("the project's StatefulSet changed while it was held", "project", project, "generation", set.Generation, "was", generation)
		}
		if err := unhold(); err != nil {
			b.log.Warn("ending a hold", "project", project, "err", err)
		}
	}, nil
}

// heldUntil is when a hold on the StatefulSet ends; zero when it has none.
func heldUntil(set *appsv1.StatefulSet) time.Time {
	t, err := time.Parse(time.RFC3339Nano, set.Annotations[AnnotationHeldUntil])
	if err != nil {
		return time.Time{}
	}
	return t
}

// awaitUnheld waits while project's StatefulSet is held by a copy or a
// restore (of any pgwake of the namespace). set is the StatefulSet as last
// read; the cache's is read after each change.
func (b *Backend) awaitUnheld(ctx context.Context, project string, set *appsv1.StatefulSet) error {
	for {
		changed := b.changed.wait()
		// Read after taking changed: a hold lifted between the caller's
		// read and now is seen here, or wakes the select below; reading
		// only after the wait missed it, and slept until the hold's end
		// (CI hung so, a hold of one hour).
		if cur, err := b.sets.Get(objectName(project)); err == nil {
			set = cur
		}
		until := heldUntil(set)
		wait := time.Until(until)
		if wait <= 0 {
			return nil
		}
		b.log.Info("waiting for a copy of the project's data to end", "project", project, "until", until)
		select {
		case <-changed:
		case <-time.After(wait):
		case <-ctx.Done():
			return fmt.Errorf("project %q is held for a copy or restore of its data (until %s at the latest): %w", project, until.Format(time.RFC3339), ctx.Err())
		}
	}
}

// patchSet merges ann into the StatefulSet's annotations (nil deletes).
func (b *Backend) patchSet(ctx context.Context, name string, ann map[string]any) (*appsv1.StatefulSet, error) {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	set, err := b.cs.AppsV1().StatefulSets(b.ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return nil, b.apiErr(err, "annotate statefulset "+name)
	}
	return set, nil
}

// annotateClaim merges ann into a PVC's annotations.
func (b *Backend) annotateClaim(ctx context.Context, name string, ann map[string]any) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if _, err := b.cs.CoreV1().PersistentVolumeClaims(b.ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return b.apiErr(err, "annotate persistentvolumeclaim "+name)
	}
	return nil
}

// imageOf is the image of project's StatefulSet, "" when unknown.
func (b *Backend) imageOf(project string) string {
	set, err := b.sets.Get(objectName(project))
	if err != nil || len(set.Spec.Template.Spec.Containers) == 0 {
		return ""
	}
	return set.Spec.Template.Spec.Containers[0].Image
}

// createClaim makes a PVC like like's data PVC: its StorageClass and at
// least its size (the configured size otherwise).
func (b *Backend) createClaim(ctx context.Context, like, name string, l, ann map[string]string) error {
	size, class := b.storage, b.class
	if src, err := b.cs.CoreV1().PersistentVolumeClaims(b.ns).Get(ctx, pvcName(like), metav1.GetOptions{}); err == nil {
		if q, ok := src.Spec.Resources.Requests[corev1.ResourceStorage]; ok && q.Cmp(size) > 0 {
			size = q
		}
		if src.Spec.StorageClassName != nil {
			class = *src.Spec.StorageClassName
		}
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l, Annotations: ann},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if class != "" {
		pvc.Spec.StorageClassName = ptr.To(class)
	}
	_, err := b.cs.CoreV1().PersistentVolumeClaims(b.ns).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return b.apiErr(err, "create persistentvolumeclaim "+name)
	}
	return err
}

// deleteClaim removes a PVC a failed copy made.
func (b *Backend) deleteClaim(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := b.cs.CoreV1().PersistentVolumeClaims(b.ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return b.apiErr(err, "delete persistentvolumeclaim "+name)
	}
	return nil
}

// runCopy runs backend.CopyScript in a helper Pod of the project's image
// (its own binaries, so pg_basebackup and pg_controldata match the
// server's version) as root, with job's claims mounted, and returns what
// it printed. With job.source the script reads a base backup taken in
// that Pod, piped through pgwake: two exec sessions through the API
// server, as `kubectl exec` makes them. The helper Pod is deleted
// afterwards; its activeDeadlineSeconds ends one that a killed pgwake
// left.
func (b *Backend) runCopy(ctx context.Context, job copyJob) (string, error) {
	// Not stopped when the caller gives up (a client's Ctrl-C): killed
	// while it publishes, a copy would leave the target half replaced.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), copyTimeout)
	defer cancel()
	pod, err := b.startHelper(ctx, job)
	if pod != nil {
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := b.cs.CoreV1().Pods(b.ns).Delete(dctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			if err != nil && !apierrors.IsNotFound(err) {
				b.log.Warn("deleting a copy helper pod", "pod", pod.Name, "err", err)
			}
		}()
	}
	if err != nil {
		return "", err
	}
	script := []string{"sh", "-c", backend.CopyScript, "pgwake-copy"}
	if job.source == nil {
		var out, errOut bytes.Buffer
		if err := b.exec(ctx, pod.Name, "copy", script, nil, &out, &errOut); err != nil {
			return "", copyErr(err, &errOut)
		}
		return out.String(), nil
	}
	// The backup's tar goes from one exec's stdout to the other's stdin
	// through pgwake, which reads the archive as it passes. At its end
	// the helper's stdin is closed, which it reads to EOF, and then the
	// source's, which its script waits for: so neither session ends, and
	// the API server closes neither connection, while data sent on it is
	// unread. A close with unread data is a reset, and a reset discards
	// what the other side has not read yet (on a loaded machine, a
	// backup's last megabytes and its status). Either side failing ends
	// both: the helper then sees its stdin end without the backup's
	// manifest and publishes nothing.
	pctx, stopBoth := context.WithCancel(ctx)
	defer stopBoth()
	srcIn, srcInW := io.Pipe()
	srcOut, srcOutW := io.Pipe()
	dstIn, dstInW := io.Pipe()
	srcErr := make(chan error, 1)
	var srcStderr bytes.Buffer
	go func() {
		err := b.exec(pctx, job.source.Name, postgresContainer(job.source), []string{"sh", "-c", backupScript, "pgwake-backup"}, srcIn, srcOutW, &srcStderr)
		if err != nil {
			err = fmt.Errorf("base backup in pod %s: %w", job.source.Name, copyErr(err, &srcStderr))
			stopBoth()
		}
		srcOutW.CloseWithError(err)
		srcErr <- err
	}()
	go func() {
		err := relayArchive(dstInW, srcOut)
		dstInW.CloseWithError(err)
		srcInW.Close()
		if err != nil {
			stopBoth()
			srcOut.CloseWithError(err)
			return
		}
		// What follows the archive (its padding) is read, not left.
		_, _ = io.Copy(io.Discard, srcOut)
	}()
	var out, errOut bytes.Buffer
	err = b.exec(pctx, pod.Name, "copy", script, dstIn, &out, &errOut)
	if err != nil {
		stopBoth()
		dstIn.CloseWithError(err)
	}
	if serr := <-srcErr; serr != nil {
		return "", serr
	}
	if err != nil {
		return "", copyErr(err, &errOut)
	}
	return out.String(), nil
}

// relayArchive copies one tar archive from r to w, up to and including
// its end-of-archive blocks, and reads no further.
func relayArchive(w io.Writer, r io.Reader) error {
	tr := tar.NewReader(io.TeeReader(r, w))
	for {
		_, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err == nil {
			_, err = io.Copy(io.Discard, tr)
		}
		if err != nil {
			return fmt.Errorf("the base backup stream: %w", err)
		}
	}
}

// copyErr is an exec's error with the end of what the command printed on
// stderr.
func copyErr(err error, stderr *bytes.Buffer) error {
	msg := strings.TrimSpace(stderr.String())
	if lines := strings.Split(msg, "\n"); len(lines) > 5 {
		msg = strings.Join(lines[len(lines)-5:], "\n")
	}
	var code exec.CodeExitError
	if errors.As(err, &code) {
		return fmt.Errorf("copy exited with code %d: %s", code.Code, msg)
	}
	if msg != "" {
		return fmt.Errorf("%w: %s", err, msg)
	}
	return err
}

// startHelper creates job's helper Pod and waits until its container runs.
// The Pod is returned whenever it was created, for the caller to delete.
func (b *Backend) startHelper(ctx context.Context, job copyJob) (*corev1.Pod, error) {
	var vols []corev1.Volume
	var mounts []corev1.VolumeMount
	claims := make([]string, 0, len(job.claims))
	for c := range job.claims {
		claims = append(claims, c)
	}
	sort.Strings(claims)
	for i, c := range claims {
		v := "v" + strconv.Itoa(i)
		vols = append(vols, corev1.Volume{Name: v, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c, ReadOnly: job.ro[c]},
		}})
		mounts = append(mounts, corev1.VolumeMount{Name: v, MountPath: job.claims[c], ReadOnly: job.ro[c]})
	}
	var env []corev1.EnvVar
	for k, v := range job.env {
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	sort.Slice(env, func(i, j int) bool { return env[i].Name < env[j].Name })
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:   objectName(job.project) + "-copy-" + utilrand.String(5),
			Labels: map[string]string{LabelManaged: "true", LabelCopyOf: job.project},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			ActiveDeadlineSeconds:         ptr.To(int64(copyTimeout / time.Second)),
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name:  "copy",
				Image: job.image,
				// The copy runs in exec sessions; this only keeps the
				// container up, and ends at once on the stop signal.
				Command:         []string{"sh", "-c", "trap 'exit 0' TERM INT; sleep " + strconv.Itoa(int(copyTimeout/time.Second)) + " & wait"},
				Env:             env,
				VolumeMounts:    mounts,
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)},
			}},
			Volumes: vols,
		},
	}
	pod, err := b.cs.CoreV1().Pods(b.ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, b.apiErr(err, "create copy helper pod")
	}
	wctx, cancel := context.WithTimeout(ctx, helperStartTimeout)
	defer cancel()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", pod.Name).String()
			return b.cs.CoreV1().Pods(b.ns).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", pod.Name).String()
			return b.cs.CoreV1().Pods(b.ns).Watch(ctx, o)
		},
	}
	var last *corev1.Pod
	_, err = watchtools.UntilWithSync(wctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			return false, nil
		}
		last = p
		if ev.Type == watch.Deleted {
			return false, errors.New("the copy helper pod was deleted")
		}
		if msg := failedStart(p, job.image); msg != "" {
			return false, errors.New(msg)
		}
		switch p.Status.Phase {
		case corev1.PodFailed, corev1.PodSucceeded:
			return false, fmt.Errorf("the copy helper pod ended (%s) before the copy", p.Status.Phase)
		}
		cs := postgresStatus(p)
		return cs != nil && cs.State.Running != nil, nil
	})
	if err != nil {
		why := err.Error()
		if wctx.Err() != nil && last != nil {
			why = "not running after " + helperStartTimeout.String() + " (" + podPhase(last) + ")"
			for c := range job.claims {
				if p := b.pvcPendingNamed(ctx, c); p != "" {
					why += "; " + p
				}
			}
		}
		return pod, fmt.Errorf("copy helper pod %s: %s", pod.Name, why)
	}
	return pod, nil
}

// exec runs cmd in a container of pod through the API server (WebSocket,
// SPDY where that fails, as kubectl does), with stdin if not nil.
func (b *Backend) exec(ctx context.Context, pod, container string, cmd []string, stdin io.Reader, stdout, stderr io.Writer) error {
	req := b.cs.CoreV1().RESTClient().Post().Namespace(b.ns).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: container, Command: cmd, Stdin: stdin != nil, Stdout: true, Stderr: true,
		}, parameterCodec)
	spdy, err := remotecommand.NewSPDYExecutor(b.cfg, http.MethodPost, req.URL())
	if err != nil {
		return fmt.Errorf("exec in pod %s: %w", pod, err)
	}
	ws, err := remotecommand.NewWebSocketExecutor(b.cfg, http.MethodGet, req.URL().String())
	if err != nil {
		return fmt.Errorf("exec in pod %s: %w", pod, err)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return fmt.Errorf("exec in pod %s: %w", pod, err)
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}

// pvcPendingNamed describes the PVC when it is not bound.
func (b *Backend) pvcPendingNamed(ctx context.Context, name string) string {
	pvc, err := b.cs.CoreV1().PersistentVolumeClaims(b.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || pvc.Status.Phase == corev1.ClaimBound {
		return ""
	}
	class := "the default StorageClass"
	if pvc.Spec.StorageClassName != nil {
		class = "StorageClass " + *pvc.Spec.StorageClassName
	}
	return fmt.Sprintf("PVC %s is %s (%s)", pvc.Name, pvc.Status.Phase, class)
}
