package kubeenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/klog/v2"
)

// Users of the API server's token file. Admin is in system:masters;
// Limited is authenticated and bound to nothing, so every request it makes
// beyond discovery is forbidden.
const (
	Admin   = "admin"
	Limited = "limited"
)

// StorageClass is the default StorageClass: the in-tree host-path
// provisioner, reclaimPolicy Delete, volumeBindingMode Immediate.
const StorageClass = "standard"

// KeepEnv names the environment variable that, set to anything, keeps the
// env's directory (logs of every process and of the node) after
// StopShared.
const KeepEnv = "PGWAKE_KUBEENV_KEEP"

// startTimeout bounds the whole start-up; it normally takes seconds.
const startTimeout = 3 * time.Minute

// Env is a running control plane with one simulated node. All fields are
// set by Shared and must not be changed.
type Env struct {
	// Client is an admin (system:masters) client of the API server.
	Client kubernetes.Interface
	// RESTConfig is the admin client's configuration, for clients of
	// other kinds (dynamic, port-forward). Copy it before changing it.
	RESTConfig *rest.Config
	// Kubeconfig is the path of an admin kubeconfig (token auth, the API
	// server's certificate inlined) that client-go's loading rules and
	// kubectl accept.
	Kubeconfig string
	// NodeName is the simulated node's name; the scheduler puts every Pod
	// there.
	NodeName string
	// Dir holds the env's logs: etcd.log, kube-apiserver.log,
	// kube-controller-manager.log, kube-scheduler.log and node.log (the
	// simulated kubelet, and klog's output: while the env runs, client-go's
	// log lines of the whole test process go there instead of stderr,
	// errors excepted). StopShared removes it unless $PGWAKE_KUBEENV_KEEP
	// is set.
	Dir string

	id      string
	tokens  map[string]string // user → token
	server  string
	caPEM   []byte
	docker  *client.Client
	network *podNetwork
	cp      *controlPlane
	node    *simNode
	logFile *os.File
	log     *slog.Logger
	klogSet bool
}

// shared is the one Env of a test process. This is deliberate package
// state: starting a control plane costs seconds, so every test of a
// package shares one, and TestMain stops it (StopShared).
var shared struct {
	mu      sync.Mutex
	started bool
	env     *Env
	err     error
}

// Shared returns the test process's Env, starting it on first use (the
// control plane and the node take a few seconds; every later call returns
// at once). Under -short the test is skipped. Missing control plane
// binaries, an unreachable Docker engine or a failed start fail the test,
// and every later call fails the same way without trying again.
//
// Call StopShared from TestMain after m.Run. Without it the control plane
// still dies with the test binary, but the node's containers and network
// stay until the next env starts on the machine.
func Shared(t testing.TB) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip("kubeenv: needs a Kubernetes control plane and Docker; skipped with -short")
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.started {
		shared.started = true
		begin := time.Now()
		var timings []timing
		shared.env, shared.err = start(&timings)
		if shared.err == nil {
			t.Logf("kubeenv: control plane and node %s up in %v (%s); logs in %s",
				shared.env.NodeName, time.Since(begin).Round(time.Millisecond), formatTimings(timings), shared.env.Dir)
		}
	}
	if shared.err != nil {
		t.Fatalf("kubeenv: %v", shared.err)
	}
	if err := shared.env.cp.failed(); err != nil {
		t.Fatalf("kubeenv: control plane died: %v", err)
	}
	return shared.env
}

// StopShared stops the Env Shared started, if any: the node, every Docker
// container and the network it created (removed by label, whatever state
// the tests left them in), the directories of the PVs the host-path
// provisioner made, the control plane processes, and the env's directory.
// Call it from TestMain after m.Run; problems are printed on stderr.
func StopShared() {
	shared.mu.Lock()
	e := shared.env
	shared.started, shared.env, shared.err = false, nil, nil
	shared.mu.Unlock()
	if e == nil {
		return
	}
	if err := e.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "kubeenv: stop: %v\n", err)
	}
}

// NewNamespace creates a namespace for one test, with its default
// ServiceAccount (the ServiceAccount admission plugin refuses Pods until it
// exists; the controller manager would make it a moment later), and deletes
// it when the test ends, waiting until its Pods are gone (containers
// stopped and removed). The namespace itself finishes terminating in the
// background, its PVCs and their PV directories with it (or at
// StopShared): the namespace controller takes 10 to 20 s more, which every
// test would otherwise wait.
func (e *Env) NewNamespace(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		GenerateName: namespacePrefix(t.Name()),
		Labels:       map[string]string{LabelEnv: e.id},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubeenv: create namespace: %v", err)
	}
	name := ns.Name
	t.Cleanup(func() { e.deleteNamespace(t, name) })
	_, err = e.Client.CoreV1().ServiceAccounts(name).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubeenv: create default service account in %s: %v", name, err)
	}
	return name
}

