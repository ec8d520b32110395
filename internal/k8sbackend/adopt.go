package k8sbackend

// Adoption: a workload pgwake did not create becomes a project when its
// owner annotates it with pgwake.dev/project. A StatefulSet or Deployment
// sleeps and wakes through its scale subresource (0 and 1 replicas); a
// CloudNativePG Cluster through CloudNativePG's declarative hibernation
// (the cnpg.io/hibernation annotation), with the operator doing the rest.
// pgwake never creates, changes the spec of or deletes an adopted object:
// it scales it, sets that one annotation, and `rm` only forgets it (drops
// the project annotation).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/state"
)

// Annotations a workload's owner sets to hand it to pgwake.
const (
	// AnnotationAdopt names the project the workload serves.
	AnnotationAdopt = "pgwake.dev/project"
	// AnnotationAdoptSecret names a Secret in the namespace holding the
	// server's password (key "password", or AnnotationAdoptSecretKey), and
	// optionally "username" and "dbname". Absent or "none": pass-through
	// auth, clients bring their own credentials and `pgwake url` shows
	// none.
	AnnotationAdoptSecret    = "pgwake.dev/secret"
	AnnotationAdoptSecretKey = "pgwake.dev/secret-key"
	// AnnotationAdoptUser and AnnotationAdoptDatabase are what pgwake's
	// readiness probe and `pgwake url` use (default postgres/postgres, and
	// app/app for a CloudNativePG Cluster, its bootstrap defaults).
	AnnotationAdoptUser     = "pgwake.dev/user"
	AnnotationAdoptDatabase = "pgwake.dev/database"
	// AnnotationAdoptPort is the Pod's Postgres port (default 5432).
	AnnotationAdoptPort = "pgwake.dev/port"
	// AnnotationAdoptSleepAfter overrides the sleep_after pgwake runs with.
	AnnotationAdoptSleepAfter = "pgwake.dev/sleep-after"

	// AnnotationHibernation is CloudNativePG's declarative hibernation.
	AnnotationHibernation = "cnpg.io/hibernation"
	conditionHibernation  = "cnpg.io/hibernation"
	cnpgClusterLabel      = "cnpg.io/cluster"
	cnpgRoleLabel         = "cnpg.io/instanceRole"
)

// Kinds of adopted objects, as `pgwake ls` names them.
const (
	kindStatefulSet = "statefulset"
	kindDeployment  = "deployment"
	kindCluster     = "cluster"
)

// clusterGVR is CloudNativePG's Cluster.
var clusterGVR = schema.GroupVersionResource{Group: "postgresql.cnpg.io", Version: "v1", Resource: "clusters"}

const adoptIndex = "pgwake-adopt"

// adoptIndexFunc indexes objects by the project they are adopted as.
// pgwake's own objects are never adopted, whatever their annotations.
func adoptIndexFunc(obj any) ([]string, error) {
	m, err := meta.Accessor(obj)
	if err != nil || m.GetLabels()[LabelManaged] == "true" {
		return nil, nil
	}
	if p := m.GetAnnotations()[AnnotationAdopt]; p != "" {
		return []string{p}, nil
	}
	return nil, nil
}

// adoption holds the caches of objects pgwake may adopt: every
// StatefulSet, Deployment, Pod and Service of the namespace (none of them
// carry pgwake's labels), and CloudNativePG Clusters once the CRD exists.
type adoption struct {
	sleepAfter time.Duration
	sets       cache.SharedIndexInformer
	deploys    cache.SharedIndexInformer
	setL       appslisters.StatefulSetNamespaceLister
	deployL    appslisters.DeploymentNamespaceLister
	pods       corelisters.PodNamespaceLister
	services   corelisters.ServiceNamespaceLister
	dyn        dynamic.Interface
	stop       context.CancelFunc

	recheck sync.WaitGroup // the look for the CRD, until it is served

	mu          sync.Mutex
	clusters    cache.SharedIndexInformer // nil until the CRD is served
	clusterInfs *informerSet              // runs clusters
	secrets     map[string]cachedSecret
	warned      map[string]bool
}

type cachedSecret struct {
	data map[string][]byte
	err  error
	at   time.Time
}

// secretTTL bounds how stale an adopted project's password may be.
const secretTTL = 30 * time.Second

