package kubeenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"
	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// Labels on every Docker object the node creates. LabelEnv's value is the
// env's random id; StopShared removes everything carrying it.
const (
	LabelEnv       = "dev.pgwake.test.kubenode"
	labelPID       = LabelEnv + ".pid"  // the test process, for reaping after a crash
	labelHost      = LabelEnv + ".host" // its host name, so only this machine's leftovers are reaped
	labelPod       = LabelEnv + ".pod"  // namespace/name
	labelPodUID    = LabelEnv + ".uid"
	labelContainer = LabelEnv + ".container"
)

// The kubelet's crash-loop and image-pull back-off: 10 s, doubling, capped
// at 5 minutes, forgotten after twice the cap without a failure
// (k8s.io/kubernetes pkg/kubelet: backOffPeriod, MaxContainerBackOff).
const (
	initialBackoff = 10 * time.Second
	maxBackoff     = 300 * time.Second
)

// errPullHold is how long a failed pull shows ErrImagePull before
// ImagePullBackOff. The kubelet shows it until its pod worker's next sync,
// about 10 s later; 1 s keeps image tests short and is still long enough for
// the status to be written (virtual-kubelet keeps only the newest status of
// a Pod when several arrive before its worker runs).
const errPullHold = time.Second

// minGracePeriod is the kubelet's floor for a container's stop timeout
// (minimumGracePeriodInSeconds): a Pod deleted with a grace period of 0 still
// gets 2 s to stop.
const minGracePeriod = 2

// provider runs the node's Pods on the local Docker engine: one container
// per Pod container, on the env's bridge network at the Pod's IP. It
// implements virtual-kubelet's nodeutil.Provider and node.PodNotifier.
type provider struct {
	docker   *client.Client
	kube     kubernetes.Interface
	net      *podNetwork
	envID    string
	nodeName string
	dir      string // per-Pod directories (emptyDir, secret and configMap volumes)
	baseLbl  map[string]string
	log      *slog.Logger

	ctx      context.Context // the node's lifetime; cancelled at shutdown
	shutdown context.CancelFunc
	wg       sync.WaitGroup // every goroutine a Pod started

	mu        sync.Mutex
	pods      map[string]*podRun // by namespace/name
	notify    func(*corev1.Pod)
	claimDirs map[string]bool // provisioned PV directories mounted here
}

// claimDirsFile, in the env's directory, lists the provisioned PV
// directories the node has mounted, one a line, so that the next env can
// remove them if this test process dies before StopShared.
const claimDirsFile = "claim-dirs"

// recordClaimDir notes a provisioned PV directory the node mounts.
func (p *provider) recordClaimDir(dir string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.claimDirs[dir] {
		return
	}
	p.claimDirs[dir] = true
	f, err := os.OpenFile(filepath.Join(p.dir, claimDirsFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		p.log.Warn("record PV directory", "err", err)
		return
	}
	defer f.Close()
	if _, err := fmt.Fprintln(f, dir); err != nil {
		p.log.Warn("record PV directory", "err", err)
	}
}

// mountedClaimDirs returns the provisioned PV directories the node has
// mounted, for the env to remove at the end if the PV controller has not.
func (p *provider) mountedClaimDirs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	dirs := make([]string, 0, len(p.claimDirs))
	for d := range p.claimDirs {
		dirs = append(dirs, d)
	}
	return dirs
}

var (
	_ nodeutil.Provider = (*provider)(nil)
	_ node.PodNotifier  = (*provider)(nil)
)

func podKey(namespace, name string) string { return namespace + "/" + name }

func (p *provider) lookup(namespace, name string) *podRun {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods[podKey(namespace, name)]
}

// NotifyPods implements node.PodNotifier.
func (p *provider) NotifyPods(_ context.Context, f func(*corev1.Pod)) {
	p.mu.Lock()
	p.notify = f
	p.mu.Unlock()
}

// CreatePod implements node.PodLifecycleHandler: it records the Pod, gives
// it its IP and starts one goroutine per container that pulls, creates,
// starts, watches and restarts it. It does not wait for any of that.
func (p *provider) CreatePod(_ context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		return errors.New("node is shutting down")
	}
	if old := p.pods[key]; old != nil {
		if old.uid == pod.UID {
			return nil
		}
		// The same name with a new UID: the old Pod was removed from the
		// API before it had stopped here. Let it finish in the background.
		old.delete(nil)
	}
	r, err := p.newPodRun(pod)
	if err != nil {
		return err
	}
	p.pods[key] = r
	r.start()
	return nil
}

