package kubeenv_test

// These tests run the env itself. What they exercise is real except the
// kubelet: etcd, kube-apiserver, kube-controller-manager (StatefulSets,
// host-path PV provisioning) and kube-scheduler are the upstream binaries,
// port-forward and logs go through the API server's kubelet proxy, and
// Postgres is the real server of testenv's image in Docker; the node is
// virtual-kubelet with this package's Docker provider (see the package
// doc).

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/moby/moby/client"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/client-go/transport/spdy"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/client-go/util/retry"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/pgwake/pgwake/internal/testenv"
	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	kubeenv.StopShared()
	os.Exit(code)
}

const pgPassword = "kubeenv-secret"

// TestIntegrationPostgresPod: a Pod of the test Postgres image, its
// password from a Secret and its data on a PVC of the default
// StorageClass, turns Ready (an exec readiness probe); a port-forward
// through the API server reaches the server; its log through the API has
// Postgres's "ready to accept connections".
func TestIntegrationPostgresPod(t *testing.T) {
	env := kubeenv.Shared(t)
	image := testenv.PostgresImage(t)
	ns := env.NewNamespace(t)
	ctx := t.Context()
	cs := env.Client

	mustCreate(t, func() error {
		_, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "pg"},
			StringData: map[string]string{"password": pgPassword},
		}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim("data"), metav1.CreateOptions{})
		return err
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pg"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{postgresContainer(image, &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "pg"}, Key: "password",
			}}, corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"pg_isready", "-h", "127.0.0.1", "-U", "postgres"}}})},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"},
			}}},
		},
	}
	created := time.Now()
	mustCreate(t, func() error {
		_, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		return err
	})
	ready := waitPod(t, env, ns, "pg", 2*time.Minute, "Ready", podReady)
	t.Logf("pod Ready %v after creation (PVC provisioned and bound, scheduled, initdb, probe)", time.Since(created).Round(time.Millisecond))
	if ready.Spec.NodeName != env.NodeName || ready.Status.PodIP == "" {
		t.Errorf("pod on node %q with IP %q, want node %q and an IP", ready.Spec.NodeName, ready.Status.PodIP, env.NodeName)
	}

	begin := time.Now()
	addr := portForward(t, env, ns, "pg", 5432)
	// The first byte: Postgres's answer to an SSLRequest.
	first := sslRequest(t, addr)
	t.Logf("port-forward: first byte %q %v after starting the forwarder", first, time.Since(begin).Round(time.Millisecond))

	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres:%s@%s/postgres?sslmode=disable", pgPassword, addr))
	if err != nil {
		t.Fatalf("connect through port-forward: %v", err)
	}
	defer conn.Close(context.Background())
	var one int
	if err := conn.QueryRow(ctx, "select 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("select 1 = %d, %v", one, err)
	}

	logs, err := cs.CoreV1().Pods(ns).GetLogs("pg", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("pod logs: %v", err)
	}
	if !strings.Contains(string(logs), "ready to accept connections") {
		t.Errorf("pod logs lack %q:\n%s", "ready to accept connections", logs)
	}
	tail, err := cs.CoreV1().Pods(ns).GetLogs("pg", &corev1.PodLogOptions{TailLines: ptr[int64](1)}).DoRaw(ctx)
	if err != nil || strings.Count(strings.TrimSpace(string(tail)), "\n") != 0 {
		t.Errorf("logs with tailLines=1: %v\n%s", err, tail)
	}

	// exec through the API server: the downward API's status.podIP, and
	// an exit code.
	out, err := execIn(t, env, ns, "pg", "sh", "-c", "echo $POD_IP")
	if err != nil || strings.TrimSpace(out) != ready.Status.PodIP {
		t.Errorf("exec echo $POD_IP: %q, %v; want the pod IP %s", out, err, ready.Status.PodIP)
	}
	_, err = execIn(t, env, ns, "pg", "sh", "-c", "exit 7")
	var exitErr utilexec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitStatus() != 7 {
		t.Errorf("exec exit 7: %v, want exit status 7", err)
	}
}

