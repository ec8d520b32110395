// Package k8sbackend runs each project's Postgres as a StatefulSet (one
// replica at most) in a Kubernetes namespace, through client-go. The
// cluster is the project store: a project is its labelled StatefulSet,
// with a Secret holding its password, a headless Service and a PVC from
// the StatefulSet's volumeClaimTemplates, so every pgwake pointed at the
// namespace sees the same projects (backend.Catalog).
//
// Sleep and wake go through the scale subresource (0 and 1 replicas); a
// wake waits for the Pod's Ready condition and then hands the proxy an
// address: the Pod IP inside the cluster, or a port-forward through the
// API server (the path `kubectl port-forward` takes) from outside. State
// is read from informer caches, so Status, which the proxy calls for every
// client connection, costs no API round trip.
//
// Branches, snapshots and restores (backend.Brancher, branch.go) copy data
// in short-lived helper Pods of the project's image: a stopped server's
// PVC mounted read-only, or a base backup exec-ed in the running server's
// Pod and piped through pgwake. Snapshots are PVCs with the project's
// labels.
//
// The API calls go through client.go's small clientset of the four API
// groups pgwake uses, not client-go's generated one, whose scheme would
// register every API group at the start of every pgwake process.
package k8sbackend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/pgwake/pgwake/internal/backend"
)

// Labels and annotations on everything pgwake creates. Labels select
// (ownership, the project); annotations carry the project's settings so
// that every pgwake reading the namespace agrees on them.
const (
	LabelManaged = "dev.pgwake.managed"
	LabelProject = "dev.pgwake.project"
	// LabelKept marks a Secret whose project was removed with its data
	// kept: a project created again under the name takes its password.
	LabelKept = "dev.pgwake.kept"

	AnnotationUser       = "dev.pgwake.user"
	AnnotationDatabase   = "dev.pgwake.database"
	AnnotationSleepAfter = "dev.pgwake.sleep-after"
	AnnotationSleepMode  = "dev.pgwake.sleep-mode"
	AnnotationPinned     = "dev.pgwake.pinned"
	AnnotationCreatedAt  = "dev.pgwake.created-at"
	// AnnotationParent and AnnotationBranchedAt are a branch's source
	// project and when it was copied.
	AnnotationParent     = "dev.pgwake.parent"
	AnnotationBranchedAt = "dev.pgwake.branched-at"
	// AnnotationEphemeral names the pgwake instance whose `down` removes
	// the project: only the pgwake that created it as ephemeral.
	AnnotationEphemeral = "dev.pgwake.ephemeral-instance"
	// AnnotationSettings holds the project's server settings as JSON (the
	// desired ones: the Pod template's args get them at the next start).
	AnnotationSettings = "dev.pgwake.settings"
)

// Secret keys.
const (
	secretPassword = "password"
	secretUser     = "user"
	secretDatabase = "database"
)

// terminationGrace is how long the kubelet waits for Postgres's fast
// shutdown before it kills the container; a kill means crash recovery on
// the next start, so leave room for a large checkpoint (as the Docker
// backend's stop timeout).
const terminationGrace = 120

// Dial modes.
const (
	DialAuto        = "auto"
	DialPodIP       = "pod-ip"
	DialPortForward = "port-forward"
)