// podsGoneTimeout bounds the wait for a test namespace's Pods to go: they
// get their grace period (30 s by default) to stop.
const podsGoneTimeout = 2 * time.Minute

// deleteNamespace deletes a test's namespace and waits until its Pods are
// gone (their containers stopped and removed). It does not wait for the
// namespace itself: the namespace controller looks at a deleted namespace
// only 5 s later, and again only after half the longest grace period of
// its Pods (16 s by default) however soon they are gone, which would add
// 10 to 20 s to every test. It finishes in the background (PVCs, and with
// them their PVs' directories); StopShared removes what is left then.
func (e *Env) deleteNamespace(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podsGoneTimeout)
	defer cancel()
	core := e.Client.CoreV1()
	err := core.Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Errorf("kubeenv: delete namespace %s: %v", name, err)
		return
	}
	// The namespace is Terminating: nothing can create Pods in it any
	// more, so deleting them here, at once, is final.
	if err := core.Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Errorf("kubeenv: delete pods of namespace %s: %v", name, err)
		return
	}
	err = untilEmpty(ctx, cache.NewListWatchFromClient(core.RESTClient(), "pods", name, fields.Everything()), &corev1.Pod{})
	if err != nil {
		pods, _ := core.Pods(name).List(context.Background(), metav1.ListOptions{})
		var left []string
		if pods != nil {
			for _, p := range pods.Items {
				left = append(left, p.Name+" ("+string(p.Status.Phase)+")")
			}
		}
		t.Errorf("kubeenv: pods of namespace %s not gone %v after its deletion (%v; left: %v); logs in %s (kept with $%s set)",
			name, podsGoneTimeout, err, left, e.Dir, KeepEnv)
	}
}

// untilEmpty watches what lw lists until it is empty.
func untilEmpty(ctx context.Context, lw cache.ListerWatcher, obj runtime.Object) error {
	var store cache.Store
	_, err := watchtools.UntilWithSync(ctx, lw, obj, func(s cache.Store) (bool, error) {
		store = s
		return len(s.List()) == 0, nil
	}, func(ev watch.Event) (bool, error) {
		// The informer updates its store before passing the event on.
		return ev.Type == watch.Deleted && len(store.List()) == 0, nil
	})
	return err
}

// namespacePrefix makes a namespace generateName from a test name.
func namespacePrefix(testName string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(testName) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	s := strings.TrimPrefix(b.String(), "testintegration")
	s = strings.Trim(s, "-")
	if len(s) > 40 {
		s = strings.TrimRight(s[:40], "-")
	}
	if s == "" {
		s = "test"
	}
	return s + "-"
}

// KubeconfigFor writes a kubeconfig for user (Admin or Limited) into the
// test's temporary directory and returns its path.
func (e *Env) KubeconfigFor(t testing.TB, user string) string {
	t.Helper()
	token, ok := e.tokens[user]
	if !ok {
		t.Fatalf("kubeenv: no user %q (there are %q and %q)", user, Admin, Limited)
	}
	p := filepath.Join(t.TempDir(), user+".kubeconfig")
	if err := writeKubeconfig(p, e.server, e.caPEM, user, token); err != nil {
		t.Fatalf("kubeenv: %v", err)
	}
	return p
}