// crdRecheck is how often pgwake looks for CloudNativePG's CRD when it is
// not installed yet.
const crdRecheck = 30 * time.Second

// startAdoption checks RBAC for what adoption reads, starts its informers
// and waits for their first list. A kind the Role does not grant is left
// out with a warning.
func (b *Backend) startAdoption(ctx context.Context, sleepAfter time.Duration) error {
	a := &adoption{sleepAfter: sleepAfter, secrets: map[string]cachedSecret{}, warned: map[string]bool{}}
	one := metav1.ListOptions{Limit: 1}
	for what, list := range map[string]func() error{
		"deployments": func() error { _, err := b.cs.AppsV1().Deployments(b.ns).List(ctx, one); return err },
		"services":    func() error { _, err := b.cs.CoreV1().Services(b.ns).List(ctx, one); return err },
	} {
		if err := list(); err != nil {
			if !apierrors.IsForbidden(err) {
				return b.apiErr(err, "list "+what+" (adoption)")
			}
			// A Role from before adoption: serve pgwake's own projects as
			// before, and say what is missing.
			b.log.Warn("adoption of annotated workloads is off: RBAC forbids listing "+what+"; grant the Role in deploy/kubernetes/base/role.yaml, or set kubernetes.adopt: false",
				"err", b.apiErr(err, "list "+what))
			return nil
		}
	}
	set := &informerSet{}
	a.sets = set.add("statefulsets", newInformer(b.cs.AppsV1().StatefulSets(b.ns), &appsv1.StatefulSet{}, nil))
	a.deploys = set.add("deployments", newInformer(b.cs.AppsV1().Deployments(b.ns), &appsv1.Deployment{}, nil))
	pods := set.add("pods", newInformer(b.cs.CoreV1().Pods(b.ns), &corev1.Pod{}, nil))
	svcs := set.add("services", newInformer(b.cs.CoreV1().Services(b.ns), &corev1.Service{}, nil))
	a.setL = appslisters.NewStatefulSetLister(a.sets.GetIndexer()).StatefulSets(b.ns)
	a.deployL = appslisters.NewDeploymentLister(a.deploys.GetIndexer()).Deployments(b.ns)
	a.pods = corelisters.NewPodLister(pods.GetIndexer()).Pods(b.ns)
	a.services = corelisters.NewServiceLister(svcs.GetIndexer()).Services(b.ns)
	for _, inf := range []cache.SharedIndexInformer{a.sets, a.deploys} {
		if err := inf.AddIndexers(cache.Indexers{adoptIndex: adoptIndexFunc}); err != nil {
			return err
		}
	}
	for _, inf := range []cache.SharedIndexInformer{a.sets, a.deploys, pods, svcs} {
		if _, err := inf.AddEventHandler(b.adoptHandler()); err != nil {
			return err
		}
	}
	b.adopt = a // before the handlers run
	stop, err := startInformers(ctx, set)
	if err != nil {
		return err
	}
	ictx, stopRecheck := context.WithCancel(context.Background())
	a.stop = func() { stopRecheck(); stop() }
	dyn, err := b.cs.dynamic()
	if err != nil {
		return fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	a.dyn = dyn
	if !b.watchClusters(ctx, ictx) {
		a.recheck.Go(func() {
			t := time.NewTicker(crdRecheck)
			defer t.Stop()
			for {
				select {
				case <-ictx.Done():
					return
				case <-t.C:
					if b.watchClusters(ictx, ictx) {
						return
					}
				}
			}
		})
	}
	return nil
}

// watchClusters starts the Cluster informer when CloudNativePG's CRD is
// served and the Role lets pgwake list Clusters; false to look again later.
// The informer runs until life ends (Close).
func (b *Backend) watchClusters(ctx, life context.Context) bool {
	a := b.adopt
	res, err := b.cs.serverResources(ctx, clusterGVR.GroupVersion())
	if err != nil {
		return false // not installed (NotFound), or discovery failed: later
	}
	served := false
	for _, r := range res.APIResources {
		served = served || r.Name == clusterGVR.Resource
	}
	if !served {
		return false
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := a.dyn.Resource(clusterGVR).Namespace(b.ns).List(lctx, metav1.ListOptions{Limit: 1}); err != nil {
		if apierrors.IsForbidden(err) {
			b.log.Warn("CloudNativePG Clusters are not adopted: RBAC forbids listing them (grant clusters in postgresql.cnpg.io: see the README's Kubernetes section)", "err", oneLine(err))
			return true
		}
		return false
	}
	set := &informerSet{}
	inf := set.add("clusters", newInformer(a.dyn.Resource(clusterGVR).Namespace(b.ns), &unstructured.Unstructured{}, nil))
	if err := inf.AddIndexers(cache.Indexers{adoptIndex: adoptIndexFunc}); err != nil {
		return true
	}
	if _, err := inf.AddEventHandler(b.adoptHandler()); err != nil {
		return true
	}
	if life.Err() != nil {
		return true // closed meanwhile
	}
	set.start(life)
	wctx, cancelWait := context.WithTimeout(ctx, 30*time.Second)
	defer cancelWait()
	if !cache.WaitForCacheSync(wctx.Done(), inf.HasSynced) {
		b.log.Warn("the CloudNativePG Cluster cache did not fill within 30s; Clusters appear once it does")
	}
	a.mu.Lock()
	a.clusters, a.clusterInfs = inf, set
	a.mu.Unlock()
	b.log.Info("adopting CloudNativePG Clusters annotated " + AnnotationAdopt)
	return true
}

func (a *adoption) clusterInformer() cache.SharedIndexInformer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.clusters
}

// stopAll ends adoption's informers and waits until they have stopped.
func (a *adoption) stopAll() {
	a.mu.Lock()
	stop := a.stop
	a.mu.Unlock()
	stop()
	a.recheck.Wait() // no Cluster informer starts after this
	a.mu.Lock()
	infs := a.clusterInfs
	a.mu.Unlock()
	if infs != nil {
		infs.wait()
	}
}

// adoptHandler tells waiters and watchers of the project an object
// belongs to that it changed.
func (b *Backend) adoptHandler() cache.ResourceEventHandler {
	changed := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if p := b.adoptedProjectOf(obj); p != "" {
			b.changed.notify(backend.Event{Project: p, State: b.adoptedCachedState(p)})
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: changed, UpdateFunc: func(_, obj any) { changed(obj) }, DeleteFunc: changed,
	}
}

// adoptedProjectOf is the adopted project obj (a workload, or a Pod or
// Service of one) belongs to, "" for none.
func (b *Backend) adoptedProjectOf(obj any) string {
	m, err := meta.Accessor(obj)
	if err != nil || m.GetLabels()[LabelManaged] == "true" {
		return ""
	}
	if p := m.GetAnnotations()[AnnotationAdopt]; p != "" {
		return p
	}
	a := b.adopt
	if c := m.GetLabels()[cnpgClusterLabel]; c != "" {
		if inf := a.clusterInformer(); inf != nil {
			if o, ok, _ := inf.GetIndexer().GetByKey(b.ns + "/" + c); ok {
				p, _ := adoptIndexFunc(o)
				if len(p) == 1 {
					return p[0]
				}
			}
		}
	}
	ref := metav1.GetControllerOfNoCopy(m)
	if ref == nil {
		return ""
	}
	switch ref.Kind {
	case "StatefulSet":
		if s, err := a.setL.Get(ref.Name); err == nil {
			p, _ := adoptIndexFunc(s)
			if len(p) == 1 {
				return p[0]
			}
		}
	case "ReplicaSet":
		// A Deployment's ReplicaSet is named DEPLOYMENT-HASH.
		if i := strings.LastIndexByte(ref.Name, '-'); i > 0 {
			if d, err := a.deployL.Get(ref.Name[:i]); err == nil {
				p, _ := adoptIndexFunc(d)
				if len(p) == 1 {
					return p[0]
				}
			}
		}
	}
	return ""
}

// adoptee is one adopted object as the caches hold it.
type adoptee struct {
	kind       string
	name       string
	uid        types.UID
	project    string
	ann        map[string]string
	created    time.Time
	replicas   int32           // StatefulSet, Deployment: spec.replicas
	selector   labels.Selector // Deployment: its Pods
	image      string
	hibernated bool // Cluster: its hibernation condition is True
}

func (a *adoptee) ref() string { return a.kind + "/" + a.name }

// asleep reports whether the object is asleep as pgwake puts it to sleep:
// no replicas, or hibernation on.
func (a *adoptee) asleep() bool {
	if a.kind == kindCluster {
		return a.ann[AnnotationHibernation] == "on"
	}
	return a.replicas == 0
}

func (a *adoptee) port() int {
	if p, err := strconv.Atoi(a.ann[AnnotationAdoptPort]); err == nil && p > 0 && p < 65536 {
		return p
	}
	return 5432
}

// adoptees returns the objects adopted as project.
func (b *Backend) adoptees(project string) []*adoptee {
	a := b.adopt
	if a == nil {
		return nil
	}
	var out []*adoptee
	if objs, err := a.sets.GetIndexer().ByIndex(adoptIndex, project); err == nil {
		for _, o := range objs {
			s := o.(*appsv1.StatefulSet)
			out = append(out, &adoptee{
				kind: kindStatefulSet, name: s.Name, uid: s.UID, project: project, ann: s.Annotations,
				created: s.CreationTimestamp.UTC(), replicas: ptr.Deref(s.Spec.Replicas, 1), image: firstImage(s.Spec.Template.Spec),
			})
		}
	}
	if objs, err := a.deploys.GetIndexer().ByIndex(adoptIndex, project); err == nil {
		for _, o := range objs {
			d := o.(*appsv1.Deployment)
			sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
			if err != nil {
				sel = labels.Nothing()
			}
			out = append(out, &adoptee{
				kind: kindDeployment, name: d.Name, uid: d.UID, project: project, ann: d.Annotations, selector: sel,
				created: d.CreationTimestamp.UTC(), replicas: ptr.Deref(d.Spec.Replicas, 1), image: firstImage(d.Spec.Template.Spec),
			})
		}
	}
	if inf := a.clusterInformer(); inf != nil {
		if objs, err := inf.GetIndexer().ByIndex(adoptIndex, project); err == nil {
			for _, o := range objs {
				u := o.(*unstructured.Unstructured)
				image, _, _ := unstructured.NestedString(u.Object, "spec", "imageName")
				out = append(out, &adoptee{
					kind: kindCluster, name: u.GetName(), uid: u.GetUID(), project: project, ann: u.GetAnnotations(),
					created: u.GetCreationTimestamp().UTC(), image: image, hibernated: hibernated(u),
				})
			}
		}
	}
	return out
}

func firstImage(spec corev1.PodSpec) string {
	if len(spec.Containers) == 0 {
		return ""
	}
	return spec.Containers[0].Image
}

// hibernated reports whether a Cluster's hibernation condition is True:
// CloudNativePG has deleted its Pods.
func hibernated(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == conditionHibernation {
			return m["status"] == string(metav1.ConditionTrue)
		}
	}
	return false
}