// Options configures a Backend.
type Options struct {
	// Kubeconfig, Context and Namespace override kubectl's loading rules
	// (KUBECONFIG, ~/.kube/config, in-cluster config).
	Kubeconfig string
	Context    string
	Namespace  string
	// StorageClass of new projects' volumes ("" is the cluster's default)
	// and their size.
	StorageClass string
	StorageSize  string
	// Dial is DialAuto (Pod IP inside the cluster, else port-forward),
	// DialPodIP or DialPortForward.
	Dial string
	// Instance is this pgwake's id: it marks the projects its `down`
	// removes as ephemeral. Projects themselves are the namespace's, not
	// an instance's.
	Instance string
	Logger   *slog.Logger
	// Peer names this process among the pgwake processes serving the
	// namespace (its peer Lease's holder); default the Pod's name inside
	// the cluster (POD_NAME, else the hostname), else hostname-instance.
	Peer string
	// LeaseDuration is how long this process's published use of the
	// projects counts after each renewal (renewed every third of it);
	// default DefaultLeaseDuration.
	LeaseDuration time.Duration
	// Adopt turns on adoption: StatefulSets, Deployments and
	// CloudNativePG Clusters of the namespace annotated pgwake.dev/project
	// become projects (adopt.go). AdoptSleepAfter is their sleep_after
	// unless they carry pgwake.dev/sleep-after.
	Adopt           bool
	AdoptSleepAfter time.Duration
	// Trace, if set, is told how long each step of a wake took: "scale"
	// (the scale call), "ready" (until the Pod was Ready) and "dial" (the
	// port-forward opened, or nothing for the Pod IP). They are logged at
	// debug level too.
	Trace func(project, step string, took time.Duration)

	// Config replaces the kubeconfig loading (tests pass their API
	// server's). Namespace must be set with it.
	Config *rest.Config
}

// Backend implements backend.Backend with StatefulSets.
type Backend struct {
	cs        *clientset
	cfg       *rest.Config
	ns        string
	dial      string
	dialWhy   string
	server    string // the API server's address, for errors
	storage   resource.Quantity
	class     string
	instance  string
	log       *slog.Logger
	trace     func(project, step string, took time.Duration)
	sets      appslisters.StatefulSetNamespaceLister
	pods      corelisters.PodNamespaceLister
	secrets   corelisters.SecretNamespaceLister
	stopInfo  context.CancelFunc
	changed   *broadcast
	forwardMu sync.Mutex
	forwards  map[string]*forward // by project
	opening   singleflight.Group  // one port-forward opening per project and run
	peers     *peers
	stopPeers context.CancelFunc
	adopt     *adoption // nil unless Options.Adopt
	closeOnce sync.Once
}

var (
	_ backend.Backend        = (*Backend)(nil)
	_ backend.Logger         = (*Backend)(nil)
	_ backend.Watcher        = (*Backend)(nil)
	_ backend.Sweeper        = (*Backend)(nil)
	_ backend.Checker        = (*Backend)(nil)
	_ backend.Initializer    = (*Backend)(nil)
	_ backend.PauseSupporter = (*Backend)(nil)
	_ backend.Catalog        = (*Backend)(nil)
	_ backend.Describer      = (*Backend)(nil)
	_ backend.Phaser         = (*Backend)(nil)
)

// ErrAPIUnreachable is returned when the API server does not answer. Such
// errors also match backend.ErrUnavailable.
var ErrAPIUnreachable = errors.New("kubernetes API server unreachable")

type unavailableError struct{ error }

func (e unavailableError) Unwrap() error { return e.error }
func (e unavailableError) Is(target error) bool {
	return target == backend.ErrUnavailable || target == ErrAPIUnreachable
}

