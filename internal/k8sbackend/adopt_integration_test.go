package k8sbackend_test

// Adoption against the real control plane (see k8s_integration_test.go
// for what is simulated: the node). The StatefulSet, Deployment and
// ReplicaSet controllers are the real ones. CloudNativePG's CRD is the
// real one, from the CloudNativePG module; its operator is simulated by
// simulateCNPG below, which does what the operator's declarative
// hibernation does and nothing more.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/k8sbackend"
	"github.com/pgwake/pgwake/internal/testenv"
	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

func adoptBackend(t *testing.T, env *kubeenv.Env, ns, dial string) *k8sbackend.Backend {
	t.Helper()
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	be, err := k8sbackend.New(t.Context(), k8sbackend.Options{
		Config: env.RESTConfig, Namespace: ns, Dial: dial, Instance: "test",
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		Adopt:  true, AdoptSleepAfter: 7 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

func postgresPod(t testing.TB, l map[string]string, secret, user, db string) corev1.PodTemplateSpec {
	return kubeenv.PostgresTemplate(testenv.PostgresImage(t), l, secret, user, db)
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func passwordSecret(t *testing.T, env *kubeenv.Env, ns, name string, data map[string]string) {
	t.Helper()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: data}
	if _, err := env.Client.CoreV1().Secrets(ns).Create(t.Context(), sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func pvc(t *testing.T, env *kubeenv.Env, ns, name string) {
	t.Helper()
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("100Mi")}},
		},
	}
	if _, err := env.Client.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// record waits until the catalog lists project (or, with want false, no
// longer lists it) and returns it.
func record(t *testing.T, be *k8sbackend.Backend, project string, want bool) backend.Record {
	t.Helper()
	return waitRecord(t, be, project, func(r *backend.Record) bool { return (r != nil) == want })
}

// waitRecord waits until ok holds for the catalog's record of project
// (nil: none) and returns it. The backend's events say when to look again.
func waitRecord(t *testing.T, be *k8sbackend.Backend, project string, ok func(*backend.Record) bool) backend.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	events := be.Watch(ctx)
	for {
		recs, err := be.Projects(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var found *backend.Record
		for i := range recs {
			if recs[i].Spec.Name == project {
				found = &recs[i]
			}
		}
		if ok(found) {
			if found == nil {
				return backend.Record{}
			}
			return *found
		}
		select {
		case <-events:
		case <-time.After(time.Second): // a change to a Secret sends none
		case <-ctx.Done():
			t.Fatalf("catalog record of %q after 30s: %+v (all: %+v)", project, found, recs)
		}
	}
}

func hasRecord(recs []backend.Record, project string) bool {
	for _, r := range recs {
		if r.Spec.Name == project {
			return true
		}
	}
	return false
}

func replicas(t *testing.T, env *kubeenv.Env, ns, kind, name string) int32 {
	t.Helper()
	get := env.Client.AppsV1().StatefulSets(ns).GetScale
	if kind == "deployment" {
		get = env.Client.AppsV1().Deployments(ns).GetScale
	}
	sc, err := get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("scale of %s %s: %v", kind, name, err)
	}
	return sc.Spec.Replicas
}

func podsOf(t *testing.T, env *kubeenv.Env, ns, selector string) int {
	t.Helper()
	ps, err := env.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	return len(ps.Items)
}

// TestIntegrationAdoptStatefulSet: a StatefulSet from a chart, annotated,
// is a project: listed with the password from its Secret, slept and woken
// through its scale subresource with its data, pinned on the object, and
// `rm` only forgets it, whatever `down --volumes` does after.
func TestIntegrationAdoptStatefulSet(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	ctx := t.Context()
	passwordSecret(t, env, ns, "legacy-creds", map[string]string{"password": "chart-pw"})
	set := kubeenv.PostgresStatefulSet(testenv.PostgresImage(t), "legacy", 1, map[string]string{
		k8sbackend.AnnotationAdopt: "legacy", k8sbackend.AnnotationAdoptSecret: "legacy-creds",
		k8sbackend.AnnotationAdoptSleepAfter: "90s",
	}, "legacy-creds")
	if _, err := env.Client.AppsV1().StatefulSets(ns).Create(ctx, set, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	be := adoptBackend(t, env, ns, k8sbackend.DialPortForward)

	rec := record(t, be, "legacy", true)
	s := rec.Spec
	if rec.Adopted != "statefulset/legacy" || s.Password != "chart-pw" || s.User != "postgres" || s.Database != "postgres" ||
		rec.SleepAfter != 90*time.Second || !rec.Saved {
		t.Fatalf("record = %+v; want statefulset/legacy, chart-pw, postgres/postgres, 90s", rec)
	}
	if be.WillInitialize(ctx, s) {
		t.Error("WillInitialize = true for an adopted server")
	}
	// Awake as found: Start waits for its Pod and does not scale it.
	ep, err := be.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	query(t, ep.Addr, s, "create table kept(v text); insert into kept values ('before sleep'); select 'ok'")
	if st, err := be.Status(ctx, s); err != nil || st.State != backend.StateRunning || st.ID != ep.ID || st.Addr != ep.Addr {
		t.Fatalf("Status = %+v, %v; want running as %+v", st, err, ep)
	}

	if err := be.Sleep(ctx, s, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	if n := replicas(t, env, ns, "statefulset", "legacy"); n != 0 {
		t.Fatalf("replicas after Sleep = %d, want 0", n)
	}
	if n := podsOf(t, env, ns, "app=legacy"); n != 0 {
		t.Fatalf("%d pods after Sleep", n)
	}
	if st, _ := be.Status(ctx, s); st.State != backend.StateStopped {
		t.Fatalf("Status after Sleep = %+v", st)
	}
	ep2, err := be.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if ep2.ID == ep.ID {
		t.Error("a new Pod has the run ID of the old one")
	}
	if got := query(t, ep2.Addr, s, "select v from kept"); got != "before sleep" {
		t.Errorf("after a wake: %q, want the row written before the sleep", got)
	}
	if n := replicas(t, env, ns, "statefulset", "legacy"); n != 1 {
		t.Fatalf("replicas after Start = %d, want 1", n)
	}

	// Pin is stored on the object, where every pgwake reads it.
	if err := be.Save(ctx, backend.Record{Spec: s, Pinned: true}); err != nil {
		t.Fatal(err)
	}
	got, err := env.Client.AppsV1().StatefulSets(ns).Get(ctx, "legacy", metav1.GetOptions{})
	if err != nil || got.Annotations[k8sbackend.AnnotationPinned] != "true" {
		t.Fatalf("annotations after pin: %v, %v", got.Annotations, err)
	}
	waitRecord(t, be, "legacy", func(r *backend.Record) bool { return r != nil && r.Pinned })

	// pgwake's own sweep never touches it.
	if err := be.RemoveAll(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := be.Remove(ctx, s, true); err == nil || !strings.Contains(err.Error(), "never deletes") {
		t.Fatalf("Remove with volumes = %v, want a refusal", err)
	}
	if err := be.Remove(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	record(t, be, "legacy", false)
	got, err = env.Client.AppsV1().StatefulSets(ns).Get(ctx, "legacy", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the StatefulSet after rm: %v", err)
	}
	if _, ok := got.Annotations[k8sbackend.AnnotationAdopt]; ok || got.Annotations[k8sbackend.AnnotationPinned] != "" ||
		got.Annotations[k8sbackend.AnnotationAdoptSecret] != "legacy-creds" || ptr.Deref(got.Spec.Replicas, 0) != 1 {
		t.Errorf("after rm: annotations %v replicas %d; want only pgwake's annotations gone, still awake", got.Annotations, ptr.Deref(got.Spec.Replicas, 0))
	}
	if _, err := env.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data-legacy-0", metav1.GetOptions{}); err != nil {
		t.Errorf("its PVC after rm and RemoveAll(volumes): %v", err)
	}
	if _, err := env.Client.CoreV1().Secrets(ns).Get(ctx, "legacy-creds", metav1.GetOptions{}); err != nil {
		t.Errorf("its Secret after rm and RemoveAll(volumes): %v", err)
	}
	// The spec still says adopted: nothing is created in its name.
	if _, err := be.Status(ctx, s); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("Status after rm = %v; want not found", err)
	}
	if _, err := be.Start(ctx, s); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("Start after rm = %v; want not found, never a new server", err)
	}
	if _, err := env.Client.AppsV1().StatefulSets(ns).Get(ctx, "pgwake-legacy", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pgwake created its own server for a forgotten adopted project: %v", err)
	}
}

// TestIntegrationAdoptDeployment: a Deployment asleep at 0 replicas, with
// no Secret (pass-through auth: the client brings the password), woken
// over the Pod IP; what cannot be adopted safely is not.
func TestIntegrationAdoptDeployment(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	ctx := t.Context()
	passwordSecret(t, env, ns, "app-db", map[string]string{"password": "only-the-client-knows"})
	pvc(t, env, ns, "app-db-data")
	l := map[string]string{"app": "app-db"}
	tmpl := postgresPod(t, l, "app-db", "", "")
	tmpl.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "app-db-data"}}}}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "app-db", Annotations: map[string]string{k8sbackend.AnnotationAdopt: "appdb"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](0),
			Selector: &metav1.LabelSelector{MatchLabels: l},
			Template: tmpl,
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
		},
	}
	if _, err := env.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Another Deployment whose name starts with this one's and whose Pod
	// its selector matches: never taken for the adopted server.
	shadow := dep.DeepCopy()
	shadow.Name, shadow.Annotations = "app-db-shadow", nil
	shadow.Spec.Replicas = ptr.To[int32](1)
	shadowLabels := map[string]string{"app": "app-db", "role": "shadow"}
	shadow.Spec.Selector = &metav1.LabelSelector{MatchLabels: shadowLabels}
	shadow.Spec.Template = postgresPod(t, shadowLabels, "app-db", "", "")
	shadow.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	if _, err := env.Client.AppsV1().Deployments(ns).Create(ctx, shadow, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	be := adoptBackend(t, env, ns, k8sbackend.DialPodIP)
	waitGone(t, func() error { // until the shadow's Pod is Ready
		ps, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "role=shadow"})
		if err != nil || len(ps.Items) == 0 || ps.Items[0].Status.PodIP == "" || !ready(&ps.Items[0]) {
			return err
		}
		return apierrors.NewNotFound(corev1.Resource("pods"), "ready")
	})
	rec := record(t, be, "appdb", true)
	s := rec.Spec
	if rec.Adopted != "deployment/app-db" || s.Password != "" || rec.SleepAfter != 7*time.Minute {
		t.Fatalf("record = %+v; want deployment/app-db, no password (pass-through), the default sleep_after", rec)
	}
	if st, err := be.Status(ctx, s); err != nil || st.State != backend.StateStopped {
		t.Fatalf("Status at 0 replicas = %+v, %v", st, err)
	}
	ep, err := be.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if n := replicas(t, env, ns, "deployment", "app-db"); n != 1 {
		t.Fatalf("replicas after Start = %d", n)
	}
	client := s
	client.Password = "only-the-client-knows"
	query(t, ep.Addr, client, "create table t(v int); insert into t values (42); select 'ok'")
	if err := be.Sleep(ctx, s, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	if n := podsOf(t, env, ns, "app=app-db,!role"); n != 0 {
		t.Fatalf("%d pods after Sleep", n)
	}
	ep, err = be.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if got := query(t, ep.Addr, client, "select v::text from t"); got != "42" {
		t.Errorf("after a wake: %q", got)
	}
	if err := be.Sleep(ctx, s, backend.SleepStop); err != nil {
		t.Fatal(err)
	}

	// Two objects claiming one project: neither is served.
	twin := dep.DeepCopy()
	twin.Name = "app-db-twin"
	twin.Spec.Selector.MatchLabels = map[string]string{"app": "twin"}
	twin.Spec.Template.Labels = map[string]string{"app": "twin"}
	if _, err := env.Client.AppsV1().Deployments(ns).Create(ctx, twin, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	record(t, be, "appdb", false)
	if _, err := be.Start(ctx, s); err == nil || !strings.Contains(err.Error(), "deployment/app-db, deployment/app-db-twin") {
		t.Fatalf("Start of a project two objects claim = %v, want an error naming both", err)
	}
	if n := replicas(t, env, ns, "deployment", "app-db"); n != 0 {
		t.Errorf("a claimed-twice project was scaled to %d", n)
	}
	// A replicated workload is not slept: its replicas would go.
	twin.Annotations[k8sbackend.AnnotationAdopt] = "replicated"
	twin.Spec.Replicas = ptr.To[int32](3)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := env.Client.AppsV1().Deployments(ns).Get(ctx, twin.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Annotations, cur.Spec.Replicas = twin.Annotations, twin.Spec.Replicas
		_, err = env.Client.AppsV1().Deployments(ns).Update(ctx, cur, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	record(t, be, "appdb", true)
	if recs, _ := be.Projects(ctx); hasRecord(recs, "replicated") {
		t.Error("a Deployment of 3 replicas was adopted")
	}
	if _, err := be.Start(ctx, backend.Spec{Name: "replicated"}); err == nil || !strings.Contains(err.Error(), "3 replicas") {
		t.Errorf("Start of a 3-replica workload = %v, want a refusal", err)
	}
	// pgwake's own project of a name wins over an annotated object.
	own := spec(t, "mine")
	if err := be.Ensure(ctx, own); err != nil {
		t.Fatal(err)
	}
	if err := be.Save(ctx, backend.Record{Spec: own, SleepMode: backend.SleepStop}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.AppsV1().Deployments(ns).Patch(ctx, "app-db", types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"pgwake.dev/project":"mine"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := record(t, be, "mine", true); r.Adopted != "" {
		t.Errorf("project mine is %q, want pgwake's own", r.Adopted)
	}
	if st, err := be.Status(ctx, own); err != nil || st.State != backend.StateStopped {
		t.Errorf("Status of pgwake's own project = %+v, %v", st, err)
	}
}

// The CloudNativePG version whose Cluster CRD the test installs.
const cnpgModule = "github.com/cloudnative-pg/cloudnative-pg@v1.27.1"

var (
	cnpgOnce sync.Once
	cnpgErr  error
)

var clusterGVR = schema.GroupVersionResource{Group: "postgresql.cnpg.io", Version: "v1", Resource: "clusters"}

// installCNPGCRD installs the Cluster CRD from the CloudNativePG module
// (fetched from the Go module proxy) into the test API server, once.
func installCNPGCRD(t *testing.T, env *kubeenv.Env) {
	t.Helper()
	cnpgOnce.Do(func() { cnpgErr = installCRD(t.Context(), env) })
	if cnpgErr != nil {
		t.Fatal(cnpgErr)
	}
}

func installCRD(ctx context.Context, env *kubeenv.Env) error {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", cnpgModule)
	cmd.Dir = os.TempDir() // outside this module: its go.mod is not touched
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go mod download %s: %v", cnpgModule, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(mod.Dir, "config", "crd", "bases", "postgresql.cnpg.io_clusters.yaml"))
	if err != nil {
		return err
	}
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(env.RESTConfig)
	if err != nil {
		return err
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if _, err := crds.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the Cluster CRD: %w", err)
	}
	// Established, then in discovery (what pgwake looks at).
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		res, err := env.Client.Discovery().ServerResourcesForGroupVersion("postgresql.cnpg.io/v1")
		if err == nil {
			for _, r := range res.APIResources {
				if r.Name == "clusters" {
					return nil
				}
			}
		}
		time.Sleep(100 * time.Millisecond) // discovery has nothing to watch
	}
	return errors.New("the Cluster CRD is not served a minute after it was created")
}

// simulateCNPG stands in for CloudNativePG's operator, for one Cluster and
// only for what pgwake relies on (SIMULATED): with cnpg.io/hibernation on
// it deletes the instance Pods and then sets the cnpg.io/hibernation
// condition True (reason Hibernated), as the operator's hibernation
// reconciler does; otherwise it removes the condition and runs instance
// NAME-1 as primary (labels cnpg.io/cluster and cnpg.io/instanceRole,
// controlled by the Cluster) behind the NAME-rw Service, on PVC NAME-1,
// with the NAME-app Secret's credentials. It returns when ctx ends.
func simulateCNPG(ctx context.Context, t *testing.T, env *kubeenv.Env, dyn dynamic.Interface, ns, name string) {
	clusters := dyn.Resource(clusterGVR).Namespace(ns)
	sel := "cnpg.io/cluster=" + name
	reconcile := func() error {
		c, err := clusters.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pods, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return err
		}
		var cond map[string]any
		if c.GetAnnotations()["cnpg.io/hibernation"] == "on" {
			cond = map[string]any{"type": "cnpg.io/hibernation", "status": "True", "reason": "Hibernated", "message": "Cluster has been hibernated"}
			if len(pods.Items) > 0 {
				cond = map[string]any{"type": "cnpg.io/hibernation", "status": "False", "reason": "DeletingPods", "message": "Hibernation is in progress"}
				for _, p := range pods.Items {
					if p.DeletionTimestamp == nil {
						if err := env.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
							return err
						}
					}
				}
			}
		} else if len(pods.Items) == 0 {
			if err := cnpgInstance(ctx, t, env, c); err != nil {
				return err
			}
		}
		phase := "Cluster in healthy state"
		return setClusterStatus(ctx, clusters, name, phase, cond)
	}
	cw, err := clusters.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		t.Error(err)
		return
	}
	defer cw.Stop()
	pw, err := env.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Error(err)
		return
	}
	defer pw.Stop()
	for {
		if err := reconcile(); err != nil && ctx.Err() == nil && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			t.Errorf("simulated CloudNativePG operator: %v", err)
		}
		ok := true
		select {
		case <-ctx.Done():
			return
		case _, ok = <-cw.ResultChan():
		case _, ok = <-pw.ResultChan():
		}
		if !ok {
			if ctx.Err() == nil {
				t.Error("simulated CloudNativePG operator: a watch ended")
			}
			return
		}
	}
}