// errAdoptConflict is a project name claimed by several objects: pgwake
// serves none of them rather than guess.
var errAdoptConflict = errors.New("claimed by more than one object")

// adopted returns the object adopted as project, nil when there is none
// (or pgwake made a project of that name itself: its own wins).
func (b *Backend) adopted(project string) (*adoptee, error) {
	as := b.adoptees(project)
	switch {
	case len(as) == 0:
		return nil, nil
	case b.managedExists(project):
		return nil, nil
	case len(as) > 1:
		refs := make([]string, len(as))
		for i, a := range as {
			refs[i] = a.ref()
		}
		sort.Strings(refs)
		return nil, fmt.Errorf("project %q is %w (%s): pgwake serves none of them until only one carries %s", project, errAdoptConflict, strings.Join(refs, ", "), AnnotationAdopt)
	}
	return as[0], nil
}

// adoptedFor is adopted for a spec. A spec of an adopted project whose
// object is not (or no longer) seen is an error, never a reason to create
// pgwake's own server with empty data under its name.
func (b *Backend) adoptedFor(spec backend.Spec) (*adoptee, error) {
	ad, err := b.adopted(spec.Name)
	if err == nil && ad == nil && spec.Adopted != "" {
		return nil, fmt.Errorf("project %q was adopted from %s, which pgwake does not see now (its %s annotation removed, the object deleted, or the cache not filled yet): %w",
			spec.Name, spec.Adopted, AnnotationAdopt, backend.ErrNotFound)
	}
	return ad, err
}