// UpdatePod implements node.PodLifecycleHandler. Only metadata changes
// are taken (labels, annotations, deletion fields); a changed image is not
// rolled out.
func (p *provider) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	r := p.lookup(pod.Namespace, pod.Name)
	if r == nil || r.uid != pod.UID {
		return errdefs.NotFoundf("pod %s/%s is not on this node", pod.Namespace, pod.Name)
	}
	r.mu.Lock()
	r.pod.ObjectMeta = *pod.ObjectMeta.DeepCopy()
	r.mu.Unlock()
	return nil
}

// DeletePod implements node.PodLifecycleHandler: it starts stopping the
// Pod's containers (each with its stop signal, then SIGKILL after the grace
// period) and returns. Once they have stopped, the Pod's terminal status is
// reported, its containers are removed, and the Pod is deleted from the
// API with a grace period of 0, as the kubelet's status manager does; that
// is what lets a StatefulSet controller go on.
func (p *provider) DeletePod(_ context.Context, pod *corev1.Pod) error {
	r := p.lookup(pod.Namespace, pod.Name)
	if r == nil || (pod.UID != "" && r.uid != pod.UID) {
		return errdefs.NotFoundf("pod %s/%s is not on this node", pod.Namespace, pod.Name)
	}
	if short := r.delete(pod); short {
		// virtual-kubelet force-deletes the Pod from the API once its
		// deletion grace period has passed after this call; below the
		// kubelet's 2 s floor that would be before the container has
		// stopped, and the PVC protection controller would then let its
		// volume go while the server still writes to it. Wait here instead.
		select {
		case <-r.done:
		case <-time.After(time.Duration(minGracePeriod)*time.Second + 30*time.Second):
		}
	}
	return nil
}

