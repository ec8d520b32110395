package proxy_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/k8sbackend"
	"github.com/pgwake/pgwake/internal/testenv"
	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

// TestMain stops the Kubernetes control plane the kubernetes kit starts
// (only a backend-selected run starts one).
func TestMain(m *testing.M) {
	code := m.Run()
	kubeenv.StopShared()
	os.Exit(code)
}

// kubeKit runs the shared suite on the kubernetes backend against a real
// kube-apiserver, etcd, controller-manager (StatefulSet controller,
// garbage collector, PV binder and host-path provisioner) and scheduler.
// Simulated: the node. Its kubelet is virtual-kubelet with a provider
// that runs each Pod's container on the local Docker engine (kubeenv).
// pgwake reaches servers through client-go's port-forward via the API
// server, as from a laptop outside the cluster.
type kubeKit struct {
	mu  sync.Mutex
	nss map[string]string // harness instance -> namespace
}

func (*kubeKit) name() string                  { return "kubernetes" }
func (*kubeKit) canPause() bool                { return false }
func (*kubeKit) image(t testing.TB) string     { return testenv.PostgresImage(t) }
func (k *kubeKit) ns(h *harness) string        { k.mu.Lock(); defer k.mu.Unlock(); return k.nss[h.instance] }
func (*kubeKit) env(t testing.TB) *kubeenv.Env { return kubeenv.Shared(t) }

func (k *kubeKit) newBackend(t testing.TB, instance string, log *slog.Logger) backend.Backend {
	env := k.env(t)
	ns := env.NewNamespace(t)
	k.mu.Lock()
	if k.nss == nil {
		k.nss = map[string]string{}
	}
	k.nss[instance] = ns
	k.mu.Unlock()
	be, err := k8sbackend.New(t.Context(), k8sbackend.Options{
		Config: env.RESTConfig, Namespace: ns,
		Dial: k8sbackend.DialPortForward, Instance: instance, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

// startCounter counts the project's Pods the API server created since
// now: each scale from 0 to 1 creates one (the StatefulSet controller's
// answer to a scale call), seen through a watch and a final list.
func (k *kubeKit) startCounter(t testing.TB, h *harness, spec backend.Spec) func() int {
	env := k.env(t)
	ns := k.ns(h)
	sel := metav1.ListOptions{LabelSelector: k8sbackend.LabelProject + "=" + spec.Name}
	before, err := env.Client.CoreV1().Pods(ns).List(t.Context(), sel)
	if err != nil {
		t.Fatal(err)
	}
	old := map[string]bool{}
	for _, p := range before.Items {
		old[string(p.UID)] = true
	}
	sel.ResourceVersion = before.ResourceVersion
	w, err := env.Client.CoreV1().Pods(ns).Watch(context.Background(), sel)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added && !old[string(p.UID)] {
				mu.Lock()
				seen[string(p.UID)] = true
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return func() int {
		now, err := env.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: sel.LabelSelector})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, p := range now.Items {
			if !old[string(p.UID)] {
				seen[string(p.UID)] = true
			}
		}
		return len(seen)
	}
}

// stopOutside scales the project's StatefulSet to 0 by hand, as `kubectl
// scale --replicas=0` does, and waits until its Pod is gone.
func (k *kubeKit) stopOutside(t testing.TB, h *harness, spec backend.Spec) {
	env, ns := k.env(t), k.ns(h)
	name := "pgwake-" + spec.Name
	_, err := env.Client.AppsV1().StatefulSets(ns).UpdateScale(t.Context(), name,
		&autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: autoscalingv1.ScaleSpec{Replicas: 0}},
		metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	k.waitPodGone(t, h, spec)
}

func (k *kubeKit) waitPodGone(t testing.TB, h *harness, spec backend.Spec) {
	env, ns := k.env(t), k.ns(h)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	w, err := env.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=pgwake-" + spec.Name + "-0"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := env.Client.CoreV1().Pods(ns).Get(ctx, "pgwake-"+spec.Name+"-0", metav1.GetOptions{}); err != nil {
		return // gone already
	}
	for ev := range w.ResultChan() {
		if ev.Type == watch.Deleted {
			return
		}
	}
	t.Fatalf("pod of %s still there: %v", spec.Name, ctx.Err())
}

func (*kubeKit) brokenSpec(t testing.TB, h *harness) (backend.Spec, string) {
	// An image the node's engine lacks and cannot pull: the Pod reports
	// ErrImagePull, as a kubelet does.
	return backend.Spec{Name: "broken", Image: "pgwake-test/does-not-exist:0", User: "postgres", Password: "x", Database: "broken"}, "does-not-exist"
}

func (*kubeKit) crashingProject(t testing.TB, h *harness) (backend.Spec, []string) {
	spec := h.newSpec("crashy")
	spec.Image = testenv.CrashingImage(t)
	h.register(spec, backend.SleepStop, 0)
	return spec, []string{"exited with code 3", "deliberate crash before serving"}
}

// crash kills the Pod's container with SIGKILL on the (simulated) node,
// as the OOM killer would.
func (k *kubeKit) crash(t testing.TB, h *harness, spec backend.Spec) {
	pod := k.ns(h) + "/pgwake-" + spec.Name + "-0"
	out, err := exec.Command("docker", "ps", "-q", "--filter", "label="+kubeenv.LabelEnv+".pod="+pod,
		"--filter", "label="+kubeenv.LabelEnv+".container=postgres").Output()
	if err != nil {
		t.Fatal(err)
	}
	ids := strings.Fields(string(out))
	if len(ids) == 0 {
		t.Fatalf("no running container for pod %s", pod)
	}
	dockerCLI(t, append([]string{"kill", "--signal", "KILL"}, ids...)...)
}

// reuseAddress does nothing: every run of a server gets its own
// port-forward, on a loopback port the kernel picks.
func (*kubeKit) reuseAddress(testing.TB, *harness, backend.Spec, string) {}
