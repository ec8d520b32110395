package k8sbackend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/pgwake/pgwake/internal/backend"
)

// broadcast tells waiters that some object of a project changed.
type broadcast struct {
	mu   sync.Mutex
	ch   chan struct{}
	subs map[chan<- backend.Event]struct{}
}

func newBroadcast() *broadcast {
	return &broadcast{ch: make(chan struct{}), subs: map[chan<- backend.Event]struct{}{}}
}

// wait returns a channel closed at the next notify.
func (c *broadcast) wait() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ch
}

func (c *broadcast) notify(ev backend.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.ch)
	c.ch = make(chan struct{})
	// Sent under the lock, which Watch takes to close a channel: never a
	// send on a closed one. The proxy calls Status on every event anyway;
	// a full buffer drops this one, and the next change covers it.
	for s := range c.subs {
		select {
		case s <- ev:
		default:
		}
	}
}

func labelsManaged() labels.Selector { return labels.SelectorFromSet(labels.Set{LabelManaged: "true"}) }

// cachedState is a project's state as the caches hold it, for events.
func (b *Backend) cachedState(project string) backend.State {
	set, err := b.sets.Get(objectName(project))
	if err != nil || !owned(set.Labels, project) {
		return backend.StateMissing
	}
	pod := b.pod(project)
	if pod == nil || pod.DeletionTimestamp != nil || ptr.Deref(set.Spec.Replicas, 0) == 0 {
		return backend.StateStopped
	}
	if cs := postgresStatus(pod); cs == nil || cs.State.Running == nil || pod.Status.PodIP == "" {
		return backend.StateStopped
	}
	return backend.StateRunning
}

// Status implements backend.Backend, from the informer caches: running
// once the Pod's postgres container runs and has an address to dial.
func (b *Backend) Status(ctx context.Context, spec backend.Spec) (backend.Status, error) {
	if ad, err := b.adoptedFor(spec); err != nil || ad != nil {
		if err != nil {
			return backend.Status{}, err
		}
		return b.statusAdopted(ctx, ad)
	}
	set, err := b.statefulSet(ctx, spec.Name)
	if err != nil {
		return backend.Status{}, err
	}
	if set == nil {
		return backend.Status{State: backend.StateMissing}, nil
	}
	return b.podStatus(ctx, spec.Name, b.pod(spec.Name), ptr.Deref(set.Spec.Replicas, 0) == 0,
		func(p *corev1.Pod) bool { return owned(p.Labels, spec.Name) }, 5432)
}

// podStatus is the state of the server in pod (nil: none), asleep when
// its workload is scaled to sleep. owns tells a Pod read afresh from the
// API is still the project's.
func (b *Backend) podStatus(ctx context.Context, project string, pod *corev1.Pod, asleep bool, owns func(*corev1.Pod) bool, port int) (backend.Status, error) {
	if pod == nil || pod.DeletionTimestamp != nil || asleep {
		st := backend.Status{State: backend.StateStopped}
		if pod != nil {
			st.Exit = exitReason(pod)
		}
		return st, nil
	}
	cs := postgresStatus(pod)
	if cs == nil || cs.State.Running == nil || pod.Status.PodIP == "" {
		return backend.Status{State: backend.StateStopped, Exit: exitReason(pod)}, nil
	}
	if b.dial == DialPodIP {
		// A Pod IP can go to another project's Pod once this one is gone,
		// and the cache may lag: the proxy's before-and-after check of
		// every connection needs the API's word, as Docker's inspect.
		live, err := b.cs.CoreV1().Pods(b.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return backend.Status{State: backend.StateStopped}, nil
		case err != nil:
			return backend.Status{}, b.apiErr(err, "read pod "+pod.Name)
		}
		if pod = live; pod.DeletionTimestamp != nil || !owns(pod) {
			return backend.Status{State: backend.StateStopped}, nil
		}
		if cs = postgresStatus(pod); cs == nil || cs.State.Running == nil || pod.Status.PodIP == "" {
			return backend.Status{State: backend.StateStopped, Exit: exitReason(pod)}, nil
		}
	}
	id := runID(pod, cs)
	addr, err := b.address(ctx, project, pod, id, port)
	if err != nil {
		return backend.Status{}, err
	}
	st := backend.Status{State: backend.StateRunning, Addr: addr, ID: id}
	if last := cs.LastTerminationState.Terminated; cs.RestartCount > 0 && last != nil {
		// The kubelet restarted it in place: say why the last run ended.
		st.Exit = "restarted by the kubelet after the last run " + terminated(last)
	}
	return st, nil
}