func (b *Backend) managedExists(project string) bool {
	s, err := b.sets.Get(objectName(project))
	return err == nil && owned(s.Labels, project)
}

// adoptedRecords is every adopted project as the catalog lists it. An
// object that cannot be a project (a bad name, several objects claiming
// one) is named in the log, once.
func (b *Backend) adoptedRecords(ctx context.Context) []backend.Record {
	a := b.adopt
	if a == nil {
		return nil
	}
	names := map[string]bool{}
	infs := []cache.SharedIndexInformer{a.sets, a.deploys}
	if c := a.clusterInformer(); c != nil {
		infs = append(infs, c)
	}
	for _, inf := range infs {
		for _, n := range inf.GetIndexer().ListIndexFuncValues(adoptIndex) {
			names[n] = true
		}
	}
	var out []backend.Record
	for _, project := range sortedKeys(names) {
		ad, err := b.adopted(project)
		if err == nil && ad == nil {
			if len(b.adoptees(project)) == 0 {
				continue // gone since the index was read
			}
			err = fmt.Errorf("project %q exists already as pgwake's own: the annotated object is not adopted", project)
		}
		if err == nil {
			err = state.ValidateName(project)
		}
		if err == nil && ad.kind != kindCluster && ad.replicas > 1 {
			err = fmt.Errorf("%s has %d replicas: pgwake sleeps and wakes single-server workloads (0 and 1 replicas); for a replicated server use CloudNativePG", ad.ref(), ad.replicas)
		}
		if err != nil {
			b.warnOnce("adopt "+project+" "+err.Error(), "an annotated object is not served", "annotation", AnnotationAdopt, "err", err)
			continue
		}
		out = append(out, b.adoptedRecord(ctx, ad))
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (b *Backend) warnOnce(key, msg string, args ...any) {
	a := b.adopt
	a.mu.Lock()
	seen := a.warned[key]
	a.warned[key] = true
	a.mu.Unlock()
	if !seen {
		b.log.Warn(msg, args...)
	}
}

// adoptedRecord is an adopted object as a catalog record: credentials
// from its Secret when it names one, settings from its annotations.
func (b *Backend) adoptedRecord(ctx context.Context, ad *adoptee) backend.Record {
	user, db := "postgres", "postgres"
	if ad.kind == kindCluster {
		user, db = "app", "app"
	}
	var password string
	if name := ad.ann[AnnotationAdoptSecret]; name != "" && name != "none" {
		data, err := b.adoptSecret(ctx, name)
		key := ad.ann[AnnotationAdoptSecretKey]
		if key == "" {
			key = "password"
		}
		switch {
		case err != nil:
			b.warnOnce("secret "+ad.ref()+" "+err.Error(), "the adopted project's Secret cannot be read; it is served with pass-through auth", "project", ad.project, "secret", name, "err", err)
		case len(data[key]) == 0:
			b.warnOnce("secretkey "+ad.ref()+" "+name+"/"+key, "the adopted project's Secret has no such key; it is served with pass-through auth", "project", ad.project, "secret", name, "key", key)
		default:
			password = string(data[key])
			if u := string(data["username"]); u != "" {
				user = u
			}
			if d := string(data["dbname"]); d != "" {
				db = d
			}
		}
	}
	if u := ad.ann[AnnotationAdoptUser]; u != "" {
		user = u
	}
	if d := ad.ann[AnnotationAdoptDatabase]; d != "" {
		db = d
	}
	rec := backend.Record{
		Spec:       backend.Spec{Name: ad.project, Image: ad.image, User: user, Password: password, Database: db, Adopted: ad.ref()},
		SleepAfter: b.adopt.sleepAfter,
		SleepMode:  backend.SleepStop,
		Pinned:     ad.ann[AnnotationPinned] == "true",
		CreatedAt:  ad.created,
		Saved:      true,
		Adopted:    ad.ref(),
	}
	if v := ad.ann[AnnotationAdoptSleepAfter]; v != "" {
		if d, err := time.ParseDuration(v); err == nil && d >= 0 {
			rec.SleepAfter = d
		} else {
			b.warnOnce("sleepafter "+ad.ref()+" "+v, "the adopted project's sleep-after annotation is not a duration like 10m; pgwake's sleep_after applies", "project", ad.project, "value", v)
		}
	}
	return rec
}

// adoptSecret reads a Secret an adopted object names, at most secretTTL
// old. Not cached by an informer: pgwake reads only the Secrets it is
// pointed at, not every Secret of the namespace.
func (b *Backend) adoptSecret(ctx context.Context, name string) (map[string][]byte, error) {
	a := b.adopt
	a.mu.Lock()
	c, ok := a.secrets[name]
	a.mu.Unlock()
	if ok && time.Since(c.at) < secretTTL {
		return c.data, c.err
	}
	sec, err := b.cs.CoreV1().Secrets(b.ns).Get(ctx, name, metav1.GetOptions{})
	c = cachedSecret{at: time.Now()}
	if err != nil {
		c.err = b.apiErr(err, "read secret "+name)
	} else {
		c.data = sec.Data
	}
	a.mu.Lock()
	a.secrets[name] = c
	a.mu.Unlock()
	return c.data, c.err
}

// controls reports whether ad controls pod: its controller is ad (or, for
// a Deployment, one of ad's ReplicaSets), and for a Cluster the Pod is the
// one its -rw Service selects.
func (b *Backend) controls(ad *adoptee, pod *corev1.Pod) bool {
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil {
		return false
	}
	switch ad.kind {
	case kindStatefulSet:
		return ref.Kind == "StatefulSet" && ref.UID == ad.uid
	case kindDeployment:
		// The Deployment controller names its ReplicaSets
		// DEPLOYMENT-HASH and labels their Pods with HASH: a prefix alone
		// would match Deployment "app-db"'s Pods for Deployment "app".
		hash := pod.Labels[appsv1.DefaultDeploymentUniqueLabelKey]
		return ref.Kind == "ReplicaSet" && hash != "" && ref.Name == ad.name+"-"+hash && ad.selector.Matches(labels.Set(pod.Labels))
	case kindCluster:
		return ref.Kind == "Cluster" && ref.UID == ad.uid && b.rwSelector(ad).Matches(labels.Set(pod.Labels))
	}
	return false
}

// rwSelector is the selector of a Cluster's -rw Service: its primary.
// CloudNativePG names the Service CLUSTER-rw; pgwake dials the Pod behind
// it directly, so every connection is checked against that Pod's run.
func (b *Backend) rwSelector(ad *adoptee) labels.Selector {
	if svc, err := b.adopt.services.Get(ad.name + "-rw"); err == nil && len(svc.Spec.Selector) > 0 {
		return labels.SelectorFromSet(svc.Spec.Selector)
	}
	return labels.SelectorFromSet(labels.Set{cnpgClusterLabel: ad.name, cnpgRoleLabel: "primary"})
}

// adoptedPods lists the Pods ad controls, oldest first.
func (b *Backend) adoptedPods(ad *adoptee) []*corev1.Pod {
	var sel labels.Selector
	switch ad.kind {
	case kindStatefulSet:
		sel = labels.Everything()
		if p, err := b.adopt.pods.Get(ad.name + "-0"); err == nil && b.controls(ad, p) {
			return []*corev1.Pod{p}
		}
	case kindDeployment:
		sel = ad.selector
	case kindCluster:
		sel = labels.SelectorFromSet(labels.Set{cnpgClusterLabel: ad.name})
	}
	ps, _ := b.adopt.pods.List(sel)
	var out []*corev1.Pod
	for _, p := range ps {
		if ad.kind == kindCluster {
			if ref := metav1.GetControllerOfNoCopy(p); ref != nil && ref.UID == ad.uid {
				out = append(out, p) // every instance, for sleep to wait on
			}
		} else if b.controls(ad, p) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreationTimestamp.Before(&out[j].CreationTimestamp) })
	return out
}

// servingPod is the Pod that serves ad's project: the StatefulSet's
// ordinal 0, the Deployment's Ready Pod, the Cluster's primary. nil when
// there is none.
func (b *Backend) servingPod(ad *adoptee) *corev1.Pod {
	if ad.kind == kindStatefulSet {
		if p, err := b.adopt.pods.Get(ad.name + "-0"); err == nil && b.controls(ad, p) {
			return p
		}
		return nil
	}
	var best *corev1.Pod
	for _, p := range b.adoptedPods(ad) {
		if p.DeletionTimestamp != nil || !b.controls(ad, p) {
			continue
		}
		if best == nil || (podReady(p) && !podReady(best)) {
			best = p
		}
	}
	return best
}

// adoptedCachedState is an adopted project's state as the caches hold it.
func (b *Backend) adoptedCachedState(project string) backend.State {
	ad, err := b.adopted(project)
	if err != nil || ad == nil {
		return backend.StateMissing
	}
	pod := b.servingPod(ad)
	if ad.asleep() || pod == nil || pod.DeletionTimestamp != nil {
		return backend.StateStopped
	}
	if cs := postgresStatus(pod); cs == nil || cs.State.Running == nil || pod.Status.PodIP == "" {
		return backend.StateStopped
	}
	return backend.StateRunning
}

// statusAdopted is Status for an adopted project.
func (b *Backend) statusAdopted(ctx context.Context, ad *adoptee) (backend.Status, error) {
	pod := b.servingPod(ad)
	return b.podStatus(ctx, ad.project, pod, ad.asleep(), func(p *corev1.Pod) bool { return b.controls(ad, p) }, ad.port())
}

// startAdopted wakes an adopted project: scale to 1, or hibernation off,
// then wait for its Pod to be Ready. A wake that fails puts it back to
// sleep if pgwake woke it.
func (b *Backend) startAdopted(ctx context.Context, ad *adoptee) (ep backend.Endpoint, err error) {
	t := time.Now()
	woke, orig := false, *ad
	switch ad.kind {
	case kindStatefulSet, kindDeployment:
		if ad.replicas > 1 {
			return backend.Endpoint{}, fmt.Errorf("%s has %d replicas: pgwake wakes single-server workloads only", ad.ref(), ad.replicas)
		}
		if ad.replicas == 0 {
			if err := b.scaleAdopted(ctx, ad, 1); err != nil {
				return backend.Endpoint{}, err
			}
			woke = true
		}
	case kindCluster:
		if ad.ann[AnnotationHibernation] == "on" {
			if err := b.annotate(ctx, ad, map[string]any{AnnotationHibernation: "off"}); err != nil {
				return backend.Endpoint{}, err
			}
			woke = true
		}
	}
	defer func() {
		if err != nil && woke {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			// From what it was before the wake: the cache may not show the
			// wake yet, and a sleep would then think nothing is to undo.
			var serr error
			if orig.kind == kindCluster {
				serr = b.annotate(sctx, &orig, map[string]any{AnnotationHibernation: "on"})
			} else {
				serr = b.scaleAdopted(sctx, &orig, 0)
			}
			if serr != nil {
				b.log.Warn("putting an adopted project whose wake failed back to sleep", "project", ad.project, "err", serr)
			}
		}
	}()
	t = b.step(ad.project, "scale", t)
	return b.awaitReady(ctx, ad.project, ad.port(), false, t, func() (*corev1.Pod, string) {
		cur, err := b.adopted(ad.project)
		if err != nil || cur == nil {
			return nil, ""
		}
		ad = cur
		if ad.kind == kindCluster && ad.hibernated {
			return nil, "" // the operator has not rehydrated it yet
		}
		return b.servingPod(ad), ad.image
	}, func(pod *corev1.Pod, cause error) error {
		if pod == nil {
			return fmt.Errorf("%s has no Pod yet (kubectl describe %s %s): %w", ad.ref(), ad.kind, ad.name, cause)
		}
		return fmt.Errorf("pod %s of %s did not become Ready (%s): %w", pod.Name, ad.ref(), podPhase(pod), cause)
	})
}

// sleepAdopted puts an adopted project to sleep and, with wait, waits
// until its Pods are gone (and a Cluster's operator says it hibernated).
func (b *Backend) sleepAdopted(ctx context.Context, ad *adoptee, wait bool) error {
	switch ad.kind {
	case kindStatefulSet, kindDeployment:
		if ad.replicas > 1 {
			return fmt.Errorf("%s has %d replicas: pgwake sleeps single-server workloads only", ad.ref(), ad.replicas)
		}
		if ad.replicas != 0 {
			if err := b.scaleAdopted(ctx, ad, 0); err != nil {
				return err
			}
		}
	case kindCluster:
		if ad.ann[AnnotationHibernation] != "on" {
			if err := b.annotate(ctx, ad, map[string]any{AnnotationHibernation: "on"}); err != nil {
				return err
			}
		}
	}
	defer b.dropForward(ad.project)
	if !wait {
		return nil
	}
	for {
		changed := b.changed.wait()
		cur, err := b.adopted(ad.project)
		if err != nil {
			return err
		}
		if cur == nil {
			return nil // forgotten meanwhile
		}
		if len(b.adoptedPods(cur)) == 0 && (cur.kind != kindCluster || cur.hibernated) {
			return nil
		}
		select {
		case <-changed:
		case <-time.After(time.Second):
		case <-ctx.Done():
			if cur.kind == kindCluster && !cur.hibernated {
				return fmt.Errorf("%s: CloudNativePG has not reported it hibernated (condition %s; it hibernates only a healthy cluster): %w", cur.ref(), conditionHibernation, ctx.Err())
			}
			return fmt.Errorf("%s: its Pods are still terminating: %w", cur.ref(), ctx.Err())
		}
	}
}

// scaleAdopted sets a StatefulSet's or Deployment's replicas through its
// scale subresource.
func (b *Backend) scaleAdopted(ctx context.Context, ad *adoptee, replicas int32) error {
	if ad.kind == kindStatefulSet {
		return b.scale(ctx, ad.name, replicas)
	}
	scale := &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: ad.name, Namespace: b.ns},
		Spec:       autoscalingv1.ScaleSpec{Replicas: replicas},
	}
	if _, err := b.cs.AppsV1().Deployments(b.ns).UpdateScale(ctx, ad.name, scale, metav1.UpdateOptions{}); err != nil {
		return b.apiErr(err, fmt.Sprintf("scale deployment %s to %d", ad.name, replicas))
	}
	return nil
}