// GetPod implements node.PodLifecycleHandler.
func (p *provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	r := p.lookup(namespace, name)
	if r == nil {
		return nil, errdefs.NotFoundf("pod %s/%s is not on this node", namespace, name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.podLocked(), nil
}

// GetPodStatus implements node.PodLifecycleHandler.
func (p *provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods implements node.PodLifecycleHandler.
func (p *provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	runs := make([]*podRun, 0, len(p.pods))
	for _, r := range p.pods {
		runs = append(runs, r)
	}
	p.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(runs))
	for _, r := range runs {
		r.mu.Lock()
		pods = append(pods, r.podLocked())
		r.mu.Unlock()
	}
	return pods, nil
}

// GetContainerLogs implements nodeutil.Provider with `docker logs` of the
// container's current run (or of its last run while it waits to restart),
// or of the run before with opts.Previous.
func (p *provider) GetContainerLogs(ctx context.Context, namespace, podName, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	r := p.lookup(namespace, podName)
	if r == nil {
		return nil, errdefs.NotFoundf("pod %s/%s is not on this node", namespace, podName)
	}
	c := r.container(containerName)
	if c == nil {
		return nil, errdefs.InvalidInputf("container %q is not in pod %s/%s", containerName, namespace, podName)
	}
	r.mu.Lock()
	id, waiting := c.dockerID, c.state.Waiting
	if opts.Previous {
		id = c.prevID
	}
	r.mu.Unlock()
	if id == "" {
		if opts.Previous {
			return nil, errdefs.InvalidInputf("previous terminated container %q in pod %q not found", containerName, podName)
		}
		reason := "ContainerCreating"
		if waiting != nil {
			reason = waiting.Reason
		}
		return nil, errdefs.InvalidInputf("container %q in pod %q is waiting to start: %s", containerName, podName, reason)
	}
	lo := client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Follow: opts.Follow, Timestamps: opts.Timestamps}
	if opts.Tail > 0 {
		lo.Tail = strconv.Itoa(opts.Tail)
	}
	switch {
	case opts.SinceSeconds > 0:
		lo.Since = strconv.FormatInt(time.Now().Add(-time.Duration(opts.SinceSeconds)*time.Second).Unix(), 10)
	case !opts.SinceTime.IsZero():
		lo.Since = opts.SinceTime.Format(time.RFC3339Nano)
	}
	rc, err := p.docker.ContainerLogs(ctx, id, lo)
	if err != nil {
		return nil, fmt.Errorf("docker logs %s: %w", id, err)
	}
	// The engine multiplexes stdout and stderr (no TTY); the kubelet API
	// serves them as one stream.
	pr, pw := io.Pipe()
	go func() {
		_, err := stdcopy.StdCopy(pw, pw, rc)
		_ = pw.CloseWithError(err)
	}()
	var out io.Reader = pr
	if opts.LimitBytes > 0 {
		out = io.LimitReader(pr, int64(opts.LimitBytes))
	}
	return logStream{Reader: out, closers: []io.Closer{rc, pr}}, nil
}

type logStream struct {
	io.Reader
	closers []io.Closer
}

func (l logStream) Close() error {
	var errs []error
	for _, c := range l.closers {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// RunInContainer implements nodeutil.Provider (kubectl exec) with docker
// exec. A non-zero exit is returned as an error carrying the code, which
// the kubelet API passes on to the client.
func (p *provider) RunInContainer(ctx context.Context, namespace, podName, containerName string, cmd []string, attach api.AttachIO) error {
	id, err := p.runningContainer(namespace, podName, containerName)
	if err != nil {
		return err
	}
	ex, err := p.docker.ExecCreate(ctx, id, client.ExecCreateOptions{
		Cmd: cmd, TTY: attach.TTY(),
		AttachStdin: attach.Stdin() != nil, AttachStdout: attach.Stdout() != nil, AttachStderr: attach.Stderr() != nil,
	})
	if err != nil {
		return fmt.Errorf("docker exec in %s: %w", id, err)
	}
	hj, err := p.docker.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{TTY: attach.TTY()})
	if err != nil {
		return fmt.Errorf("docker exec attach: %w", err)
	}
	defer hj.Close()
	if attach.TTY() {
		go func() {
			for size := range attach.Resize() {
				_, _ = p.docker.ExecResize(ctx, ex.ID, client.ExecResizeOptions{Height: uint(size.Height), Width: uint(size.Width)})
			}
		}()
	}
	if in := attach.Stdin(); in != nil {
		go func() {
			_, _ = io.Copy(hj.Conn, in)
			_ = hj.CloseWrite()
		}()
	}
	stdout, stderr := io.Writer(io.Discard), io.Writer(io.Discard)
	if w := attach.Stdout(); w != nil {
		stdout = w
	}
	if w := attach.Stderr(); w != nil {
		stderr = w
	}
	if attach.TTY() {
		_, err = io.Copy(stdout, hj.Reader)
	} else {
		_, err = stdcopy.StdCopy(stdout, stderr, hj.Reader)
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("docker exec output: %w", err)
	}
	code, err := p.execExitCode(ctx, ex.ID)
	if err != nil {
		return err
	}
	if code != 0 {
		return exitError(code)
	}
	return nil
}

// execExitCode waits for an exec whose output has ended to be reported
// finished, and returns its exit code.
func (p *provider) execExitCode(ctx context.Context, execID string) (int, error) {
	for {
		res, err := p.docker.ExecInspect(ctx, execID, client.ExecInspectOptions{})
		if err != nil {
			return 0, fmt.Errorf("docker exec inspect: %w", err)
		}
		if !res.Running {
			return res.ExitCode, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// exitError is a command's non-zero exit; it satisfies k8s.io/utils/exec's
// ExitError, which the kubelet API's exec handler reports to the client.
type exitError int

func (e exitError) Error() string   { return "command terminated with exit code " + strconv.Itoa(int(e)) }
func (e exitError) String() string  { return e.Error() }
func (e exitError) Exited() bool    { return true }
func (e exitError) ExitStatus() int { return int(e) }

// AttachToContainer implements nodeutil.Provider; attaching is not
// supported.
func (p *provider) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return errors.New("kubeenv node: attach is not supported")
}

// GetStatsSummary implements nodeutil.Provider with an empty summary.
func (p *provider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return &statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{NodeName: p.nodeName}}, nil
}

// GetMetricsResource implements nodeutil.Provider; there are none.
func (p *provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, nil
}

// PortForward implements nodeutil.Provider: it dials the Pod's IP on port
// and copies both ways until either side closes (then closes both) or ctx
// ends.
func (p *provider) PortForward(ctx context.Context, namespace, podName string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	r := p.lookup(namespace, podName)
	if r == nil {
		return errdefs.NotFoundf("pod %s/%s is not on this node", namespace, podName)
	}
	addr := net.JoinHostPort(r.podIP().String(), strconv.Itoa(int(port)))
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("port-forward to pod %s/%s port %d: %w", namespace, podName, port, err)
	}
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			_ = conn.Close()
			_ = stream.Close()
		})
	}
	defer closeBoth()
	done := make(chan struct{}, 2)
	go func() { copyClientToPod(conn, stream); done <- struct{}{} }()
	go func() { copyPodToClient(stream, conn); done <- struct{}{} }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	closeBoth()
	<-done
	return nil
}