// execIn runs command in the Pod's first container through the API
// server and returns its output (stdout, then stderr).
func execIn(t *testing.T, env *kubeenv.Env, ns, pod string, command ...string) (string, error) {
	t.Helper()
	req := env.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Command: command, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(env.RESTConfig, http.MethodPost, req.URL())
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err = ex.StreamWithContext(t.Context(), remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	return stdout.String() + stderr.String(), err
}

// TestIntegrationStatefulSetScale: a row written before a StatefulSet is
// scaled 1→0 through its scale subresource is there after 0→1 (the data
// lives on the PV, not in the container), and Postgres was shut down
// cleanly (no crash recovery on the next start).
func TestIntegrationStatefulSetScale(t *testing.T) {
	env := kubeenv.Shared(t)
	image := testenv.PostgresImage(t)
	ns := env.NewNamespace(t)
	ctx := t.Context()
	cs := env.Client

	labels := map[string]string{"app": "pg"}
	set := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "pg"},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr[int32](1),
			ServiceName: "pg",
			Selector:    &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{
					postgresContainer(image, nil, corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(5432)}}),
				}},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{*claim("data")},
		},
	}
	mustCreate(t, func() error {
		_, err := cs.AppsV1().StatefulSets(ns).Create(ctx, set, metav1.CreateOptions{})
		return err
	})
	created := time.Now()
	first := waitPod(t, env, ns, "pg-0", 2*time.Minute, "Ready", podReady)
	t.Logf("pg-0 Ready %v after the StatefulSet was created", time.Since(created).Round(time.Millisecond))

	query(t, env, ns, "pg-0", func(conn *pgx.Conn) {
		if _, err := conn.Exec(ctx, "create table kept (v text); insert into kept values ('before scale-down')"); err != nil {
			t.Fatal(err)
		}
	})

	scaleTo(t, cs, ns, "pg", 0)
	begin := time.Now()
	waitPodGone(t, env, ns, "pg-0", first.UID, 2*time.Minute)
	t.Logf("scale to 0: pod gone %v after the scale request", time.Since(begin).Round(time.Millisecond))

	scaleTo(t, cs, ns, "pg", 1)
	begin = time.Now()
	second := waitPod(t, env, ns, "pg-0", 2*time.Minute, "Ready again", func(p *corev1.Pod) bool {
		return p.UID != first.UID && podReady(p)
	})
	t.Logf("scale to 1: pod Ready %v after the scale request", time.Since(begin).Round(time.Millisecond))
	if second.Status.PodIP == "" {
		t.Errorf("second pod has no IP")
	}

	query(t, env, ns, "pg-0", func(conn *pgx.Conn) {
		var v string
		if err := conn.QueryRow(ctx, "select v from kept").Scan(&v); err != nil || v != "before scale-down" {
			t.Errorf("row after scale 1→0→1: %q, %v", v, err)
		}
	})
	logs, err := cs.CoreV1().Pods(ns).GetLogs("pg-0", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("pod logs: %v", err)
	}
	if strings.Contains(string(logs), "not properly shut down") || strings.Contains(string(logs), "automatic recovery") {
		t.Errorf("the second server ran crash recovery: the first was not shut down cleanly:\n%s", logs)
	}
	if strings.Contains(string(logs), "initializing database") || strings.Contains(string(logs), "initdb") {
		t.Errorf("the second server initialized a new database:\n%s", logs)
	}
}

