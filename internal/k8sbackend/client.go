package k8sbackend

// The API clients and informers the backend uses, built from client-go's
// own parts (gentype's generic typed client, tools/cache) over a scheme of
// only the API groups pgwake touches. client-go's generated clientset
// (k8s.io/client-go/kubernetes) would serve the same calls, but it and its
// informer factory import client-go's scheme, whose init registers every
// API group of Kubernetes in every pgwake process, the CLI's included and
// Kubernetes or not: 13 MB of binary, about 6 MiB of RSS and the largest
// init of the program (bench/README.md, "4. Memory"). The method names
// follow the clientset's, so the calls read the same.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"
)

var (
	apiScheme = runtime.NewScheme()
	// parameterCodec encodes options (ListOptions, PodLogOptions,
	// PodExecOptions) as query parameters.
	parameterCodec = runtime.NewParameterCodec(apiScheme)
	apiCodecs      = serializer.NewCodecFactory(apiScheme)
)

func init() {
	metav1.AddToGroupVersion(apiScheme, schema.GroupVersion{Version: "v1"})
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, autoscalingv1.AddToScheme, coordinationv1.AddToScheme,
	} {
		utilruntime.Must(add(apiScheme))
	}
}

// clientset is the subset of kubernetes.Clientset the backend calls.
type clientset struct {
	cfg   *rest.Config // with the shared rate limiter
	hc    *http.Client // the shared transport
	core  *coreV1
	apps  *appsV1
	coord *coordinationV1
}

func newClientset(cfg *rest.Config) (*clientset, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	// One rate limit for all groups, as the clientset has: cfg.QPS and
	// Burst bound pgwake's calls, not each group's.
	if cfg.RateLimiter == nil && cfg.QPS > 0 {
		if cfg.Burst <= 0 {
			return nil, errors.New("kubernetes client: a QPS limit needs a burst above 0")
		}
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	}
	// One transport for all groups, as the clientset shares one.
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	core, err := restClientFor(cfg, hc, corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, err
	}
	apps, err := restClientFor(cfg, hc, appsv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	coord, err := restClientFor(cfg, hc, coordinationv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	return &clientset{cfg: cfg, hc: hc, core: &coreV1{core}, apps: &appsV1{apps}, coord: &coordinationV1{coord}}, nil
}

// dynamic is a client of any resource (CloudNativePG's Clusters) on the
// groups' transport and under their rate limit.
func (c *clientset) dynamic() (*dynamic.DynamicClient, error) {
	return dynamic.NewForConfigAndClient(c.cfg, c.hc)
}

func restClientFor(cfg *rest.Config, hc *http.Client, gv schema.GroupVersion, apiPath string) (*rest.RESTClient, error) {
	c := *cfg
	c.GroupVersion = &gv
	c.APIPath = apiPath
	c.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(apiScheme, apiCodecs).WithoutConversion()
	return rest.RESTClientForConfigAndClient(&c, hc)
}

func (c *clientset) CoreV1() *coreV1                 { return c.core }
func (c *clientset) AppsV1() *appsV1                 { return c.apps }
func (c *clientset) CoordinationV1() *coordinationV1 { return c.coord }

// serverResources is discovery's ServerResourcesForGroupVersion: the
// resources the API server serves in gv (an error matching
// apierrors.IsNotFound when it serves none).
func (c *clientset) serverResources(ctx context.Context, gv schema.GroupVersion) (*metav1.APIResourceList, error) {
	// JSON asked for by name: a config preferring protobuf would get that.
	raw, err := c.core.rest.Get().AbsPath("/apis", gv.Group, gv.Version).SetHeader("Accept", "application/json").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	res := &metav1.APIResourceList{}
	if err := json.Unmarshal(raw, res); err != nil {
		return nil, err
	}
	return res, nil
}

// apiObject is gentype's constraint on a resource's type.
type apiObject interface {
	runtime.Object
	metav1.Object
}

// newTyped is a client of one resource in namespace ns.
func newTyped[T apiObject, L runtime.Object](c rest.Interface, resource, ns string, newObj func() T, newList func() L) *gentype.ClientWithList[T, L] {
	return gentype.NewClientWithList(resource, c, parameterCodec, ns, newObj, newList, gentype.PrefersProtobuf[T]())
}

type coreV1 struct{ rest *rest.RESTClient }

// RESTClient is for the subresources without a typed call (exec, portforward).
func (c *coreV1) RESTClient() rest.Interface { return c.rest }

func (c *coreV1) Namespaces() *gentype.Client[*corev1.Namespace] {
	return gentype.NewClient("namespaces", c.rest, parameterCodec, "", func() *corev1.Namespace { return &corev1.Namespace{} },
		gentype.PrefersProtobuf[*corev1.Namespace]())
}

func (c *coreV1) Pods(ns string) pods {
	return pods{newTyped(c.rest, "pods", ns, func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} })}
}