// copyClientToPod copies what the port-forward client sends to the Pod.
func copyClientToPod(pod net.Conn, client io.Reader) { _, _ = io.Copy(pod, client) }

// copyPodToClient copies what the Pod sends back to the client.
func copyPodToClient(client io.Writer, pod net.Conn) { _, _ = io.Copy(client, pod) }

// runningContainer returns the Docker id of a running container of a Pod.
func (p *provider) runningContainer(namespace, podName, containerName string) (string, error) {
	r := p.lookup(namespace, podName)
	if r == nil {
		return "", errdefs.NotFoundf("pod %s/%s is not on this node", namespace, podName)
	}
	c := r.container(containerName)
	if c == nil {
		return "", errdefs.InvalidInputf("container %q is not in pod %s/%s", containerName, namespace, podName)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.state.Running == nil || c.dockerID == "" {
		return "", errdefs.InvalidInputf("container %q in pod %s/%s is not running", containerName, namespace, podName)
	}
	return c.dockerID, nil
}

// stop ends every Pod's goroutines without stopping containers gracefully
// (the env removes them next) and waits for them, at most wait.
func (p *provider) stop(wait time.Duration) {
	p.shutdown()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
		p.log.Warn("pod goroutines still running at shutdown")
	}
}

// podRun is one Pod on the node.
type podRun struct {
	p      *provider
	key    string
	ns     string
	name   string
	uid    types.UID
	ips    []netip.Addr // one per container; the first is the Pod's IP
	dir    string       // the Pod's own directory under provider.dir
	log    *slog.Logger
	ctx    context.Context // cancelled when the Pod is deleted or the node stops
	cancel context.CancelFunc
	loops  sync.WaitGroup // the container goroutines
	done   chan struct{}  // closed once a deleted Pod is finished

	notifyMu sync.Mutex // orders status notifications

	mu         sync.Mutex
	pod        *corev1.Pod // as created; UpdatePod replaces its metadata
	startTime  metav1.Time
	containers []*ctrRun
	conds      map[corev1.PodConditionType]*corev1.PodCondition
	deleting   bool
	grace      int // stop timeout in seconds, set when deleting
	finished   bool
}

// ctrRun is one container of a Pod, across its restarts.
type ctrRun struct {
	spec     corev1.Container
	index    int
	state    corev1.ContainerState
	last     corev1.ContainerState
	lastExit *corev1.ContainerStateTerminated // how the newest finished run ended
	restarts int32
	ready    bool
	imageID  string
	dockerID string // current run, or the last one while waiting to restart
	prevID   string // the run before, for logs --previous
	attempt  int
}

func (p *provider) newPodRun(pod *corev1.Pod) (*podRun, error) {
	r := &podRun{
		p:         p,
		key:       podKey(pod.Namespace, pod.Name),
		ns:        pod.Namespace,
		name:      pod.Name,
		uid:       pod.UID,
		pod:       pod.DeepCopy(),
		startTime: metav1.Now(),
		log:       p.log.With("pod", podKey(pod.Namespace, pod.Name)),
		conds:     map[corev1.PodConditionType]*corev1.PodCondition{},
		done:      make(chan struct{}),
	}
	r.dir = filepath.Join(p.dir, "pods", string(pod.UID))
	for i, spec := range pod.Spec.Containers {
		ip, err := p.net.allocate()
		if err != nil {
			r.releaseIPs()
			return nil, err
		}
		r.ips = append(r.ips, ip)
		r.containers = append(r.containers, &ctrRun{
			spec:  spec,
			index: i,
			state: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
		})
	}
	r.ctx, r.cancel = context.WithCancel(p.ctx)
	return r, nil
}