// TestIntegrationFailures: what a kubelet reports for a missing image, a
// command that exits, and a container killed from outside.
func TestIntegrationFailures(t *testing.T) {
	env := kubeenv.Shared(t)
	image := testenv.PostgresImage(t)
	ns := env.NewNamespace(t)
	cs := env.Client

	t.Run("missing image", func(t *testing.T) {
		t.Parallel()
		missing := "pgwake-test/no-such-image:1"
		createPod(t, cs, ns, simplePod("missing", missing, nil))
		p := waitPod(t, env, ns, "missing", time.Minute, "ErrImagePull", waitingReason("ErrImagePull"))
		if msg := p.Status.ContainerStatuses[0].State.Waiting.Message; !strings.Contains(msg, missing) {
			t.Errorf("ErrImagePull message %q does not name the image", msg)
		}
		p = waitPod(t, env, ns, "missing", time.Minute, "ImagePullBackOff", waitingReason("ImagePullBackOff"))
		if p.Status.Phase != corev1.PodPending {
			t.Errorf("phase %s, want Pending", p.Status.Phase)
		}
		t.Logf("ImagePullBackOff: %s", p.Status.ContainerStatuses[0].State.Waiting.Message)
	})

	t.Run("exit 3", func(t *testing.T) {
		t.Parallel()
		createPod(t, cs, ns, simplePod("crash", image, []string{"/bin/sh", "-c", "echo going down >&2; exit 3"}))
		p := waitPod(t, env, ns, "crash", time.Minute, "CrashLoopBackOff with exit code 3", func(p *corev1.Pod) bool {
			if !waitingReason("CrashLoopBackOff")(p) {
				return false
			}
			term := p.Status.ContainerStatuses[0].LastTerminationState.Terminated
			return term != nil && term.ExitCode == 3
		})
		st := p.Status.ContainerStatuses[0]
		if st.RestartCount < 1 || st.LastTerminationState.Terminated.Reason != "Error" || p.Status.Phase != corev1.PodRunning {
			t.Errorf("restartCount %d, lastState reason %q, phase %s; want >= 1, Error, Running",
				st.RestartCount, st.LastTerminationState.Terminated.Reason, p.Status.Phase)
		}
		logs, err := cs.CoreV1().Pods(ns).GetLogs("crash", &corev1.PodLogOptions{}).DoRaw(t.Context())
		if err != nil || !strings.Contains(string(logs), "going down") {
			t.Errorf("logs of the crashed run: %q, %v", logs, err)
		}
	})

	t.Run("docker kill", func(t *testing.T) {
		t.Parallel()
		createPod(t, cs, ns, simplePod("killed", image, []string{"sleep", "3600"}))
		p := waitPod(t, env, ns, "killed", time.Minute, "Ready", podReady)
		id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "docker://")
		docker := testenv.DockerClient(t)
		if _, err := docker.ContainerKill(t.Context(), id, client.ContainerKillOptions{Signal: "SIGKILL"}); err != nil {
			t.Fatalf("docker kill %s: %v", id, err)
		}
		p = waitPod(t, env, ns, "killed", time.Minute, "restarted after exit 137", func(p *corev1.Pod) bool {
			st := p.Status.ContainerStatuses[0]
			term := st.LastTerminationState.Terminated
			return st.RestartCount >= 1 && term != nil && term.ExitCode == 137
		})
		if got := p.Status.ContainerStatuses[0].ContainerID; got == "docker://"+id {
			t.Errorf("container not replaced after the kill: %s", got)
		}
	})
}

