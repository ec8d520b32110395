package k8sbackend_test

// These tests run against a real kube-apiserver, etcd, controller-manager
// (StatefulSet controller, garbage collector, PV binder and host-path
// provisioner) and scheduler. Simulated: the node. Its kubelet is
// virtual-kubelet with a provider running each Pod's container on the
// local Docker engine (internal/testenv/kubeenv). The Postgres servers,
// the scale subresource and the port-forward path through the API server
// are real.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/k8sbackend"
	"github.com/pgwake/pgwake/internal/testenv"
	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	kubeenv.StopShared()
	os.Exit(code)
}

type fixture struct {
	env *kubeenv.Env
	ns  string
	be  *k8sbackend.Backend
}

func newFixture(t *testing.T, dial string) *fixture {
	t.Helper()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	return &fixture{env: env, ns: ns, be: newBackend(t, env, ns, dial)}
}

func newBackend(t *testing.T, env *kubeenv.Env, ns, dial string) *k8sbackend.Backend {
	t.Helper()
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	be, err := k8sbackend.New(t.Context(), k8sbackend.Options{
		Config: env.RESTConfig, Namespace: ns, Dial: dial, Instance: "test", Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

func spec(t testing.TB, name string) backend.Spec {
	return backend.Spec{Name: name, Image: testenv.PostgresImage(t), User: "postgres", Password: "pw-" + name, Database: name}
}

// query runs sql on the server at addr (until Postgres serves: a Pod is
// Ready before Postgres accepts connections) and returns the first value.
func query(t *testing.T, addr string, s backend.Spec, sql string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	url := fmt.Sprintf("postgres://%s:%s@%s:%s/%s?sslmode=disable&connect_timeout=10", s.User, s.Password, host, port, s.Database)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var lastErr error
	for ctx.Err() == nil {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			// Statements before the last run as one simple-protocol batch.
			var out string
			if i := strings.LastIndex(sql, ";"); i >= 0 {
				_, err = conn.Exec(ctx, sql[:i])
				sql = strings.TrimSpace(sql[i+1:])
			}
			if err == nil {
				err = conn.QueryRow(ctx, sql).Scan(&out)
			}
			conn.Close(ctx)
			if err == nil {
				return out
			}
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) {
				t.Fatalf("query %q at %s: %v", sql, addr, err)
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatalf("query %q at %s: %v", sql, addr, lastErr)
	return ""
}

func TestIntegrationLifecycleOverPortForward(t *testing.T) {
	t.Parallel()
	f := newFixture(t, k8sbackend.DialPortForward)
	ctx := t.Context()
	s := spec(t, "life")

	if err := f.be.Ensure(ctx, s); err != nil {
		t.Fatal(err)
	}
	// What a project is in the cluster: labelled objects, owned by the
	// StatefulSet, which starts with no replica.
	set, err := f.env.Client.AppsV1().StatefulSets(f.ns).Get(ctx, "pgwake-life", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(set.Spec.Replicas, -1); got != 0 {
		t.Errorf("replicas after Ensure = %d, want 0", got)
	}
	if set.Labels[k8sbackend.LabelManaged] != "true" || set.Labels[k8sbackend.LabelProject] != "life" {
		t.Errorf("statefulset labels = %v", set.Labels)
	}
	sec, err := f.env.Client.CoreV1().Secrets(f.ns).Get(ctx, "pgwake-life", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(sec.Data["password"]) != s.Password || !ownedBy(sec.OwnerReferences, set) {
		t.Errorf("secret: password %q owners %v", sec.Data["password"], sec.OwnerReferences)
	}
	svc, err := f.env.Client.CoreV1().Services(f.ns).Get(ctx, "pgwake-life", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !ownedBy(svc.OwnerReferences, set) {
		t.Errorf("service: clusterIP %q owners %v", svc.Spec.ClusterIP, svc.OwnerReferences)
	}
	if !f.be.WillInitialize(ctx, s) {
		t.Error("WillInitialize = false before the first start")
	}
	if st, err := f.be.Status(ctx, s); err != nil || st.State != backend.StateStopped {
		t.Fatalf("Status before start = %+v, %v; want stopped", st, err)
	}

	ep, err := f.be.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if !ep.First {
		t.Error("first start not marked First")
	}
	if host, _, _ := net.SplitHostPort(ep.Addr); host != "127.0.0.1" {
		t.Errorf("port-forward address %s is not on loopback", ep.Addr)
	}
	query(t, ep.Addr, s, "create table kept(v text); insert into kept values ('before sleep'); select 'ok'")
	st, err := f.be.Status(ctx, s)
	if err != nil || st.State != backend.StateRunning || st.Addr != ep.Addr || st.ID != ep.ID {
		t.Fatalf("Status while running = %+v, %v; want running at %s id %s", st, err, ep.Addr, ep.ID)
	}

	if err := f.be.Sleep(ctx, s, backend.SleepPause); err == nil || !strings.Contains(err.Error(), "cannot pause") {
		t.Errorf("Sleep(pause) = %v, want a refusal", err)
	}
	if err := f.be.Sleep(ctx, s, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	pods, err := f.env.Client.CoreV1().Pods(f.ns).List(ctx, metav1.ListOptions{LabelSelector: k8sbackend.LabelProject + "=life"})
	if err != nil || len(pods.Items) != 0 {
		t.Fatalf("pods after Sleep: %d, %v", len(pods.Items), err)
	}
	scale, err := f.env.Client.AppsV1().StatefulSets(f.ns).GetScale(ctx, "pgwake-life", metav1.GetOptions{})
	if err != nil || scale.Spec.Replicas != 0 {
		t.Fatalf("scale after Sleep = %v, %v", scale, err)
	}
	if st, _ := f.be.Status(ctx, s); st.State != backend.StateStopped {
		t.Fatalf("Status after Sleep = %+v", st)
	}
	if f.be.WillInitialize(ctx, s) {
		t.Error("WillInitialize = true once the PVC exists")
	}

	ep2, err := f.be.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if ep2.ID == ep.ID || ep2.First {
		t.Errorf("second start: id %s (first %s), First %v", ep2.ID, ep.ID, ep2.First)
	}
	if got := query(t, ep2.Addr, s, "select v from kept"); got != "before sleep" {
		t.Errorf("row after sleep and wake = %q", got)
	}

	rc, err := f.be.Logs(ctx, s, false, 50)
	if err != nil {
		t.Fatal(err)
	}
	logs, _ := io.ReadAll(rc)
	rc.Close()
	if !strings.Contains(string(logs), "ready to accept connections") {
		t.Errorf("pod logs lack Postgres's start line:\n%s", logs)
	}
}

func TestIntegrationPodIPDial(t *testing.T) {
	t.Parallel()
	f := newFixture(t, k8sbackend.DialPodIP)
	s := spec(t, "direct")
	ep, err := f.be.Start(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := f.env.Client.CoreV1().Pods(f.ns).Get(t.Context(), "pgwake-direct-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := net.JoinHostPort(pod.Status.PodIP, "5432"); ep.Addr != want {
		t.Errorf("addr = %s, want the Pod IP %s", ep.Addr, want)
	}
	if got := query(t, ep.Addr, s, "select current_database()"); got != "direct" {
		t.Errorf("database = %q", got)
	}
}

func TestIntegrationRemoveKeepsOrDeletesData(t *testing.T) {
	t.Parallel()
	f := newFixture(t, k8sbackend.DialPortForward)
	ctx := t.Context()
	s := spec(t, "keep")
	ep, err := f.be.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	query(t, ep.Addr, s, "create table t(v int); insert into t values (42); select 'ok'")

	if err := f.be.Remove(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	waitGone(t, func() error {
		_, err := f.env.Client.AppsV1().StatefulSets(f.ns).Get(ctx, "pgwake-keep", metav1.GetOptions{})
		return err
	})
	if _, err := f.env.Client.CoreV1().PersistentVolumeClaims(f.ns).Get(ctx, "data-pgwake-keep-0", metav1.GetOptions{}); err != nil {
		t.Fatalf("PVC after rm without volumes: %v", err)
	}
	kept, ok, err := f.be.Kept(ctx, "keep")
	if err != nil || !ok || kept.Password != s.Password {
		t.Fatalf("Kept = %+v, %v, %v", kept, ok, err)
	}

	// Created again with the kept credentials, it reaches the same data.
	ep, err = f.be.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if got := query(t, ep.Addr, s, "select v::text from t"); got != "42" {
		t.Errorf("row after rm and create = %q", got)
	}
	if _, ok, _ := f.be.Kept(ctx, "keep"); ok {
		t.Error("secret still marked kept once a project took it over")
	}

	if err := f.be.Remove(ctx, s, true); err != nil {
		t.Fatal(err)
	}
	for _, get := range []func() error{
		func() error {
			_, err := f.env.Client.CoreV1().PersistentVolumeClaims(f.ns).Get(ctx, "data-pgwake-keep-0", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := f.env.Client.CoreV1().Secrets(f.ns).Get(ctx, "pgwake-keep", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := f.env.Client.CoreV1().Services(f.ns).Get(ctx, "pgwake-keep", metav1.GetOptions{})
			return err
		},
	} {
		waitGone(t, get)
	}
}

// waitGone waits until get reports NotFound (the garbage collector works
// asynchronously).
func waitGone(t *testing.T, get func() error) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := get()
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still there after 2 minutes (err %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func ownedBy(refs []metav1.OwnerReference, set *appsv1.StatefulSet) bool {
	for _, r := range refs {
		if r.UID == set.UID {
			return true
		}
	}
	return false
}

func TestIntegrationNotOwnedIsLeftAlone(t *testing.T) {
	t.Parallel()
	f := newFixture(t, k8sbackend.DialPortForward)
	ctx := t.Context()
	// Somebody else's StatefulSet with the name pgwake would use.
	theirs := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "pgwake-theirs", Labels: map[string]string{"app": "theirs"}},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To[int32](0),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "theirs"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "theirs"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "theirs:1"}}},
			},
		},
	}
	if _, err := f.env.Client.AppsV1().StatefulSets(f.ns).Create(ctx, theirs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := spec(t, "theirs")
	for name, call := range map[string]func() error{
		"Ensure": func() error { return f.be.Ensure(ctx, s) },
		"Start":  func() error { _, err := f.be.Start(ctx, s); return err },
		"Status": func() error { _, err := f.be.Status(ctx, s); return err },
		"Remove": func() error { return f.be.Remove(ctx, s, true) },
	} {
		if err := call(); !errors.Is(err, backend.ErrNotOwned) {
			t.Errorf("%s = %v, want ErrNotOwned", name, err)
		}
	}
	got, err := f.env.Client.AppsV1().StatefulSets(f.ns).Get(ctx, "pgwake-theirs", metav1.GetOptions{})
	if err != nil || got.UID == "" || got.Spec.Template.Spec.Containers[0].Image != "theirs:1" || ptr.Deref(got.Spec.Replicas, -1) != 0 {
		t.Fatalf("their statefulset was touched: %+v, %v", got, err)
	}
	if _, err := f.env.Client.CoreV1().Secrets(f.ns).Get(ctx, "pgwake-theirs", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a secret was made next to somebody else's statefulset: %v", err)
	}
}

func TestIntegrationStartFailsFastWithThePodsReason(t *testing.T) {
	t.Parallel()
	f := newFixture(t, k8sbackend.DialPortForward)
	for _, tc := range []struct {
		name, image string
		want        []string
	}{
		{"pull", "pgwake-test/does-not-exist:0", []string{"cannot be pulled", "does-not-exist"}},
		{"crash", testenv.CrashingImage(t), []string{"exited with code 3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := spec(t, tc.name)
			s.Image = tc.image
			// Far longer than a failure should take to be seen: the test
			// fails on the message, not on the clock.
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			_, err := f.be.Start(ctx, s)
			if err == nil && tc.name == "crash" {
				// The container ran before it crashed: Start may return,
				// and Status then reports the exit, as on Docker.
				for err == nil {
					st, serr := f.be.Status(ctx, s)
					switch {
					case serr != nil:
						t.Fatal(serr)
					case st.State != backend.StateRunning && st.Exit != "":
						err = errors.New(st.Exit)
					case ctx.Err() != nil:
						t.Fatalf("Status never reported the crash: %+v", st)
					default:
						time.Sleep(50 * time.Millisecond)
					}
				}
			}
			if err == nil {
				t.Fatal("Start succeeded")
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Start waited until its deadline instead of reading the Pod's status: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestIntegrationErrorsUsersCanActOn(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	ctx := t.Context()

	t.Run("namespace missing", func(t *testing.T) {
		_, err := k8sbackend.New(ctx, k8sbackend.Options{Kubeconfig: env.Kubeconfig, Namespace: "no-such-namespace"})
		if err == nil || !strings.Contains(err.Error(), `namespace "no-such-namespace" does not exist`) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("forbidden", func(t *testing.T) {
		_, err := k8sbackend.New(ctx, k8sbackend.Options{Kubeconfig: env.KubeconfigFor(t, kubeenv.Limited), Namespace: ns})
		if err == nil {
			t.Fatal("a user without RBAC bindings connected")
		}
		for _, w := range []string{"forbidden", "list", "statefulsets"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q lacks %q", err, w)
			}
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		// A kubeconfig naming a port nothing listens on.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		path := t.TempDir() + "/kubeconfig"
		cfg := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://%s', insecure-skip-tls-verify: true}\n"+
			"users:\n- name: u\n  user: {token: x}\ncontexts:\n- name: x\n  context: {cluster: c, user: u, namespace: %s}\ncurrent-context: x\n", addr, ns)
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = k8sbackend.New(ctx, k8sbackend.Options{Kubeconfig: path})
		if !errors.Is(err, backend.ErrUnavailable) || !strings.Contains(err.Error(), addr) {
			t.Fatalf("err = %v, want ErrUnavailable naming %s", err, addr)
		}
	})
	t.Run("context", func(t *testing.T) {
		_, err := k8sbackend.New(ctx, k8sbackend.Options{Kubeconfig: env.Kubeconfig, Context: "no-such-context"})
		if err == nil || !strings.Contains(err.Error(), "no-such-context") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestIntegrationCatalogSharedByTwoBackends(t *testing.T) {
	t.Parallel()
	f := newFixture(t, k8sbackend.DialPortForward)
	other := newBackend(t, f.env, f.ns, k8sbackend.DialPortForward)
	ctx := t.Context()
	s := spec(t, "shared")
	if err := f.be.Ensure(ctx, s); err != nil {
		t.Fatal(err)
	}
	rec := backend.Record{Spec: s, SleepAfter: 7 * time.Minute, SleepMode: backend.SleepStop, Pinned: true, CreatedAt: time.Now()}
	if err := f.be.Save(ctx, rec); err != nil {
		t.Fatal(err)
	}
	// The other backend's informers see it, with password and settings.
	deadline := time.Now().Add(time.Minute)
	for {
		recs, err := other.Projects(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 1 && recs[0].Saved {
			got := recs[0]
			if got.Spec.Password != s.Password || got.Spec.User != s.User || got.Spec.Database != s.Database ||
				got.SleepAfter != 7*time.Minute || !got.Pinned || got.Spec.Image != s.Image {
				t.Fatalf("record seen by the other backend = %+v", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the other backend sees %+v", recs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A start by one is a running server for the other.
	ep, err := f.be.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	query(t, ep.Addr, s, "select 1::text")
	for {
		st, err := other.Status(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == backend.StateRunning {
			if st.ID != ep.ID {
				t.Errorf("the other sees run %s, want %s", st.ID, ep.ID)
			}
			query(t, st.Addr, s, "select 1::text")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the other backend sees %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIntegrationDocumentedRBACSuffices runs a project's whole life as a
// user that holds the Role in deploy/kubernetes/base/role.yaml and nothing
// else: what the README tells users to grant is enough.
func TestIntegrationDocumentedRBACSuffices(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	ctx := t.Context()
	data, err := os.ReadFile("../../deploy/kubernetes/base/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.Role
	if err := yaml.UnmarshalStrict(data, &role); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.RbacV1().Roles(ns).Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "pgwake"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: kubeenv.Limited}},
	}
	if _, err := env.Client.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Adoption's reads and writes are in the Role too: New says nothing
	// about turning any of it off.
	var logged strings.Builder
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logged.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelWarn}))
	be, err := k8sbackend.New(ctx, k8sbackend.Options{
		Kubeconfig: env.KubeconfigFor(t, kubeenv.Limited), Namespace: ns, Dial: k8sbackend.DialPortForward,
		Adopt: true, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	logMu.Lock()
	if w := logged.String(); strings.Contains(w, "RBAC") {
		t.Errorf("New as the documented Role warned: %s", w)
	}
	logMu.Unlock()
	s := spec(t, "rbac")
	if err := be.Ensure(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := be.Save(ctx, backend.Record{Spec: s, SleepMode: backend.SleepStop, Pinned: true}); err != nil {
		t.Fatal(err)
	}
	ep, err := be.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	query(t, ep.Addr, s, "select 1::text")
	// A copy of the running server: a helper Pod, exec in both Pods, a PVC.
	if _, err := be.Snapshot(ctx, s, "live", true); err != nil {
		t.Fatalf("snapshot as the documented Role: %v", err)
	}
	// Peer-aware idle: the Role lets it publish its use and read others'.
	be.Use("rbac", backend.Use{Conns: 1})
	_, lease := be.Peer()
	waitLease(t, env, ns, lease, func(u map[string]peerEntry) bool { return u["rbac"].Conns == 1 })
	if _, err := be.PeerUse(ctx, "rbac"); err != nil {
		t.Fatalf("PeerUse as the documented Role: %v", err)
	}
	rc, err := be.Logs(ctx, s, false, 10)
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if err := be.Sleep(ctx, s, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	// File copies of the stopped server: a hold on its StatefulSet, a
	// branch's PVC, a restore, a snapshot's deletion.
	if _, err := be.Branch(ctx, s, spec(t, "rbac-branch"), false); err != nil {
		t.Fatalf("branch as the documented Role: %v", err)
	}
	if err := be.Restore(ctx, s, "live"); err != nil {
		t.Fatalf("restore as the documented Role: %v", err)
	}
	if snaps, err := be.Snapshots(ctx, s, true); err != nil || len(snaps) != 1 {
		t.Fatalf("snapshots as the documented Role: %v, %v", snaps, err)
	}
	if err := be.DeleteSnapshot(ctx, s, "live"); err != nil {
		t.Fatalf("delete a snapshot as the documented Role: %v", err)
	}
	if err := be.Remove(ctx, s, false); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := be.Kept(ctx, "rbac"); err != nil || !ok {
		t.Fatalf("Kept = %v, %v", ok, err)
	}
	if err := be.RemoveAll(ctx, true); err != nil {
		t.Fatal(err)
	}

	// An adopted Deployment's whole life, as the Role: wake, pin, sleep,
	// forget.
	pvc(t, env, ns, "adopted-data")
	tmpl := postgresPod(t, map[string]string{"app": "adopted"}, "adopted", "", "")
	tmpl.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "adopted-data"}}}}
	passwordSecret(t, env, ns, "adopted", map[string]string{"password": "adopted-pw"})
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "adopted", Annotations: map[string]string{
			k8sbackend.AnnotationAdopt: "adopted", k8sbackend.AnnotationAdoptSecret: "adopted"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "adopted"}},
			Template: tmpl, Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
		},
	}
	if _, err := env.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	as := record(t, be, "adopted", true).Spec
	if as.Password != "adopted-pw" {
		t.Errorf("adopted password %q: the Role cannot read the Secret it names", as.Password)
	}
	if ep, err = be.Start(ctx, as); err != nil {
		t.Fatal(err)
	}
	query(t, ep.Addr, as, "select 1::text")
	if err := be.Save(ctx, backend.Record{Spec: as, Pinned: true}); err != nil {
		t.Fatal(err)
	}
	if err := be.Sleep(ctx, as, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	if err := be.Remove(ctx, as, false); err != nil {
		t.Fatal(err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
