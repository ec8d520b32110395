package k8sbackend_test

// Branches, snapshots and restores on the kubernetes backend: copy helper
// Pods on the simulated node (a Docker container of the project's image,
// with the PVCs' host-path directories bind mounted), base backups through
// real exec sessions of the API server, real Postgres servers.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/k8sbackend"
)

func TestIntegrationBranchSnapshotRestore(t *testing.T) {
	t.Parallel()
	f := newFixture(t, k8sbackend.DialPortForward)
	ctx := t.Context()
	src := spec(t, "src")
	if err := f.be.Ensure(ctx, src); err != nil {
		t.Fatal(err)
	}
	ep, err := f.be.Start(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	if got := query(t, ep.Addr, src, "create table t(i int); insert into t select generate_series(1, 100); select count(*)::text from t"); got != "100" {
		t.Fatalf("seeded %s rows", got)
	}

	// Of the running server: a base backup through exec, which it keeps
	// serving.
	live, err := f.be.Snapshot(ctx, src, "live", true)
	if err != nil {
		t.Fatalf("snapshot of the running server: %v", err)
	}
	if live.Bytes <= 0 || live.Label != "live" {
		t.Errorf("snapshot = %+v, want a size", live)
	}
	dst := spec(t, "dst")
	if _, err := f.be.Branch(ctx, src, dst, true); err != nil {
		t.Fatalf("branch of the running server: %v", err)
	}
	if got := query(t, ep.Addr, src, "insert into t select generate_series(101, 200); select count(*)::text from t"); got != "200" {
		t.Fatalf("the source has %s rows after the copies", got)
	}
	if err := f.be.Ensure(ctx, dst); err != nil {
		t.Fatal(err)
	}
	dep, err := f.be.Start(ctx, dst)
	if err != nil {
		t.Fatal(err)
	}
	// The branch's role still has the source's password: setting its own
	// is the daemon's step.
	asSrc := dst
	asSrc.Password, asSrc.Database = src.Password, src.Database
	if got := query(t, dep.Addr, asSrc, "select count(*)::text from t"); got != "100" {
		t.Errorf("the branch has %s rows, want the 100 of its point", got)
	}
	// Every pgwake of the namespace sees the branch's parent.
	branchedAt := time.Now().UTC().Truncate(time.Second)
	if err := f.be.Save(ctx, backend.Record{Spec: dst, SleepMode: backend.SleepStop, Parent: "src", BranchedAt: branchedAt}); err != nil {
		t.Fatal(err)
	}
	other := newBackend(t, f.env, f.ns, k8sbackend.DialPortForward)
	recs, err := other.Projects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range recs {
		if r.Spec.Name == "dst" {
			found = true
			if r.Parent != "src" || !r.BranchedAt.Equal(branchedAt) {
				t.Errorf("another pgwake reads parent %q at %v, want src at %v", r.Parent, r.BranchedAt, branchedAt)
			}
		}
	}
	if !found {
		t.Errorf("another pgwake does not list the branch: %+v", recs)
	}
	if _, err := f.be.Branch(ctx, src, dst, true); !errors.Is(err, backend.ErrDataExists) {
		t.Errorf("branch onto existing data: %v, want ErrDataExists", err)
	}

	// Of the stopped server: a file copy of its PVC. A running one is
	// refused, so the caller copies from the server instead.
	if _, err := f.be.Snapshot(ctx, src, "files", false); !errors.Is(err, backend.ErrNotStopped) {
		t.Errorf("file snapshot of a running server: %v, want ErrNotStopped", err)
	}
	if err := f.be.Sleep(ctx, src, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	files, err := f.be.Snapshot(ctx, src, "files", false)
	if err != nil {
		t.Fatalf("snapshot of the stopped server: %v", err)
	}
	if files.Bytes <= 0 {
		t.Errorf("file snapshot = %+v, want a size", files)
	}
	if _, err := f.be.Snapshot(ctx, src, "files", false); !errors.Is(err, backend.ErrDataExists) {
		t.Errorf("second snapshot under a label: %v, want ErrDataExists", err)
	}
	snaps, err := f.be.Snapshots(ctx, src, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 2 || snaps[0].Label != "live" || snaps[1].Label != "files" {
		t.Errorf("snapshots = %+v, want live then files", snaps)
	}

	// Restore while stopped; the server then starts on the snapshot.
	if err := f.be.Restore(ctx, src, "live"); err != nil {
		t.Fatal(err)
	}
	if ep, err = f.be.Start(ctx, src); err != nil {
		t.Fatal(err)
	}
	if got := query(t, ep.Addr, src, "select count(*)::text from t"); got != "100" {
		t.Errorf("restored to %s rows, want the live snapshot's 100", got)
	}
	if err := f.be.Restore(ctx, src, "files"); !errors.Is(err, backend.ErrNotStopped) {
		t.Errorf("restore under a running server: %v, want ErrNotStopped", err)
	}
	if err := f.be.Sleep(ctx, src, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	if err := f.be.Restore(ctx, src, "files"); err != nil {
		t.Fatal(err)
	}
	if ep, err = f.be.Start(ctx, src); err != nil {
		t.Fatal(err)
	}
	if got := query(t, ep.Addr, src, "select count(*)::text from t"); got != "200" {
		t.Errorf("restored to %s rows, want the file snapshot's 200", got)
	}
	if err := f.be.Restore(ctx, src, "nope"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("restore of a missing snapshot: %v, want ErrNotFound", err)
	}

	if err := f.be.DeleteSnapshot(ctx, src, "live"); err != nil {
		t.Fatal(err)
	}
	if snaps, _ = f.be.Snapshots(ctx, src, false); len(snaps) != 1 || snaps[0].Label != "files" {
		t.Errorf("after deleting live: %+v", snaps)
	}
	// No copy helper outlives its copy.
	pods, err := f.env.Client.CoreV1().Pods(f.ns).List(ctx, metav1.ListOptions{LabelSelector: k8sbackend.LabelCopyOf})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			t.Errorf("copy helper pod %s left behind", p.Name)
		}
	}
	// rm --volumes takes the snapshots with the data, and a copy helper
	// that a killed pgwake left (here one made as startHelper makes them).
	left := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pgwake-src-copy-left", Labels: map[string]string{
			k8sbackend.LabelManaged: "true", k8sbackend.LabelCopyOf: "src"}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
			Name: "copy", Image: src.Image, Command: []string{"sleep", "3600"}}}},
	}
	if _, err := f.env.Client.CoreV1().Pods(f.ns).Create(ctx, left, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.be.Remove(ctx, src, true); err != nil {
		t.Fatal(err)
	}
	_, err = f.env.Client.CoreV1().PersistentVolumeClaims(f.ns).Get(ctx, k8sbackend.SnapshotClaim("src", "files"), metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		waitGone(t, func() error {
			_, err := f.env.Client.CoreV1().PersistentVolumeClaims(f.ns).Get(ctx, k8sbackend.SnapshotClaim("src", "files"), metav1.GetOptions{})
			return err
		})
	}
	if p, err := f.env.Client.CoreV1().Pods(f.ns).Get(ctx, left.Name, metav1.GetOptions{}); err == nil && p.DeletionTimestamp == nil {
		t.Error("rm --volumes left the project's copy helper pod")
	}
}