// TestIntegrationVolumeReclaim: a PVC of the default StorageClass gets a
// directory of the host-path provisioner, mounted by the Pod that uses it
// and removed with the claim (reclaimPolicy Delete), once the Pod is gone.
func TestIntegrationVolumeReclaim(t *testing.T) {
	env := kubeenv.Shared(t)
	image := testenv.PostgresImage(t)
	ns := env.NewNamespace(t)
	ctx := t.Context()
	cs := env.Client

	mustCreate(t, func() error {
		_, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim("data"), metav1.CreateOptions{})
		return err
	})
	pod := simplePod("writer", image, []string{"sh", "-c", "echo kept > /data/file && sleep 3600"})
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	pod.Spec.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
		Exec: &corev1.ExecAction{Command: []string{"test", "-f", "/data/file"}},
	}}
	pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"},
	}}}
	createPod(t, cs, ns, pod)
	p := waitPod(t, env, ns, "writer", time.Minute, "Ready", podReady)
	pvc, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Spec.StorageClassName != kubeenv.StorageClass || pv.Spec.HostPath == nil {
		t.Fatalf("PV %s: class %q, hostPath %v", pv.Name, pv.Spec.StorageClassName, pv.Spec.HostPath)
	}
	dir := pv.Spec.HostPath.Path
	if got, err := os.ReadFile(dir + "/file"); err != nil || string(got) != "kept\n" {
		t.Fatalf("the Pod's file in the PV's directory %s: %q, %v", dir, got, err)
	}

	if err := cs.CoreV1().Pods(ns).Delete(ctx, "writer", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(t, env, ns, "writer", p.UID, time.Minute)
	if err := cs.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	lw := cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "persistentvolumes", "", fields.OneTermEqualSelector("metadata.name", pv.Name))
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err = watchtools.UntilWithSync(wctx, lw, &corev1.PersistentVolume{}, func(store cache.Store) (bool, error) {
		return len(store.List()) == 0, nil
	}, func(ev watch.Event) (bool, error) { return ev.Type == watch.Deleted, nil })
	if err != nil {
		t.Fatalf("PV %s not deleted with its claim: %v", pv.Name, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("PV directory %s after the PV was deleted: %v", dir, err)
	}
}

// TestIntegrationPreStop: a deleted Pod's preStop exec hook runs before
// its container is stopped, with its volumes (a Secret's files, an
// emptyDir written by the container, a hostPath) in place.
func TestIntegrationPreStop(t *testing.T) {
	env := kubeenv.Shared(t)
	image := testenv.PostgresImage(t)
	ns := env.NewNamespace(t)
	ctx := t.Context()
	cs := env.Client
	out := t.TempDir()

	mustCreate(t, func() error {
		_, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "s"},
			StringData: map[string]string{"word": "secret-word"},
		}, metav1.CreateOptions{})
		return err
	})
	pod := simplePod("hook", image, []string{"sh", "-c", "echo scratch > /scratch/f && exec sleep 3600"})
	pod.Spec.TerminationGracePeriodSeconds = ptr[int64](3)
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = []corev1.VolumeMount{
		{Name: "secret", MountPath: "/secret"},
		{Name: "scratch", MountPath: "/scratch"},
		{Name: "out", MountPath: "/out"},
	}
	// Ready once the command wrote its file (under load, after Running).
	c.ReadinessProbe = &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
		Exec: &corev1.ExecAction{Command: []string{"test", "-s", "/scratch/f"}},
	}}
	c.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{
		Command: []string{"sh", "-c", "cat /secret/word /scratch/f > /out/prestop"},
	}}}
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "s"}}},
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "out", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: out}}},
	}
	createPod(t, cs, ns, pod)
	p := waitPod(t, env, ns, "hook", time.Minute, "Ready", podReady)
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "hook", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	waitPodGone(t, env, ns, "hook", p.UID, time.Minute)
	// sleep as PID 1 ignores SIGTERM: the stop waits the grace period out.
	t.Logf("pod gone %v after deletion", time.Since(begin).Round(time.Millisecond))
	got, err := os.ReadFile(out + "/prestop")
	if err != nil || string(got) != "secret-wordscratch\n" {
		t.Errorf("preStop hook's output: %q, %v", got, err)
	}
}