// terminated says how a container run ended.
func terminated(t *corev1.ContainerStateTerminated) string {
	r := fmt.Sprintf("exited with code %d", t.ExitCode)
	if t.Signal != 0 {
		r = fmt.Sprintf("was killed by signal %d", t.Signal)
	}
	if t.Reason != "" && t.Reason != "Error" && t.Reason != "Completed" {
		r += " (" + t.Reason + ")"
	}
	return r
}

// runID identifies one run of the server: the Pod (a new Pod has a new
// UID) and its container's restart count (a restart in place raises it).
// Not the container's start time: a kubelet may report it again, more
// precisely, in a later status update of the same run.
func runID(pod *corev1.Pod, cs *corev1.ContainerStatus) string {
	return fmt.Sprintf("%s#%d", pod.UID, cs.RestartCount)
}

// postgresStatus is the status of the Pod's Postgres container.
func postgresStatus(pod *corev1.Pod) *corev1.ContainerStatus {
	name := postgresContainer(pod)
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == name {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// postgresContainer names the Pod's Postgres container: "postgres" in
// pgwake's Pods and CloudNativePG's, "postgresql" in Bitnami's chart,
// else the first container (an adopted workload's own).
func postgresContainer(pod *corev1.Pod) string {
	for _, want := range []string{"postgres", "postgresql"} {
		for _, c := range pod.Spec.Containers {
			if c.Name == want {
				return want
			}
		}
	}
	if len(pod.Spec.Containers) > 0 {
		return pod.Spec.Containers[0].Name
	}
	return "postgres"
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// exitReason says why the Pod's server does not run, as the kubelet
// reports it, or "" when nothing went wrong (pending, stopping).
func exitReason(pod *corev1.Pod) string {
	cs := postgresStatus(pod)
	if cs == nil {
		return ""
	}
	last := cs.LastTerminationState.Terminated
	if t := cs.State.Terminated; t != nil {
		last = t
	}
	var parts []string
	if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
		parts = append(parts, w.Reason)
		if w.Message != "" {
			parts[0] += ": " + w.Message
		}
	}
	if last != nil && (cs.State.Waiting != nil || cs.State.Terminated != nil) {
		parts = append(parts, terminated(last))
	}
	return strings.Join(parts, "; ")
}

// failedStart is the Pod's state when its server cannot start without
// help: an image that cannot be pulled, a config that cannot be built, a
// crash loop. "" while it may still come up.
func failedStart(pod *corev1.Pod, image string) string {
	cs := postgresStatus(pod)
	if cs == nil {
		return ""
	}
	if w := cs.State.Waiting; w != nil {
		switch w.Reason {
		case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull":
			return fmt.Sprintf("image %q cannot be pulled (%s: %s); set the image key or --image to one the cluster can pull", image, w.Reason, w.Message)
		case "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
			return fmt.Sprintf("the kubelet cannot run the container (%s: %s)", w.Reason, w.Message)
		case "CrashLoopBackOff":
			return "crash loop: " + exitReason(pod)
		}
	}
	if cs.State.Terminated != nil || (cs.RestartCount > 0 && cs.State.Running == nil) {
		return exitReason(pod)
	}
	return ""
}

// Phase implements backend.Phaser: the Pod's phase and what it waits
// for, shown while a project wakes ("Pending: ContainerCreating").
func (b *Backend) Phase(ctx context.Context, spec backend.Spec) string {
	if ad, err := b.adoptedFor(spec); err != nil || ad != nil {
		if ad == nil {
			return ""
		}
		if pod := b.servingPod(ad); pod != nil {
			return podPhase(pod)
		}
		if ad.kind == kindCluster && ad.hibernated {
			return "hibernated"
		}
		return "no Pod yet"
	}
	pod := b.pod(spec.Name)
	if pod == nil {
		if set, _ := b.statefulSet(ctx, spec.Name); set != nil && ptr.Deref(set.Spec.Replicas, 0) > 0 {
			if msg := b.pvcPending(ctx, spec.Name); msg != "" {
				return "no Pod: " + msg
			}
			return "no Pod yet"
		}
		return ""
	}
	if pod.DeletionTimestamp == nil && pod.Status.Phase == corev1.PodPending && pod.Spec.NodeName == "" {
		// Unschedulable for want of a volume says less than the PVC.
		if msg := b.pvcPending(ctx, spec.Name); msg != "" {
			return string(pod.Status.Phase) + ": " + msg
		}
	}
	return podPhase(pod)
}

// podPhase is a Pod's phase and what it waits for.
func podPhase(pod *corev1.Pod) string {
	phase := string(pod.Status.Phase)
	if pod.DeletionTimestamp != nil {
		return "Terminating"
	}
	if cs := postgresStatus(pod); cs != nil && cs.State.Waiting != nil && cs.State.Waiting.Reason != "" {
		return phase + ": " + cs.State.Waiting.Reason
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue && c.Reason != "" {
			return phase + ": " + c.Reason
		}
	}
	if phase == string(corev1.PodRunning) && !podReady(pod) {
		return "Running: not Ready"
	}
	return phase
}

// pvcPending describes the project's PVC when it is not bound.
func (b *Backend) pvcPending(ctx context.Context, project string) string {
	return b.pvcPendingNamed(ctx, pvcName(project))
}

// WillInitialize implements backend.Initializer: a project without its
// PVC gets a new, empty volume, and its first start runs initdb.
func (b *Backend) WillInitialize(ctx context.Context, spec backend.Spec) bool {
	if ad, err := b.adoptedFor(spec); err != nil || ad != nil {
		return false // its data is its owner's, initialised or not
	}
	_, err := b.cs.CoreV1().PersistentVolumeClaims(b.ns).Get(ctx, pvcName(spec.Name), metav1.GetOptions{})
	return apierrors.IsNotFound(err)
}

// Start implements backend.Backend: it scales the StatefulSet to 1
// through the scale subresource and waits for the Pod's Ready condition,
// failing at once on what will not heal by waiting (an image that cannot
// be pulled, a crash loop). A PVC that stays unbound until ctx ends is
// named with its StorageClass.
func (b *Backend) Start(ctx context.Context, spec backend.Spec) (ep backend.Endpoint, err error) {
	if ad, err := b.adoptedFor(spec); err != nil || ad != nil {
		if err != nil {
			return backend.Endpoint{}, err
		}
		return b.startAdopted(ctx, ad)
	}
	set, err := b.statefulSet(ctx, spec.Name)
	if err != nil {
		return backend.Endpoint{}, err
	}
	if set == nil || drifted(set, spec) {
		if set, err = b.ensure(ctx, spec); err != nil {
			return backend.Endpoint{}, err
		}
	}
	first := b.WillInitialize(ctx, spec)
	t := time.Now()
	scaledUp := ptr.Deref(set.Spec.Replicas, 0) != 1
	defer func() {
		if err != nil && scaledUp {
			// A failed wake leaves the project asleep, not crash-looping
			// or pulling in the cluster: the next wake starts afresh. (A
			// server that ran before this call, maybe for another
			// pgwake's clients, is left as it was.)
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if serr := b.scale(sctx, set.Name, 0); serr != nil {
				b.log.Warn("scaling a project whose wake failed back to 0", "project", spec.Name, "err", serr)
			}
		}
	}()
	// A copy or restore of the data (any pgwake's, AnnotationHeldUntil)
	// is waited for, as a held project's clients wait. The scale is
	// conditional on the StatefulSet read: one held meanwhile is a
	// conflict, and read again.
	for scaledUp {
		if err := b.awaitUnheld(ctx, spec.Name, set); err != nil {
			return backend.Endpoint{}, err
		}
		err := b.scaleIf(ctx, set, 1)
		if err == nil {
			break
		}
		if !apierrors.IsConflict(err) {
			return backend.Endpoint{}, err
		}
		if set, err = b.cs.AppsV1().StatefulSets(b.ns).Get(ctx, set.Name, metav1.GetOptions{}); err != nil {
			return backend.Endpoint{}, b.apiErr(err, "read statefulset "+objectName(spec.Name))
		}
		scaledUp = ptr.Deref(set.Spec.Replicas, 0) != 1
	}
	t = b.step(spec.Name, "scale", t)
	image := set.Spec.Template.Spec.Containers[0].Image
	return b.awaitReady(ctx, spec.Name, 5432, first, t,
		func() (*corev1.Pod, string) { return b.pod(spec.Name), image },
		func(pod *corev1.Pod, cause error) error { return b.notReady(spec.Name, pod, cause) })
}

// awaitReady waits until the Pod find returns is Ready and returns where
// to dial it, failing at once on what will not heal by waiting (an image
// that cannot be pulled, a crash loop). find returns the Pod (nil: none
// yet) and the image it should run, for messages; notReady explains a
// wake that ran out of time.
func (b *Backend) awaitReady(ctx context.Context, project string, port int, first bool, t time.Time,
	find func() (*corev1.Pod, string), notReady func(*corev1.Pod, error) error) (backend.Endpoint, error) {
	for {
		changed := b.changed.wait()
		pod, image := find()
		if pod != nil && pod.DeletionTimestamp == nil {
			if msg := failedStart(pod, image); msg != "" {
				if tail := b.logTail(ctx, pod); tail != "" {
					msg += "; its log ends: " + tail
				}
				return backend.Endpoint{}, fmt.Errorf("pod %s: %s", pod.Name, msg)
			}
			if cs := postgresStatus(pod); podReady(pod) && cs != nil && cs.State.Running != nil && pod.Status.PodIP != "" {
				id := runID(pod, cs)
				t = b.step(project, "ready", t)
				addr, err := b.address(ctx, project, pod, id, port)
				if err != nil {
					return backend.Endpoint{}, err
				}
				b.step(project, "dial", t)
				return backend.Endpoint{Addr: addr, ID: id, First: first}, nil
			}
		}
		select {
		case <-changed:
		case <-time.After(time.Second):
			// Informers deliver every change; this only bounds how long a
			// missed one could hold a wake.
		case <-ctx.Done():
			return backend.Endpoint{}, notReady(pod, ctx.Err())
		}
	}
}

// scale sets the StatefulSet's replicas through the scale subresource.
func (b *Backend) scale(ctx context.Context, name string, replicas int32) error {
	return b.scaleAt(ctx, name, "", replicas)
}

// scaleIf scales set only if it is unchanged since it was read: the API
// server answers a conflict otherwise (its error wrapped).
func (b *Backend) scaleIf(ctx context.Context, set *appsv1.StatefulSet, replicas int32) error {
	return b.scaleAt(ctx, set.Name, set.ResourceVersion, replicas)
}

func (b *Backend) scaleAt(ctx context.Context, name, version string, replicas int32) error {
	scale := &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.ns, ResourceVersion: version},
		Spec:       autoscalingv1.ScaleSpec{Replicas: replicas},
	}
	if _, err := b.cs.AppsV1().StatefulSets(b.ns).UpdateScale(ctx, name, scale, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) {
			return fmt.Errorf("scale statefulset %s: %w", name, err)
		}
		return b.apiErr(err, fmt.Sprintf("scale statefulset %s to %d", name, replicas))
	}
	return nil
}