func (c *coreV1) Services(ns string) *gentype.ClientWithList[*corev1.Service, *corev1.ServiceList] {
	return newTyped(c.rest, "services", ns, func() *corev1.Service { return &corev1.Service{} }, func() *corev1.ServiceList { return &corev1.ServiceList{} })
}

func (c *coreV1) Secrets(ns string) *gentype.ClientWithList[*corev1.Secret, *corev1.SecretList] {
	return newTyped(c.rest, "secrets", ns, func() *corev1.Secret { return &corev1.Secret{} }, func() *corev1.SecretList { return &corev1.SecretList{} })
}

func (c *coreV1) PersistentVolumeClaims(ns string) *gentype.ClientWithList[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList] {
	return newTyped(c.rest, "persistentvolumeclaims", ns,
		func() *corev1.PersistentVolumeClaim { return &corev1.PersistentVolumeClaim{} },
		func() *corev1.PersistentVolumeClaimList { return &corev1.PersistentVolumeClaimList{} })
}

type pods struct {
	*gentype.ClientWithList[*corev1.Pod, *corev1.PodList]
}

// GetLogs is the request for a Pod's log (the clientset's GetLogs).
func (c pods) GetLogs(name string, opts *corev1.PodLogOptions) *rest.Request {
	return c.GetClient().Get().Namespace(c.GetNamespace()).Name(name).Resource("pods").SubResource("log").VersionedParams(opts, parameterCodec)
}

type appsV1 struct{ rest *rest.RESTClient }

func (c *appsV1) StatefulSets(ns string) scalable[*appsv1.StatefulSet, *appsv1.StatefulSetList] {
	return scalable[*appsv1.StatefulSet, *appsv1.StatefulSetList]{
		newTyped(c.rest, "statefulsets", ns, func() *appsv1.StatefulSet { return &appsv1.StatefulSet{} }, func() *appsv1.StatefulSetList { return &appsv1.StatefulSetList{} }),
		"statefulsets",
	}
}

func (c *appsV1) Deployments(ns string) scalable[*appsv1.Deployment, *appsv1.DeploymentList] {
	return scalable[*appsv1.Deployment, *appsv1.DeploymentList]{
		newTyped(c.rest, "deployments", ns, func() *appsv1.Deployment { return &appsv1.Deployment{} }, func() *appsv1.DeploymentList { return &appsv1.DeploymentList{} }),
		"deployments",
	}
}

// scalable is a client of a resource with the scale subresource.
type scalable[T apiObject, L runtime.Object] struct {
	*gentype.ClientWithList[T, L]
	resource string
}

// UpdateScale writes the scale subresource (the clientset's UpdateScale).
func (c scalable[T, L]) UpdateScale(ctx context.Context, name string, scale *autoscalingv1.Scale, opts metav1.UpdateOptions) (*autoscalingv1.Scale, error) {
	res := &autoscalingv1.Scale{}
	err := c.GetClient().Put().UseProtobufAsDefault().Namespace(c.GetNamespace()).Resource(c.resource).Name(name).
		SubResource("scale").VersionedParams(&opts, parameterCodec).Body(scale).Do(ctx).Into(res)
	return res, err
}

type coordinationV1 struct{ rest *rest.RESTClient }

func (c *coordinationV1) Leases(ns string) *gentype.ClientWithList[*coordinationv1.Lease, *coordinationv1.LeaseList] {
	return newTyped(c.rest, "leases", ns, func() *coordinationv1.Lease { return &coordinationv1.Lease{} }, func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} })
}

// listWatcher is what an informer needs of a typed or dynamic client.
type listWatcher[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// newInformer is a namespace-indexed informer of what c lists, each list
// and watch narrowed by tweak (nil: all), as the informer factories build
// them.
func newInformer[L runtime.Object](c listWatcher[L], obj runtime.Object, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	if tweak == nil {
		tweak = func(*metav1.ListOptions) {}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return c.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return c.Watch(ctx, o)
		},
	}
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, c), obj,
		cache.SharedIndexInformerOptions{Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}})
}

// informerSet runs informers together, as an informer factory does:
// start them, wait for their first lists, stop and wait for them to end.
type informerSet struct {
	names []string
	infs  []cache.SharedIndexInformer
	wg    sync.WaitGroup
}

func (s *informerSet) add(name string, inf cache.SharedIndexInformer) cache.SharedIndexInformer {
	s.names, s.infs = append(s.names, name), append(s.infs, inf)
	return inf
}

func (s *informerSet) start(ctx context.Context) {
	for _, inf := range s.infs {
		s.wg.Go(func() { inf.RunWithContext(ctx) })
	}
}

// waitForCacheSync is the name of the first informer whose first list did
// not finish before ctx ended, or "".
func (s *informerSet) waitForCacheSync(ctx context.Context) string {
	for i, inf := range s.infs {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return s.names[i]
		}
	}
	return ""
}

// wait returns once every informer has stopped (their context ended).
func (s *informerSet) wait() { s.wg.Wait() }