func (r *podRun) podIP() netip.Addr {
	if len(r.ips) == 0 {
		return netip.Addr{}
	}
	return r.ips[0]
}

func (r *podRun) container(name string) *ctrRun {
	for _, c := range r.containers {
		if c.spec.Name == name {
			return c
		}
	}
	return nil
}

func (r *podRun) releaseIPs() {
	for _, ip := range r.ips {
		r.p.net.release(ip)
	}
}

// start runs the container goroutines.
func (r *podRun) start() {
	r.p.wg.Add(1 + len(r.containers))
	r.loops.Add(len(r.containers))
	go func() {
		defer r.p.wg.Done()
		r.notify()
	}()
	for _, c := range r.containers {
		go func() {
			defer r.p.wg.Done()
			defer r.loops.Done()
			r.runContainer(c)
		}()
	}
}

// delete stops the Pod (once; later calls do nothing) with the grace period
// pod asks for (nil: the spec's), then finishes it in the background. It
// reports whether that grace period is below the kubelet's floor.
func (r *podRun) delete(pod *corev1.Pod) (short bool) {
	r.mu.Lock()
	if r.deleting {
		r.mu.Unlock()
		return false
	}
	r.deleting = true
	if pod == nil {
		pod = r.pod
	}
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = *pod.Spec.TerminationGracePeriodSeconds
	}
	if pod.DeletionGracePeriodSeconds != nil {
		grace = *pod.DeletionGracePeriodSeconds
	}
	r.grace = max(int(grace), minGracePeriod)
	r.mu.Unlock()
	r.log.Info("deleting pod", "grace", grace)
	r.cancel()
	r.p.wg.Add(1)
	go func() {
		defer r.p.wg.Done()
		defer close(r.done)
		r.finishDelete()
	}()
	return grace < minGracePeriod
}

// finishDelete waits for the container goroutines (which stop their
// containers when the Pod's context ends), reports the terminal status,
// removes what the Pod had on this machine, forgets it and deletes it from
// the API.
func (r *podRun) finishDelete() {
	r.loops.Wait()
	if r.p.ctx.Err() != nil {
		return // the node is shutting down; the env removes everything
	}
	r.mu.Lock()
	r.finished = true
	r.mu.Unlock()
	r.notify()

	ctx, cancel := context.WithTimeout(r.p.ctx, time.Minute)
	defer cancel()
	if err := r.p.removeContainers(ctx, make(client.Filters).Add("label", labelPodUID+"="+string(r.uid))); err != nil {
		r.log.Warn("remove containers", "err", err)
	}
	if err := os.RemoveAll(r.dir); err != nil {
		r.log.Warn("remove pod directory", "err", err)
	}
	r.releaseIPs()
	r.p.mu.Lock()
	if r.p.pods[r.key] == r {
		delete(r.p.pods, r.key)
	}
	r.p.mu.Unlock()

	ns, name := r.ns, r.name
	uid := r.uid
	err := r.p.kube.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64),
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		r.log.Warn("delete pod from the API", "err", err)
	}
	r.log.Info("pod deleted")
}

// notify sends the Pod's current status to virtual-kubelet. Notifications
// are serialized, so the last one sent carries the newest state.
func (r *podRun) notify() {
	r.notifyMu.Lock()
	defer r.notifyMu.Unlock()
	r.mu.Lock()
	pod := r.podLocked()
	r.mu.Unlock()
	r.p.mu.Lock()
	f := r.p.notify
	r.p.mu.Unlock()
	if f != nil {
		f(pod)
	}
}

// update changes the Pod's state under its lock and notifies.
func (r *podRun) update(f func()) {
	r.mu.Lock()
	f()
	r.mu.Unlock()
	r.notify()
}

// removeContainers force-removes the containers matching f (and their
// anonymous volumes).
func (p *provider) removeContainers(ctx context.Context, f client.Filters) error {
	res, err := p.docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	var errs []error
	for _, c := range res.Items {
		if _, err := p.docker.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove container %s: %w", c.ID, err))
		}
	}
	return errors.Join(errs...)
}