// logTailLines is how much of a failed server's log its error shows.
const logTailLines = 10

// logTail is the end of the Pod's postgres log, of the run that ended
// when the container is not running, joined on one line.
func (b *Backend) logTail(ctx context.Context, pod *corev1.Pod) string {
	cs := postgresStatus(pod)
	if cs == nil || (cs.RestartCount == 0 && cs.State.Terminated == nil && cs.State.Running == nil) {
		return "" // never ran: no log
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	read := func(previous bool) string {
		opts := &corev1.PodLogOptions{Container: postgresContainer(pod), TailLines: ptr.To[int64](logTailLines), Previous: previous}
		data, err := b.cs.CoreV1().Pods(b.ns).GetLogs(pod.Name, opts).DoRaw(ctx)
		if err != nil {
			return ""
		}
		var lines []string
		for _, l := range strings.Split(string(data), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				lines = append(lines, l)
			}
		}
		return strings.Join(lines, " | ")
	}
	// The status may lag the kubelet: a run it still shows terminated can
	// already be the previous one, the current one not having written a
	// line yet (seen under load). The other run's log is the next best.
	previous := cs.State.Running == nil && cs.State.Terminated == nil
	if tail := read(previous); tail != "" {
		return tail
	}
	return read(!previous)
}

// notReady explains a wake that ran out of time.
func (b *Backend) notReady(project string, pod *corev1.Pod, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if msg := b.pvcPending(ctx, project); msg != "" {
		return fmt.Errorf("%s for longer than the wake timeout: the cluster provides no volume (check the StorageClass exists and has a provisioner; kubectl describe pvc %s): %w", msg, pvcName(project), cause)
	}
	if pod == nil {
		return fmt.Errorf("pod %s was not created (kubectl describe statefulset %s): %w", podName(project), objectName(project), cause)
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue {
			return fmt.Errorf("pod %s is not scheduled (%s: %s): %w", pod.Name, c.Reason, c.Message, cause)
		}
	}
	return fmt.Errorf("pod %s did not become Ready (%s): %w", pod.Name, b.Phase(ctx, backend.Spec{Name: project}), cause)
}