// cnpgInstance creates instance NAME-1 of Cluster c as its primary.
func cnpgInstance(ctx context.Context, t *testing.T, env *kubeenv.Env, c *unstructured.Unstructured) error {
	ns, name := c.GetNamespace(), c.GetName()
	owner := []metav1.OwnerReference{{
		APIVersion: "postgresql.cnpg.io/v1", Kind: "Cluster", Name: name, UID: c.GetUID(),
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
	primary := map[string]string{"cnpg.io/cluster": name, "cnpg.io/instanceRole": "primary", "role": "primary"}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-rw", OwnerReferences: owner},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"cnpg.io/cluster": name, "cnpg.io/instanceRole": "primary"},
			Ports:    []corev1.ServicePort{{Name: "postgres", Port: 5432, TargetPort: intstr.FromInt32(5432)}},
		},
	}
	if _, err := env.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-1", OwnerReferences: owner, Labels: map[string]string{"cnpg.io/cluster": name}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("100Mi")}},
		},
	}
	if _, err := env.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	tmpl := postgresPod(t, primary, name+"-app", "app", "app")
	tmpl.Spec.Containers[0].Name = "postgres"
	tmpl.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name + "-1"}}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Labels: primary, OwnerReferences: owner}, Spec: tmpl.Spec}
	_, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	return err
}