// TestIntegrationKubeconfigs: the admin kubeconfig works through
// client-go's loading rules (and kubectl, when installed); the limited
// user is authenticated and forbidden.
func TestIntegrationKubeconfigs(t *testing.T) {
	env := kubeenv.Shared(t)
	ctx := t.Context()

	admin := clientFrom(t, env.Kubeconfig)
	n, err := admin.CoreV1().Nodes().Get(ctx, env.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("admin kubeconfig: get node: %v", err)
	}
	if !nodeReady(n) {
		t.Errorf("node %s not Ready: %+v", env.NodeName, n.Status.Conditions)
	}

	limited := clientFrom(t, env.KubeconfigFor(t, kubeenv.Limited))
	_, err = limited.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("limited user listing pods: %v, want Forbidden", err)
	}

	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Log("kubectl not installed; skipping its check")
		return
	}
	out, err := exec.CommandContext(ctx, "kubectl", "--kubeconfig", env.Kubeconfig, "get", "node", env.NodeName, "-o", "name").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "node/"+env.NodeName {
		t.Errorf("kubectl get node: %v\n%s", err, out)
	}
}

func clientFrom(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		t.Fatalf("load %s: %v", kubeconfig, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func postgresContainer(image string, password *corev1.EnvVarSource, probe corev1.ProbeHandler) corev1.Container {
	pw := corev1.EnvVar{Name: "POSTGRES_PASSWORD", Value: pgPassword}
	if password != nil {
		pw = corev1.EnvVar{Name: "POSTGRES_PASSWORD", ValueFrom: password}
	}
	return corev1.Container{
		Name:  "postgres",
		Image: image,
		Env: []corev1.EnvVar{
			pw,
			{Name: "PGDATA", Value: "/var/lib/postgresql/data/pgdata"},
			{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		},
		Ports:        []corev1.ContainerPort{{Name: "postgres", ContainerPort: 5432}},
		VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/var/lib/postgresql/data"}},
		// The kubelet's default 1 s timeout fails every exec probe on a
		// loaded machine (a docker exec of pg_isready took longer with two
		// suites and three busy loops on two cores), as a real node's would:
		// the Pod never turned Ready. 10 s is what charts commonly give one.
		ReadinessProbe: &corev1.Probe{ProbeHandler: probe, PeriodSeconds: 1, TimeoutSeconds: 10, FailureThreshold: 3},
	}
}

func claim(name string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
}

func simplePod(name, image string, command []string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr[int64](1),
			Containers:                    []corev1.Container{{Name: "main", Image: image, Command: command}},
		},
	}
}

func createPod(t *testing.T, cs kubernetes.Interface, ns string, pod *corev1.Pod) {
	t.Helper()
	mustCreate(t, func() error {
		_, err := cs.CoreV1().Pods(ns).Create(t.Context(), pod, metav1.CreateOptions{})
		return err
	})
}

func mustCreate(t *testing.T, f func() error) {
	t.Helper()
	if err := f(); err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitingReason(reason string) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		if len(p.Status.ContainerStatuses) == 0 {
			return false
		}
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == reason
	}
}

// waitPod watches the Pod until cond holds and returns it; after timeout
// the test fails with the Pod's last status.
func waitPod(t *testing.T, env *kubeenv.Env, ns, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	lw := cache.NewListWatchFromClient(env.Client.CoreV1().RESTClient(), "pods", ns, fields.OneTermEqualSelector("metadata.name", name))
	ev, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		return ok && ev.Type != watch.Deleted && cond(p), nil
	})
	if err != nil {
		p, gerr := env.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		status := fmt.Sprint(gerr)
		if gerr == nil {
			status = fmt.Sprintf("phase %s, conditions %+v, containers %+v", p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
		}
		t.Fatalf("pod %s/%s not %s within %v (%v); now: %s; logs in %s (kept with $%s set)", ns, name, what, timeout, err, status, env.Dir, kubeenv.KeepEnv)
	}
	return ev.Object.(*corev1.Pod)
}