// New connects to the cluster, checks that the API server answers and the
// namespace exists, and starts the informers Status reads from.
func New(ctx context.Context, opts Options) (*Backend, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Backend{
		cfg: opts.Config, ns: opts.Namespace, class: opts.StorageClass,
		instance: opts.Instance, log: log, forwards: map[string]*forward{}, changed: newBroadcast(), trace: opts.Trace,
	}
	inCluster := false
	if b.cfg == nil {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = opts.Kubeconfig
		overrides := &clientcmd.ConfigOverrides{CurrentContext: opts.Context}
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
		cfg, err := cc.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("kubeconfig: %w (set KUBECONFIG, --kubeconfig, or run inside a cluster)", err)
		}
		ns, _, err := cc.Namespace()
		if err != nil {
			return nil, fmt.Errorf("kubeconfig namespace: %w", err)
		}
		if b.ns == "" {
			b.ns = ns
		}
		// The deferred loader falls back to the in-cluster config only when
		// no kubeconfig is found; that is when pgwake runs in a pod.
		raw, _ := cc.RawConfig()
		inCluster = len(raw.Contexts) == 0 && os.Getenv("KUBERNETES_SERVICE_HOST") != ""
		cfg.UserAgent = "pgwake"
		// client-go's default (5/s) is shared by every call; the peer
		// Lease's renewal must not queue behind a burst of list calls.
		cfg.QPS, cfg.Burst = 50, 100
		b.cfg = cfg
	}
	cs, err := newClientset(b.cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	b.cs = cs
	if b.ns == "" {
		b.ns = metav1.NamespaceDefault
	}
	b.server = b.cfg.Host
	size := opts.StorageSize
	if size == "" {
		size = "1Gi"
	}
	q, err := resource.ParseQuantity(size)
	if err != nil {
		return nil, fmt.Errorf("storage size %q: %w", size, err)
	}
	b.storage = q
	switch opts.Dial {
	case DialPodIP:
		b.dial, b.dialWhy = DialPodIP, "dial: pod-ip"
	case DialPortForward:
		b.dial, b.dialWhy = DialPortForward, "dial: port-forward"
	case "", DialAuto:
		if inCluster {
			b.dial, b.dialWhy = DialPodIP, "auto: pgwake runs inside the cluster"
		} else {
			b.dial, b.dialWhy = DialPortForward, "auto: pgwake runs outside the cluster"
		}
	default:
		return nil, fmt.Errorf("dial %q is not auto, pod-ip or port-forward", opts.Dial)
	}

	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.Check(cctx); err != nil {
		return nil, err
	}
	if _, err := b.cs.CoreV1().Namespaces().Get(cctx, b.ns, metav1.GetOptions{}); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("kubernetes namespace %q does not exist (kubectl create namespace %s, or set --namespace)", b.ns, b.ns)
		case apierrors.IsForbidden(err):
			// A Role bound in the namespace alone cannot read namespaces;
			// the informers below tell whether pgwake can work there.
		default:
			return nil, b.apiErr(err, "read namespace "+b.ns)
		}
	}
	// What pgwake reads all the time, checked once here so that missing
	// RBAC is one clear line now rather than a cache that never fills.
	sel := metav1.ListOptions{LabelSelector: LabelManaged + "=true", Limit: 1}
	if _, err := b.cs.AppsV1().StatefulSets(b.ns).List(cctx, sel); err != nil {
		return nil, b.apiErr(err, "list statefulsets")
	}
	if _, err := b.cs.CoreV1().Pods(b.ns).List(cctx, sel); err != nil {
		return nil, b.apiErr(err, "list pods")
	}
	if _, err := b.cs.CoreV1().Secrets(b.ns).List(cctx, sel); err != nil {
		return nil, b.apiErr(err, "list secrets")
	}
	peersOK := true
	if _, err := b.cs.CoordinationV1().Leases(b.ns).List(cctx, metav1.ListOptions{LabelSelector: LabelRole + "=" + rolePeer, Limit: 1}); err != nil {
		if !apierrors.IsForbidden(err) {
			return nil, b.apiErr(err, "list leases (peer-aware idle)")
		}
		// A Role from before peer-aware idle: serve as before, and say
		// what that means.
		peersOK = false
		log.Warn("peer-aware idle is off: RBAC forbids leases; grant them (see the README's Kubernetes section), or several pgwakes on this namespace put projects to sleep under each other's clients",
			"err", b.apiErr(err, "list leases"))
	}
	if err := b.startInformers(ctx); err != nil {
		return nil, err
	}
	if opts.Adopt {
		if err := b.startAdoption(ctx, opts.AdoptSleepAfter); err != nil {
			b.stopInfo()
			if b.adopt != nil && b.adopt.stop != nil {
				b.adopt.stop()
			}
			return nil, err
		}
	}
	if peersOK {
		b.peers = newPeers(b, peerID(opts.Peer, opts.Instance, inCluster), opts.LeaseDuration)
		pctx, stopPeers := context.WithCancel(context.Background())
		b.stopPeers = stopPeers
		go b.peers.run(pctx)
	}
	id, lease := b.Peer()
	log.Info("kubernetes backend", "server", b.server, "namespace", b.ns, "dial", b.dial, "why", b.dialWhy,
		"peer", id, "lease", lease)
	return b, nil
}