// A project held for a copy (by any pgwake of the namespace: here the
// annotation a holder sets) does not start until the hold ends.
func TestIntegrationHeldProjectWaitsToStart(t *testing.T) {
	t.Parallel()
	f := newFixture(t, k8sbackend.DialPortForward)
	ctx := t.Context()
	s := spec(t, "held")
	if err := f.be.Ensure(ctx, s); err != nil {
		t.Fatal(err)
	}
	annotate := func(v string) {
		t.Helper()
		patch := `{"metadata":{"annotations":{"` + k8sbackend.AnnotationHeldUntil + `":` + v + `}}}`
		if _, err := f.env.Client.AppsV1().StatefulSets(f.ns).Patch(ctx, "pgwake-held", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	annotate(`"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano) + `"`)
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := f.be.Start(sctx, s)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "held") {
		t.Fatalf("Start of a held project: %v, want it to wait and say held", err)
	}
	set, err := f.env.Client.AppsV1().StatefulSets(f.ns).Get(ctx, "pgwake-held", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r := *set.Spec.Replicas; r != 0 {
		t.Errorf("a held project was scaled to %d", r)
	}
	type started struct {
		ep  backend.Endpoint
		err error
	}
	done := make(chan started, 1)
	go func() {
		ep, err := f.be.Start(ctx, s)
		done <- started{ep, err}
	}()
	annotate("null")
	r := <-done
	if r.err != nil {
		t.Fatalf("Start once the hold ended: %v", r.err)
	}
	query(t, r.ep.Addr, s, "select 1::text")
}