// start brings up everything: the control plane (retried if a port it
// was given was taken in between), then the node and the default
// StorageClass.
func start(timings *[]timing) (_ *Env, err error) {
	bins, err := findBinaries()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()

	begin := time.Now()
	docker, err := client.New(client.FromEnv)
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	if _, err := docker.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		_ = docker.Close()
		return nil, fmt.Errorf("docker engine not reachable (%v); the simulated node runs Pods on it", err)
	}
	*timings = append(*timings, timing{"docker", time.Since(begin)})

	e := &Env{id: randomHex(4), docker: docker}
	e.NodeName = "kubeenv-" + e.id
	defer func() {
		if err != nil {
			if stopErr := e.stop(); stopErr != nil {
				err = fmt.Errorf("%w (and cleaning up: %v)", err, stopErr)
			}
		}
	}()
	e.Dir, err = os.MkdirTemp("", "pgwake-kubeenv-"+e.id+"-")
	if err != nil {
		return nil, err
	}
	e.logFile, err = os.Create(filepath.Join(e.Dir, "node.log"))
	if err != nil {
		return nil, err
	}
	e.log = slog.New(slog.NewTextHandler(e.logFile, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if err := os.WriteFile(filepath.Join(e.Dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return nil, err
	}
	// client-go logs through klog, by default on stderr, where
	// virtual-kubelet's informers and kubelet API would interleave it with
	// test output. Only output settings, which take klog's lock: replacing
	// its logger (klog.SetLogger) races with goroutines already logging.
	// klog copies each line to the outputs of lower severities, so only
	// INFO's goes to the file; errors also still reach stderr (klog's
	// stderrthreshold).
	klog.SetOutputBySeverity("INFO", e.logFile)
	for _, sev := range []string{"WARNING", "ERROR", "FATAL"} {
		klog.SetOutputBySeverity(sev, io.Discard)
	}
	klog.LogToStderr(false)
	e.klogSet = true
	e.reapLeftovers(ctx)

	// Credentials and keys.
	e.tokens = map[string]string{Admin: randomHex(16), Limited: randomHex(16)}
	f := &controlPlaneFiles{
		dir:             e.Dir,
		adminToken:      e.tokens[Admin],
		tokenFile:       filepath.Join(e.Dir, "tokens.csv"),
		saKey:           filepath.Join(e.Dir, "sa.key"),
		saPub:           filepath.Join(e.Dir, "sa.pub"),
		adminKubeconfig: filepath.Join(e.Dir, "admin.kubeconfig"),
	}
	tokens := fmt.Sprintf("%s,%s,%s-uid,\"system:masters\"\n%s,%s,%s-uid\n",
		e.tokens[Admin], Admin, Admin, e.tokens[Limited], Limited, Limited)
	if err := writeFile(f.tokenFile, []byte(tokens)); err != nil {
		return nil, err
	}
	saPriv, saPub, err := serviceAccountKeys()
	if err != nil {
		return nil, err
	}
	if err := errors.Join(writeFile(f.saKey, saPriv), writeFile(f.saPub, saPub)); err != nil {
		return nil, err
	}
	f.certPEM, f.keyPEM, err = selfSigned("kube-apiserver", "127.0.0.1", "::1", "localhost",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "10.96.0.1")
	if err != nil {
		return nil, err
	}

	for attempt := 1; ; attempt++ {
		var ts []timing
		e.cp, err = startControlPlane(ctx, bins, f, &ts)
		*timings = append(*timings, ts...)
		if err == nil {
			break
		}
		if !isPortClash(err) || attempt == 3 {
			return nil, err
		}
		e.log.Warn("control plane port taken; starting again", "err", err)
	}
	e.server, e.caPEM = e.cp.server, f.certPEM
	e.Kubeconfig = f.adminKubeconfig

	e.RESTConfig = &rest.Config{
		Host:            e.server,
		BearerToken:     e.tokens[Admin],
		TLSClientConfig: rest.TLSClientConfig{CAData: f.certPEM},
		QPS:             100,
		Burst:           200,
		UserAgent:       "pgwake-kubeenv",
	}
	e.Client, err = kubernetes.NewForConfig(e.RESTConfig)
	if err != nil {
		return nil, err
	}

	begin = time.Now()
	labels := map[string]string{
		LabelEnv:  e.id,
		labelPID:  strconv.Itoa(os.Getpid()),
		labelHost: hostName(),
	}
	e.network, err = createNetwork(ctx, docker, "kubeenv-"+e.id, labels)
	if err != nil {
		return nil, err
	}
	nodeClient, err := kubernetes.NewForConfig(rest.CopyConfig(e.RESTConfig))
	if err != nil {
		return nil, err
	}
	e.node, err = startNode(ctx, nodeConfig{
		name: e.NodeName, envID: e.id, dir: e.Dir, labels: labels,
		kube: nodeClient, docker: docker, network: e.network, log: e.log,
	})
	if err != nil {
		return nil, err
	}
	*timings = append(*timings, timing{"node", time.Since(begin)})

	del := corev1.PersistentVolumeReclaimDelete
	immediate := storagev1.VolumeBindingImmediate
	_, err = e.Client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{
			Name:        StorageClass,
			Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"},
		},
		Provisioner:       "kubernetes.io/host-path",
		ReclaimPolicy:     &del,
		VolumeBindingMode: &immediate,
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create storage class: %w", err)
	}
	return e, nil
}

// stop undoes start, whatever part of it ran.
func (e *Env) stop() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// PV directories: those of PVs still in the API (read while it
	// answers) and any the node mounted that the PV controller has not
	// removed.
	var pvDirs []string
	if e.node != nil {
		e.node.stop()
		pvDirs = e.node.prov.mountedClaimDirs()
		if pvs, err := e.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{}); err == nil {
			for _, pv := range pvs.Items {
				if hp := pv.Spec.HostPath; hp != nil && strings.HasPrefix(hp.Path, hostPathPVDir) {
					pvDirs = append(pvDirs, hp.Path)
				}
			}
		} else {
			errs = append(errs, fmt.Errorf("list persistent volumes: %w", err))
		}
		if err := e.node.deleteFromAPI(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if e.docker != nil {
		if err := e.removeDocker(ctx, make(client.Filters).Add("label", LabelEnv+"="+e.id)); err != nil {
			errs = append(errs, err)
		}
		_ = e.docker.Close()
	}
	for _, d := range pvDirs {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	if e.cp != nil {
		e.cp.stop()
	}
	if e.klogSet {
		klog.LogToStderr(true)
	}
	if e.logFile != nil {
		_ = e.logFile.Close()
	}
	if e.Dir != "" && os.Getenv(KeepEnv) == "" {
		if err := os.RemoveAll(e.Dir); err != nil {
			errs = append(errs, err)
		}
	} else if e.Dir != "" {
		fmt.Fprintf(os.Stderr, "kubeenv: kept %s ($%s is set)\n", e.Dir, KeepEnv)
	}
	return errors.Join(errs...)
}

// removeDocker force-removes the containers and networks matching f.
func (e *Env) removeDocker(ctx context.Context, f client.Filters) error {
	var errs []error
	cs, err := e.docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		errs = append(errs, fmt.Errorf("list containers: %w", err))
	} else {
		for _, c := range cs.Items {
			if _, err := e.docker.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("remove container %s: %w", c.ID, err))
			}
		}
	}
	ns, err := e.docker.NetworkList(ctx, client.NetworkListOptions{Filters: f})
	if err != nil {
		errs = append(errs, fmt.Errorf("list networks: %w", err))
	} else {
		for _, n := range ns.Items {
			if _, err := e.docker.NetworkRemove(ctx, n.ID, client.NetworkRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("remove network %s: %w", n.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// ownerFile, in the env's directory, holds the test process's pid, for
// reapLeftovers.
const ownerFile = "owner-pid"

// reapLeftovers removes what envs on this machine left behind when their
// test process died before StopShared ran: the kernel killed their control
// planes, but Docker keeps containers and networks, and their directories
// and mounted PV directories stay. A dead env is found by the pid in its
// Docker objects' labels or in its directory's owner file.
func (e *Env) reapLeftovers(ctx context.Context) {
	gone := func(pid string) bool {
		n, err := strconv.Atoi(strings.TrimSpace(pid))
		return err != nil || n <= 0 || errors.Is(syscall.Kill(n, 0), syscall.ESRCH)
	}
	dead := map[string]bool{}
	f := make(client.Filters).Add("label", labelHost+"="+hostName())
	if cs, err := e.docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f}); err == nil {
		for _, c := range cs.Items {
			if id := c.Labels[LabelEnv]; id != "" && gone(c.Labels[labelPID]) {
				dead[id] = true
			}
		}
	}
	if ns, err := e.docker.NetworkList(ctx, client.NetworkListOptions{Filters: f}); err == nil {
		for _, n := range ns.Items {
			if id := n.Labels[LabelEnv]; id != "" && gone(n.Labels[labelPID]) {
				dead[id] = true
			}
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "pgwake-kubeenv-*-*"))
	for _, d := range dirs {
		id, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), "pgwake-kubeenv-"), "-")
		if pid, err := os.ReadFile(filepath.Join(d, ownerFile)); err == nil && id != e.id && gone(string(pid)) {
			dead[id] = true
		}
	}
	for id := range dead {
		e.log.Info("removing leftovers of a test process that died", "env", id)
		if err := e.removeDocker(ctx, make(client.Filters).Add("label", LabelEnv+"="+id)); err != nil {
			e.log.Warn("remove leftovers", "env", id, "err", err)
		}
		dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "pgwake-kubeenv-"+id+"-*"))
		for _, d := range dirs {
			if data, err := os.ReadFile(filepath.Join(d, claimDirsFile)); err == nil {
				for _, pv := range strings.Fields(string(data)) {
					if strings.HasPrefix(pv, hostPathPVDir) && !strings.Contains(pv, "..") {
						_ = os.RemoveAll(pv)
					}
				}
			}
			if err := os.RemoveAll(d); err != nil {
				e.log.Warn("remove leftovers", "dir", d, "err", err)
			}
		}
	}
}

func hostName() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return h
}