// startInformers runs namespace-scoped informers for pgwake's
// StatefulSets, Pods and Secrets and waits for their first list.
func (b *Backend) startInformers(ctx context.Context) error {
	sel := LabelManaged + "=true"
	mine := func(o *metav1.ListOptions) { o.LabelSelector = sel }
	set := &informerSet{}
	sets := set.add("statefulsets", newInformer(b.cs.AppsV1().StatefulSets(b.ns), &appsv1.StatefulSet{}, mine))
	pods := set.add("pods", newInformer(b.cs.CoreV1().Pods(b.ns), &corev1.Pod{}, mine))
	secrets := set.add("secrets", newInformer(b.cs.CoreV1().Secrets(b.ns), &corev1.Secret{}, mine))
	b.sets = appslisters.NewStatefulSetLister(sets.GetIndexer()).StatefulSets(b.ns)
	b.pods = corelisters.NewPodLister(pods.GetIndexer()).Pods(b.ns)
	b.secrets = corelisters.NewSecretLister(secrets.GetIndexer()).Secrets(b.ns)
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { b.objectChanged(obj) },
		UpdateFunc: func(_, obj any) { b.objectChanged(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			b.objectChanged(obj)
		},
	}
	for _, inf := range []cache.SharedIndexInformer{sets, pods, secrets} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	stop, err := startInformers(ctx, set)
	b.stopInfo = stop
	return err
}

// startInformers starts a set of informers and waits up to 30 s for
// their first list; stop ends them. On an error they are ended already.
func startInformers(ctx context.Context, set *informerSet) (stop func(), err error) {
	ictx, cancel := context.WithCancel(context.Background())
	stop = func() { cancel(); set.wait() }
	set.start(ictx)
	wctx, cancelWait := context.WithTimeout(ctx, 30*time.Second)
	defer cancelWait()
	if name := set.waitForCacheSync(wctx); name != "" {
		stop()
		return stop, fmt.Errorf("kubernetes: the %s cache did not fill within 30s", name)
	}
	return stop, nil
}

// objectChanged wakes everyone waiting for a change (Start, Sleep, Watch).
func (b *Backend) objectChanged(obj any) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	if p := m.GetLabels()[LabelProject]; p != "" {
		b.changed.notify(backend.Event{Project: p, State: b.cachedState(p)})
	}
}

// step records how long one step of a wake took.
func (b *Backend) step(project, step string, since time.Time) time.Time {
	now := time.Now()
	took := now.Sub(since)
	b.log.Debug("wake step", "project", project, "step", step, "took", took)
	if b.trace != nil {
		b.trace(project, step, took)
	}
	return now
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "kubernetes" }

// Namespace is where the projects live.
func (b *Backend) Namespace() string { return b.ns }

// Describe implements backend.Describer: where the backend works and how
// it reaches servers, for `pgwake ls` and the API.
func (b *Backend) Describe() string {
	how := "Pod IP"
	if b.dial == DialPortForward {
		how = "port-forward through the API server"
	}
	return fmt.Sprintf("namespace %s on %s; dials %s (%s)", b.ns, b.server, how, b.dialWhy)
}

// Dial is how servers are reached: DialPodIP or DialPortForward.
func (b *Backend) Dial() string { return b.dial }

// SupportsPause implements backend.PauseSupporter: the Kubernetes API has
// no freezer.
func (b *Backend) SupportsPause() bool { return false }