// Sleep implements backend.Backend: scale to 0, then wait until the Pod
// is gone (the kubelet sends the image's stop signal, SIGINT for the
// official image: a fast shutdown). Pause is refused.
func (b *Backend) Sleep(ctx context.Context, spec backend.Spec, mode backend.SleepMode) error {
	if mode == backend.SleepPause {
		return errors.New("the kubernetes backend cannot pause a server (the Kubernetes API has no freezer); use sleep mode stop")
	}
	if ad, err := b.adoptedFor(spec); err != nil || ad != nil {
		if err != nil {
			return err
		}
		return b.sleepAdopted(ctx, ad, true)
	}
	set, err := b.statefulSet(ctx, spec.Name)
	if err != nil || set == nil {
		return err
	}
	if ptr.Deref(set.Spec.Replicas, 0) != 0 {
		if err := b.scale(ctx, set.Name, 0); err != nil {
			return err
		}
	}
	// The port-forward stays until the Pod is gone: sessions still
	// attached hear Postgres's own FATAL 57P01 through it.
	defer b.dropForward(spec.Name)
	return b.waitNoPods(ctx, spec.Name)
}

// waitNoPods waits until the project has no Pod left.
func (b *Backend) waitNoPods(ctx context.Context, project string) error {
	for {
		changed := b.changed.wait()
		if len(b.projectPods(project)) == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-time.After(time.Second):
		case <-ctx.Done():
			return fmt.Errorf("pod %s still terminating: %w", podName(project), ctx.Err())
		}
	}
}