// annotate merge-patches annotations of an adopted object (a nil value
// removes one). It is the only change pgwake makes to one besides scale.
func (b *Backend) annotate(ctx context.Context, ad *adoptee, ann map[string]any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{}
	switch ad.kind {
	case kindStatefulSet:
		_, err = b.cs.AppsV1().StatefulSets(b.ns).Patch(ctx, ad.name, types.MergePatchType, patch, opts)
	case kindDeployment:
		_, err = b.cs.AppsV1().Deployments(b.ns).Patch(ctx, ad.name, types.MergePatchType, patch, opts)
	case kindCluster:
		_, err = b.adopt.dyn.Resource(clusterGVR).Namespace(b.ns).Patch(ctx, ad.name, types.MergePatchType, patch, opts)
	}
	if err != nil {
		return b.apiErr(err, "annotate "+ad.ref())
	}
	return nil
}

// forgetAdopted drops pgwake's annotations from an adopted object, which
// stays as it is (asleep or awake), and waits until the caches say so, so
// that no catalog read adopts it again.
func (b *Backend) forgetAdopted(ctx context.Context, ad *adoptee, volumes bool) error {
	if volumes {
		return fmt.Errorf("project %q is %s, which pgwake adopted and does not own: pgwake never deletes its data (`pgwake rm %s` without --volumes forgets it)", ad.project, ad.ref(), ad.project)
	}
	b.dropForward(ad.project)
	if b.peers != nil {
		b.peers.forget(ad.project)
	}
	if err := b.annotate(ctx, ad, map[string]any{AnnotationAdopt: nil, AnnotationPinned: nil}); err != nil {
		return err
	}
	left := "awake"
	if ad.asleep() {
		left = "asleep"
	}
	b.log.Info("adopted project forgotten; the object is left as it is", "project", ad.project, "object", ad.ref(), "state", left)
	for {
		changed := b.changed.wait()
		if len(b.adoptees(ad.project)) == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-time.After(time.Second):
		case <-ctx.Done():
			return fmt.Errorf("forget %s: %w", ad.ref(), ctx.Err())
		}
	}
}

// saveAdopted stores pin on the adopted object, where every pgwake reads
// it; the other settings are the owner's annotations.
func (b *Backend) saveAdopted(ctx context.Context, ad *adoptee, rec backend.Record) error {
	if (ad.ann[AnnotationPinned] == "true") == rec.Pinned {
		return nil
	}
	return b.annotate(ctx, ad, map[string]any{AnnotationPinned: strconv.FormatBool(rec.Pinned)})
}