// waitPodGone watches until the Pod with uid no longer exists.
func waitPodGone(t *testing.T, env *kubeenv.Env, ns, name string, uid any, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	lw := cache.NewListWatchFromClient(env.Client.CoreV1().RESTClient(), "pods", ns, fields.OneTermEqualSelector("metadata.name", name))
	gone := func(objs []any) bool {
		for _, o := range objs {
			if p, ok := o.(*corev1.Pod); ok && any(p.UID) == uid {
				return false
			}
		}
		return true
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, func(store cache.Store) (bool, error) {
		return gone(store.List()), nil
	}, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		return ok && ((ev.Type == watch.Deleted && any(p.UID) == uid) || (ev.Type != watch.Deleted && any(p.UID) != uid)), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s still there after %v: %v; logs in %s (kept with $%s set)", ns, name, timeout, err, env.Dir, kubeenv.KeepEnv)
	}
}

// scaleTo sets the StatefulSet's replicas through its scale subresource,
// again on a conflict (the controller updates the set's status meanwhile).
func scaleTo(t *testing.T, cs kubernetes.Interface, ns, name string, n int32) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sc, err := cs.AppsV1().StatefulSets(ns).GetScale(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		sc.Spec.Replicas = n
		_, err = cs.AppsV1().StatefulSets(ns).UpdateScale(t.Context(), name, sc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("scale %s to %d: %v", name, n, err)
	}
}

// query connects to the Pod's Postgres through a port-forward of its own,
// runs f, and closes both before returning.
func query(t *testing.T, env *kubeenv.Env, ns, pod string, f func(*pgx.Conn)) {
	t.Helper()
	addr, stop := startPortForward(t, env, ns, pod, 5432)
	defer stop()
	ctx := t.Context()
	// A TCP readiness probe passes while Postgres still answers 57P03
	// (starting up; under load for seconds): wait that out.
	var conn *pgx.Conn
	var err error
	for deadline := time.Now().Add(2 * time.Minute); ; {
		conn, err = pgx.Connect(ctx, fmt.Sprintf("postgres://postgres:%s@%s/postgres?sslmode=disable", pgPassword, addr))
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "57P03" || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("connect to %s through port-forward: %v", pod, err)
	}
	defer conn.Close(context.Background())
	f(conn)
}

// portForward forwards a local port to the Pod's port through the API
// server until the test ends, and returns the local address.
func portForward(t *testing.T, env *kubeenv.Env, ns, pod string, port int) string {
	t.Helper()
	addr, stop := startPortForward(t, env, ns, pod, port)
	t.Cleanup(stop)
	return addr
}

// startPortForward dials as kubectl port-forward does: WebSocket first,
// falling back to SPDY.
func startPortForward(t *testing.T, env *kubeenv.Env, ns, pod string, port int) (addr string, stop func()) {
	t.Helper()
	url := env.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(env.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	spdyDialer := spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	wsDialer, err := portforward.NewSPDYOverWebsocketDialerForStreaming(url, env.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	dialer := portforward.NewFallbackDialerForStreaming(wsDialer, spdyDialer, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	stopCh, readyCh := make(chan struct{}), make(chan struct{})
	pf, err := portforward.NewOnAddressesForStreaming(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, stopCh, readyCh, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- pf.ForwardPorts() }()
	select {
	case <-readyCh:
	case err := <-errc:
		t.Fatalf("port-forward to %s/%s: %v", ns, pod, err)
	case <-time.After(time.Minute):
		t.Fatalf("port-forward to %s/%s: not ready in a minute", ns, pod)
	}
	ports, err := pf.GetPorts()
	if err != nil || len(ports) != 1 {
		t.Fatalf("port-forward ports: %v %v", ports, err)
	}
	stopped := false
	return fmt.Sprintf("127.0.0.1:%d", ports[0].Local), func() {
		if !stopped {
			stopped = true
			close(stopCh)
			<-errc
		}
	}
}

// sslRequest sends Postgres's SSLRequest to addr and returns the one-byte
// answer ('N' without TLS).
func sslRequest(t *testing.T, addr string) byte {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	msg := make([]byte, 8)
	binary.BigEndian.PutUint32(msg[0:4], 8)
	binary.BigEndian.PutUint32(msg[4:8], 80877103)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read the answer to SSLRequest through port-forward: %v", err)
	}
	return b[0]
}