// Remove implements backend.Backend. The StatefulSet goes (its Service
// with it, by owner reference). Without volumes the data stays: the
// Secret is detached and marked kept, so a project created again under
// the name takes its password, and the PVC stays. With volumes the PVC
// and the Secret go too.
func (b *Backend) Remove(ctx context.Context, spec backend.Spec, volumes bool) error {
	if ad, err := b.adoptedFor(spec); err != nil || ad != nil {
		if errors.Is(err, backend.ErrNotFound) {
			return nil // its object is gone already: nothing to forget
		}
		if err != nil {
			return err
		}
		return b.forgetAdopted(ctx, ad, volumes)
	}
	set, err := b.statefulSet(ctx, spec.Name)
	if err != nil {
		return err
	}
	name := objectName(spec.Name)
	b.dropForward(spec.Name)
	if b.peers != nil {
		b.peers.forget(spec.Name)
	}
	if !volumes && set != nil && ptr.Deref(set.Spec.Replicas, 0) > 0 {
		// Shut down cleanly before the StatefulSet goes: the data stays.
		if err := b.Sleep(ctx, spec, backend.SleepStop); err != nil {
			return err
		}
	}
	sec, err := b.cs.CoreV1().Secrets(b.ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		sec = nil
	case err != nil:
		return b.apiErr(err, "read secret "+name)
	case !owned(sec.Labels, spec.Name):
		sec = nil // somebody else's: left alone
	}
	if !volumes && sec != nil {
		upd := sec.DeepCopy()
		upd.Labels[LabelKept] = "true"
		upd.OwnerReferences = nil
		if _, err := b.cs.CoreV1().Secrets(b.ns).Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return b.apiErr(err, "keep secret "+name)
		}
	}
	if set != nil {
		err := b.cs.AppsV1().StatefulSets(b.ns).Delete(ctx, name, metav1.DeleteOptions{
			PropagationPolicy: ptr.To(metav1.DeletePropagationBackground),
		})
		if err != nil && !apierrors.IsNotFound(err) {
			return b.apiErr(err, "delete statefulset "+name)
		}
	}
	if !volumes {
		return nil
	}
	// Its copy helpers too: one a killed pgwake left holds its PVCs.
	helpers := labels.Set{LabelManaged: "true", LabelCopyOf: spec.Name}.String()
	if err := b.cs.CoreV1().Pods(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)},
		metav1.ListOptions{LabelSelector: helpers}); err != nil && !apierrors.IsNotFound(err) {
		return b.apiErr(err, "delete copy helper pods")
	}
	return b.removeData(ctx, labels.Set(b.labels(spec.Name)).String())
}