// Close stops the informers and every port-forward.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() {
		b.forwardMu.Lock()
		for name, f := range b.forwards {
			f.close()
			delete(b.forwards, name)
		}
		b.forwardMu.Unlock()
		if b.stopPeers != nil {
			b.stopPeers()
			<-b.peers.done // its Lease deleted: peers need not wait for it to expire
		}
		if b.stopInfo != nil {
			b.stopInfo()
		}
		if b.adopt != nil {
			b.adopt.stopAll()
		}
	})
	return nil
}

// Check implements backend.Checker: the API server answers.
func (b *Backend) Check(ctx context.Context) error {
	if _, err := b.cs.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil {
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			// Answers, but not to us: report it as what it is.
			return b.apiErr(err, "check the API server")
		}
		return unavailableError{fmt.Errorf("%w at %s (is the cluster running? check --kubeconfig/--context): %v", ErrAPIUnreachable, b.server, oneLine(err))}
	}
	return nil
}

// apiErr turns an API error into one line a user can act on: RBAC
// refusals name the verb and resource, an unreachable server is
// backend.ErrUnavailable.
func (b *Backend) apiErr(err error, what string) error {
	var st apierrors.APIStatus
	switch {
	case err == nil:
		return nil
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: forbidden by RBAC in namespace %s: %s (grant it: see the README's Kubernetes section)", what, b.ns, oneLine(err))
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s: the API server at %s refused pgwake's credentials: %s", what, b.server, oneLine(err))
	case errors.As(err, &st):
		return fmt.Errorf("%s: %w", what, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w", what, err)
	}
	return unavailableError{fmt.Errorf("%s: %w at %s: %v", what, ErrAPIUnreachable, b.server, oneLine(err))}
}

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

// Object names: every object of a project is called pgwake-NAME; the Pod
// is its StatefulSet's ordinal 0 and the PVC the template's.
func objectName(project string) string { return "pgwake-" + project }
func podName(project string) string    { return objectName(project) + "-0" }
func pvcName(project string) string    { return "data-" + objectName(project) + "-0" }

// validName checks that a project name makes valid object names: project
// names may hold underscores, Kubernetes names may not.
func validName(project string) error {
	if strings.Contains(project, "_") {
		return fmt.Errorf("project name %q: Kubernetes object names cannot hold _ (use - instead)", project)
	}
	return nil
}

// owned reports whether labels mark an object as pgwake's for project.
func owned(l map[string]string, project string) bool {
	return l[LabelManaged] == "true" && l[LabelProject] == project
}

func notOwned(kind, name string) error {
	return fmt.Errorf("%w: %s %q exists without pgwake's labels (%s=true, %s); pgwake leaves it alone: remove or rename it, or choose another project name",
		backend.ErrNotOwned, kind, name, LabelManaged, LabelProject)
}

func (b *Backend) labels(project string) map[string]string {
	return map[string]string{LabelManaged: "true", LabelProject: project}
}

// statefulSet returns the project's StatefulSet, from the cache when it is
// there; nil when there is none. One with the name that is not pgwake's
// is ErrNotOwned.
func (b *Backend) statefulSet(ctx context.Context, project string) (*appsv1.StatefulSet, error) {
	if s, err := b.sets.Get(objectName(project)); err == nil && owned(s.Labels, project) {
		return s, nil
	}
	s, err := b.cs.AppsV1().StatefulSets(b.ns).Get(ctx, objectName(project), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, b.apiErr(err, "read statefulset "+objectName(project))
	case !owned(s.Labels, project):
		return nil, notOwned("statefulset", s.Name)
	}
	return s, nil
}

// pod returns the project's Pod from the cache, nil when there is none.
func (b *Backend) pod(project string) *corev1.Pod {
	p, err := b.pods.Get(podName(project))
	if err != nil || !owned(p.Labels, project) {
		return nil
	}
	return p
}

// projectPods lists the Pods of a project (normally one).
func (b *Backend) projectPods(project string) []*corev1.Pod {
	ps, _ := b.pods.List(labels.SelectorFromSet(b.labels(project)))
	return ps
}
