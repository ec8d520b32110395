package main

// A workload pgwake did not create, adopted by annotation and served
// through pgwake's command line and proxy, against the test control plane
// (simulated: the node; see kube_integration_test.go).

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/pgwake/pgwake/internal/testenv"
	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

// TestIntegrationKubernetesAdoptedStatefulSet: a chart's StatefulSet,
// asleep at 0 replicas, annotated pgwake.dev/project: `pgwake ls` lists
// it as adopted, a client through pgwake wakes it (scale 0->1), it sleeps
// on idle (1->0) with its data, `rm --volumes` is refused, and `rm`
// forgets it and leaves it in the cluster.
func TestIntegrationKubernetesAdoptedStatefulSet(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	ctx := t.Context()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "orders-db"}, StringData: map[string]string{"password": "chart-secret"}}
	if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	set := kubeenv.PostgresStatefulSet(testenv.PostgresImage(t), "orders-db", 0, map[string]string{
		"pgwake.dev/project": "orders", "pgwake.dev/secret": "orders-db", "pgwake.dev/sleep-after": "3s",
	}, "orders-db")
	if _, err := env.Client.AppsV1().StatefulSets(ns).Create(ctx, set, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	replicas := func() int32 {
		s, err := env.Client.AppsV1().StatefulSets(ns).Get(ctx, "orders-db", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return ptr.Deref(s.Spec.Replicas, -1)
	}

	h := kubeHarness(t, ns).withEnv("PGWAKE_GRACE_PERIOD=0s")
	h.up(t)
	eventually(t, "ls lists the adopted StatefulSet", func() string {
		p, ok := h.project(t, "orders")
		if !ok || p.Adopted != "statefulset/orders-db" || p.State != "sleeping" {
			return fmt.Sprintf("%+v", p)
		}
		return ""
	})
	// The owner's annotations are followed while pgwake runs.
	if _, err := env.Client.AppsV1().StatefulSets(ns).Patch(ctx, "orders-db", types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"pgwake.dev/sleep-after":"2s"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new sleep-after applies", func() string {
		if p := h.mustProject(t, "orders"); p.SleepAfterMS != 2000 {
			return fmt.Sprintf("sleep_after %d ms", p.SleepAfterMS)
		}
		return ""
	})
	if out := h.ok(t, "ls"); !strings.Contains(out, "kubernetes (statefulset/orders-db)") {
		t.Errorf("ls does not say where the project comes from:\n%s", out)
	}
	if u := h.ok(t, "url", "orders"); !strings.Contains(u, ":chart-secret@") {
		t.Errorf("url %q lacks the password from the Secret the annotation names", u)
	}

	h.writeNote(t, "orders", "written through pgwake") // wakes it
	if n := replicas(); n != 1 {
		t.Fatalf("replicas after a client woke it = %d, want 1", n)
	}
	eventually(t, "it sleeps on idle", func() string {
		if p := h.mustProject(t, "orders"); p.State != "sleeping" || replicas() != 0 {
			return fmt.Sprintf("state %s, replicas %d", p.State, replicas())
		}
		return ""
	})
	h.wantNotes(t, "orders", "written through pgwake")

	if r := h.fail(t, "rm", "orders", "--volumes"); !strings.Contains(r.stderr, "never deletes") {
		t.Errorf("rm --volumes of an adopted project: %q", r.stderr)
	}
	h.ok(t, "wake", "orders")
	r := h.run(t, "rm", "orders")
	if r.code != 0 || !strings.Contains(r.stderr, "forgot project orders: statefulset/orders-db is left as it is") {
		t.Fatalf("rm: exit %d %q", r.code, r.stderr)
	}
	if _, ok := h.project(t, "orders"); ok {
		t.Error("ls still lists the project rm forgot")
	}
	got, err := env.Client.AppsV1().StatefulSets(ns).Get(ctx, "orders-db", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the StatefulSet after rm: %v", err)
	}
	if _, ok := got.Annotations["pgwake.dev/project"]; ok || ptr.Deref(got.Spec.Replicas, 0) != 1 {
		t.Errorf("after rm: annotations %v, replicas %d; want the annotation gone and it left awake", got.Annotations, ptr.Deref(got.Spec.Replicas, 0))
	}
	// Forgotten by every pgwake: the catalog no longer offers it.
	h.ok(t, "down")
	h.up(t)
	if _, ok := h.project(t, "orders"); ok {
		t.Error("a restarted pgwake adopted the forgotten StatefulSet again")
	}
}