// removeData deletes pgwake's Pods, PVCs and Secrets matching selector:
// the data of removed projects.
func (b *Backend) removeData(ctx context.Context, selector string) error {
	opts := metav1.ListOptions{LabelSelector: selector}
	// Pods first, at once: the data is going anyway, and a PVC in use is
	// not deleted before its Pod is.
	if err := b.cs.CoreV1().Pods(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, opts); err != nil && !apierrors.IsNotFound(err) {
		return b.apiErr(err, "delete pods")
	}
	if err := b.cs.CoreV1().PersistentVolumeClaims(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, opts); err != nil && !apierrors.IsNotFound(err) {
		return b.apiErr(err, "delete persistentvolumeclaims")
	}
	if err := b.cs.CoreV1().Secrets(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, opts); err != nil && !apierrors.IsNotFound(err) {
		return b.apiErr(err, "delete secrets")
	}
	return nil
}

// RemoveAll implements backend.Sweeper: every project of the namespace
// with pgwake's labels goes, with its data when volumes is set. The
// namespace is the store that pgwakes share, so this is every pgwake's
// projects there; nothing without the labels is touched.
func (b *Backend) RemoveAll(ctx context.Context, volumes bool) error {
	sel := LabelManaged + "=true"
	sets, err := b.cs.AppsV1().StatefulSets(b.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return b.apiErr(err, "list statefulsets")
	}
	var errs []error
	for _, s := range sets.Items {
		if p := s.Labels[LabelProject]; p != "" {
			if err := b.Remove(ctx, backend.Spec{Name: p}, volumes); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if volumes {
		errs = append(errs, b.removeData(ctx, sel))
		// Services have no delete-collection verb.
		svcs, err := b.cs.CoreV1().Services(b.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			errs = append(errs, b.apiErr(err, "list services"))
		} else {
			for _, s := range svcs.Items {
				if err := b.cs.CoreV1().Services(b.ns).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					errs = append(errs, b.apiErr(err, "delete service "+s.Name))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Logs implements backend.Logger: the Pod's log through the API server.
// Without follow, a container the kubelet restarted shows the end of the
// run before too (where a crash loop's reason is: the current run may not
// have written anything yet), as `kubectl logs --previous` would, then
// the current run's.
func (b *Backend) Logs(ctx context.Context, spec backend.Spec, follow bool, tail int) (io.ReadCloser, error) {
	pod := b.pod(spec.Name)
	if ad, err := b.adoptedFor(spec); err != nil {
		return nil, err
	} else if ad != nil {
		pod = b.servingPod(ad)
	}
	if pod == nil {
		return nil, fmt.Errorf("project %q has no Pod (it sleeps; its log went with its Pod): %w", spec.Name, backend.ErrNotFound)
	}
	container := postgresContainer(pod)
	opts := func(previous bool) *corev1.PodLogOptions {
		o := &corev1.PodLogOptions{Container: container, Follow: follow && !previous, Previous: previous}
		if tail > 0 {
			o.TailLines = ptr.To(int64(tail))
		}
		return o
	}
	if cs := postgresStatus(pod); cs != nil && cs.RestartCount > 0 && !follow {
		prev, err := b.cs.CoreV1().Pods(b.ns).GetLogs(pod.Name, opts(true)).DoRaw(ctx)
		if err != nil {
			return nil, b.apiErr(err, "previous logs of pod "+pod.Name)
		}
		cur, _ := b.cs.CoreV1().Pods(b.ns).GetLogs(pod.Name, opts(false)).DoRaw(ctx) // none yet is fine
		lines := strings.SplitAfter(strings.TrimRight(string(prev), "\n")+"\n"+string(cur), "\n")
		if tail > 0 && len(lines) > tail {
			lines = lines[len(lines)-tail:]
		}
		return io.NopCloser(strings.NewReader(strings.Join(lines, ""))), nil
	}
	rc, err := b.cs.CoreV1().Pods(b.ns).GetLogs(pod.Name, opts(false)).Stream(ctx)
	if err != nil {
		return nil, b.apiErr(err, "logs of pod "+pod.Name)
	}
	return rc, nil
}

// Watch implements backend.Watcher: every change to a project's
// StatefulSet, Pod or Secret, from the informers, made by this pgwake,
// another one or by hand. The proxy asks Status for what it means. The
// channel closes when ctx ends.
func (b *Backend) Watch(ctx context.Context) <-chan backend.Event {
	out := make(chan backend.Event, 64)
	b.changed.mu.Lock()
	b.changed.subs[out] = struct{}{}
	b.changed.mu.Unlock()
	go func() {
		<-ctx.Done()
		b.changed.mu.Lock()
		delete(b.changed.subs, out)
		b.changed.mu.Unlock()
		close(out)
	}()
	return out
}

// address is where the proxy dials the Pod: its IP, or a port-forward
// kept open for this run of the server.
func (b *Backend) address(ctx context.Context, project string, pod *corev1.Pod, id string, port int) (string, error) {
	if b.dial == DialPodIP {
		return net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(port)), nil
	}
	return b.forwardFor(ctx, project, pod.Name, id, port)
}