func setClusterStatus(ctx context.Context, clusters dynamic.ResourceInterface, name, phase string, cond map[string]any) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := clusters.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var conds []any
		old, _, _ := unstructured.NestedSlice(c.Object, "status", "conditions")
		for _, o := range old {
			if m, _ := o.(map[string]any); m["type"] != "cnpg.io/hibernation" {
				conds = append(conds, o)
			}
		}
		if cond != nil {
			cond["lastTransitionTime"] = time.Now().UTC().Format(time.RFC3339)
			conds = append(conds, cond)
		}
		if conds == nil {
			conds = []any{}
		}
		_ = unstructured.SetNestedSlice(c.Object, conds, "status", "conditions")
		_ = unstructured.SetNestedField(c.Object, phase, "status", "phase")
		_, err = clusters.UpdateStatus(ctx, c, metav1.UpdateOptions{})
		return err
	})
}

// TestIntegrationAdoptCloudNativePGCluster: a Cluster (validated by the
// real CRD schema) annotated as a project sleeps and wakes through
// declarative hibernation, keeps its data, and is dialled at the Pod its
// -rw Service selects. The operator is simulated (simulateCNPG).
func TestIntegrationAdoptCloudNativePGCluster(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	installCNPGCRD(t, env)
	ns := env.NewNamespace(t)
	ctx := t.Context()
	dyn, err := dynamic.NewForConfig(env.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	passwordSecret(t, env, ns, "pg-app", map[string]string{"username": "app", "password": "cnpg-pw", "dbname": "app"})
	cluster := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster",
		"metadata": map[string]any{"name": "pg", "annotations": map[string]any{
			k8sbackend.AnnotationAdopt: "analytics", k8sbackend.AnnotationAdoptSecret: "pg-app",
		}},
		"spec": map[string]any{"instances": int64(1), "storage": map[string]any{"size": "100Mi"}},
	}}
	if _, err := dyn.Resource(clusterGVR).Namespace(ns).Create(ctx, cluster, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The schema is the real one: a Cluster it rejects is rejected.
	bad := cluster.DeepCopy()
	bad.SetName("bad")
	_ = unstructured.SetNestedField(bad.Object, "three", "spec", "instances")
	if _, err := dyn.Resource(clusterGVR).Namespace(ns).Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("a Cluster with instances: \"three\" = %v, want Invalid from the CRD's schema", err)
	}
	opCtx, stopOp := context.WithCancel(ctx)
	opDone := make(chan struct{})
	go func() { defer close(opDone); simulateCNPG(opCtx, t, env, dyn, ns, "pg") }()
	t.Cleanup(func() { stopOp(); <-opDone })

	be := adoptBackend(t, env, ns, k8sbackend.DialPortForward)
	rec := record(t, be, "analytics", true)
	s := rec.Spec
	if rec.Adopted != "cluster/pg" || s.User != "app" || s.Database != "app" || s.Password != "cnpg-pw" {
		t.Fatalf("record = %+v; want cluster/pg with the app Secret's credentials", rec)
	}
	ep, err := be.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	query(t, ep.Addr, s, "create table facts(v text); insert into facts values ('kept'); select 'ok'")

	if err := be.Sleep(ctx, s, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	c, err := dyn.Resource(clusterGVR).Namespace(ns).Get(ctx, "pg", metav1.GetOptions{})
	if err != nil || c.GetAnnotations()[k8sbackend.AnnotationHibernation] != "on" {
		t.Fatalf("Cluster after Sleep: annotations %v, %v; want hibernation on", c.GetAnnotations(), err)
	}
	if n := podsOf(t, env, ns, "cnpg.io/cluster=pg"); n != 0 {
		t.Fatalf("%d instance pods after Sleep", n)
	}
	if st, _ := be.Status(ctx, s); st.State != backend.StateStopped {
		t.Fatalf("Status after Sleep = %+v", st)
	}
	if ph := be.Phase(ctx, s); ph != "hibernated" {
		t.Errorf("Phase while hibernated = %q", ph)
	}

	ep2, err := be.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	c, _ = dyn.Resource(clusterGVR).Namespace(ns).Get(ctx, "pg", metav1.GetOptions{})
	if c.GetAnnotations()[k8sbackend.AnnotationHibernation] != "off" {
		t.Errorf("hibernation after Start = %q, want off", c.GetAnnotations()[k8sbackend.AnnotationHibernation])
	}
	if got := query(t, ep2.Addr, s, "select v from facts"); got != "kept" {
		t.Errorf("after rehydration: %q", got)
	}
	pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, "pg-1", metav1.GetOptions{})
	if err != nil || !strings.HasPrefix(ep2.ID, string(pod.UID)) {
		t.Errorf("run %s is not the primary Pod's (%v, %v)", ep2.ID, pod.UID, err)
	}

	// Forgotten, it stays as it is, hibernation and all.
	if err := be.Remove(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	record(t, be, "analytics", false)
	if _, err := dyn.Resource(clusterGVR).Namespace(ns).Get(ctx, "pg", metav1.GetOptions{}); err != nil {
		t.Fatalf("the Cluster after rm: %v", err)
	}
}
