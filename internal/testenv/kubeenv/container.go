package kubeenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// runContainer is one container's life on the node, the kubelet's loop in
// small: make sure the image is there (else ErrImagePull, then
// ImagePullBackOff, retrying with back-off), create and start a Docker
// container, wait for it to exit, and restart it as the Pod's
// restartPolicy says, after the kubelet's crash-loop back-off
// (CrashLoopBackOff). Each run is a new Docker container, as each kubelet
// restart is a new CRI container; the one before is kept for logs
// --previous. When the Pod is deleted it stops the running container with
// the container's stop signal and the grace period, and returns.
func (r *podRun) runContainer(c *ctrRun) {
	var crash backoff
	for {
		imageID, ok := r.ensureImage(c)
		if !ok {
			return
		}
		id, err := r.createContainer(c, imageID)
		if err != nil {
			if r.ctx.Err() != nil {
				return
			}
			var notReady volumeNotReady
			if errors.As(err, &notReady) {
				// Still ContainerCreating, as the Pod is until its
				// volumes mount; checked again soon.
				r.log.Debug("volume not ready", "container", c.spec.Name, "err", err)
				if !sleepCtx(r.ctx, 200*time.Millisecond) {
					return
				}
				continue
			}
			r.log.Warn("create container", "container", c.spec.Name, "err", err)
			reason := "CreateContainerError"
			var cfgErr configError
			if errors.As(err, &cfgErr) {
				reason = "CreateContainerConfigError"
			}
			r.update(func() {
				c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: err.Error()}}
			})
			// The kubelet retries on its next sync of the Pod.
			if !sleepCtx(r.ctx, 2*time.Second) {
				return
			}
			continue
		}
		exit := r.runOnce(c, id)
		if exit == nil {
			return // the node is shutting down
		}
		if r.ctx.Err() != nil {
			// Deleted: record how it ended; finishDelete reports it.
			r.mu.Lock()
			c.state = corev1.ContainerState{Terminated: exit}
			c.ready = false
			r.mu.Unlock()
			return
		}
		restart := false
		switch r.pod.Spec.RestartPolicy {
		case corev1.RestartPolicyNever:
		case corev1.RestartPolicyOnFailure:
			restart = exit.ExitCode != 0
		default:
			restart = true
		}
		if !restart {
			r.update(func() { c.state = corev1.ContainerState{Terminated: exit}; c.ready = false })
			return
		}
		finished := exit.FinishedAt.Time
		wait, current := crash.delay(finished, time.Now())
		// As the kubelet reports it: the run that ended stays the state
		// (Terminated) until the next starts; in back-off the state is
		// Waiting and the run that ended moves to lastState. restartCount
		// counts the runs before the newest (see runOnce).
		r.update(func() {
			c.ready = false
			c.lastExit = exit
			if wait > 0 {
				c.last = corev1.ContainerState{Terminated: exit}
				c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
					Reason: "CrashLoopBackOff",
					Message: fmt.Sprintf("back-off %v restarting failed container=%s pod=%s_%s(%s)",
						current, c.spec.Name, r.name, r.ns, r.uid),
				}}
			} else {
				c.state = corev1.ContainerState{Terminated: exit}
			}
		})
		if wait > 0 {
			r.log.Info("crash loop back-off", "container", c.spec.Name, "wait", wait)
			if !sleepCtx(r.ctx, wait) {
				return
			}
		}
		crash.advance(finished)
	}
}

// runOnce starts the created container id and waits for it to end. It
// returns how it ended, or nil if the node is shutting down. If the Pod is
// deleted meanwhile it stops the container first.
func (r *podRun) runOnce(c *ctrRun, id string) *corev1.ContainerStateTerminated {
	docker, nodeCtx := r.p.docker, r.p.ctx
	if r.ctx.Err() != nil {
		_ = r.p.removeContainers(nodeCtx, make(client.Filters).Add("id", id))
		if nodeCtx.Err() != nil {
			return nil
		}
		return &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", ContainerID: "docker://" + id,
			StartedAt: metav1.Now(), FinishedAt: metav1.Now()}
	}
	if _, err := docker.ContainerStart(nodeCtx, id, client.ContainerStartOptions{}); err != nil {
		if nodeCtx.Err() != nil {
			return nil
		}
		// The kubelet reports a container that fails to start (a missing
		// executable, say) as terminated with the runtime's code and
		// reason StartError, and restarts it like any other.
		now := metav1.Now()
		return &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: err.Error(),
			ContainerID: "docker://" + id, StartedAt: now, FinishedAt: now}
	}
	started := metav1.Now()
	if info, err := docker.ContainerInspect(nodeCtx, id, client.ContainerInspectOptions{}); err == nil && info.Container.State != nil {
		if t, err := time.Parse(time.RFC3339Nano, info.Container.State.StartedAt); err == nil {
			started = metav1.NewTime(t)
		}
	}
	runCtx, stopProbe := context.WithCancel(r.ctx)
	defer stopProbe()
	r.update(func() {
		c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}
		c.ready = c.spec.ReadinessProbe == nil
		c.restarts = int32(c.attempt - 1)
		if c.lastExit != nil {
			c.last = corev1.ContainerState{Terminated: c.lastExit}
		}
	})
	r.log.Info("container running", "container", c.spec.Name, "id", shortID(id))
	if c.spec.ReadinessProbe != nil {
		r.p.wg.Add(1)
		go func() {
			defer r.p.wg.Done()
			r.probeReadiness(runCtx, c, id)
		}()
	}

	wait := docker.ContainerWait(nodeCtx, id, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	var waitErr error
	select {
	case <-wait.Result:
	case waitErr = <-wait.Error:
	case <-r.ctx.Done():
		if nodeCtx.Err() != nil {
			return nil
		}
		stopProbe()
		r.stopContainer(c, id)
		select {
		case <-wait.Result:
		case waitErr = <-wait.Error:
		}
	}
	stopProbe()
	if nodeCtx.Err() != nil {
		return nil
	}
	return r.exitState(id, started, waitErr)
}

// stopContainer stops a running container as the kubelet does for a
// deleted Pod: its preStop hook (exec, httpGet or sleep) if it has one,
// for at most the grace period, then the container's stop signal (the
// image's STOPSIGNAL, or the spec's lifecycle.stopSignal, else SIGTERM),
// then SIGKILL after what is left of the grace period (at least 2 s).
func (r *podRun) stopContainer(c *ctrRun, id string) {
	r.mu.Lock()
	grace := r.grace
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.p.ctx, time.Duration(grace)*time.Second+time.Minute)
	defer cancel()
	if lc := c.spec.Lifecycle; lc != nil && lc.PreStop != nil {
		begin := time.Now()
		h := lc.PreStop
		var err error
		if h.Sleep != nil {
			sleepCtx(ctx, min(time.Duration(h.Sleep.Seconds), time.Duration(grace))*time.Second)
		} else {
			err = r.probe(ctx, c, id, &corev1.ProbeHandler{Exec: h.Exec, HTTPGet: h.HTTPGet, TCPSocket: h.TCPSocket}, time.Duration(grace)*time.Second)
		}
		took := time.Since(begin)
		r.log.Info("preStop hook ran", "container", c.spec.Name, "took", took, "err", err)
		grace = max(grace-int(took.Seconds()), minGracePeriod)
	}
	r.log.Info("stopping container", "container", c.spec.Name, "id", shortID(id), "grace", grace)
	if _, err := r.p.docker.ContainerStop(ctx, id, client.ContainerStopOptions{Timeout: &grace}); err != nil && !cerrdefs.IsNotFound(err) {
		r.log.Warn("stop container", "id", shortID(id), "err", err)
	}
}

// exitState reads how a container that is no longer running ended.
func (r *podRun) exitState(id string, started metav1.Time, waitErr error) *corev1.ContainerStateTerminated {
	t := &corev1.ContainerStateTerminated{ContainerID: "docker://" + id, StartedAt: started, FinishedAt: metav1.Now()}
	info, err := r.p.docker.ContainerInspect(r.p.ctx, id, client.ContainerInspectOptions{})
	if err != nil || info.Container.State == nil {
		// Removed behind the node's back (docker rm -f): killed.
		t.ExitCode, t.Reason = 137, "Error"
		t.Message = fmt.Sprintf("container gone: %v", errors.Join(waitErr, err))
		return t
	}
	st := info.Container.State
	t.ExitCode = int32(st.ExitCode)
	if ft, err := time.Parse(time.RFC3339Nano, st.FinishedAt); err == nil && ft.Year() > 1 {
		t.FinishedAt = metav1.NewTime(ft)
	}
	switch {
	case st.OOMKilled:
		t.Reason = "OOMKilled"
	case st.ExitCode == 0:
		t.Reason = "Completed"
	default:
		t.Reason = "Error"
	}
	if st.Error != "" {
		t.Message = st.Error
	}
	return t
}

// ensureImage returns the image's ID once the engine has it. Missing, it
// is pulled (which fails without a registry): the container then waits
// with ErrImagePull, then ImagePullBackOff until the next attempt, as the
// kubelet reports it. It returns false when the Pod is deleted meanwhile.
// The engine's copy is used whatever the imagePullPolicy: the node never
// needs a registry for an image it has.
func (r *podRun) ensureImage(c *ctrRun) (string, bool) {
	var pull backoff
	for {
		if r.ctx.Err() != nil {
			return "", false
		}
		ref := c.spec.Image
		img, err := r.p.docker.ImageInspect(r.ctx, ref)
		if err == nil {
			return img.ID, true
		}
		if r.ctx.Err() != nil {
			return "", false
		}
		var msg, reason string
		if !cerrdefs.IsNotFound(err) {
			reason, msg = "ErrImagePull", fmt.Sprintf("failed to inspect image %q: %v", ref, err)
		} else if c.spec.ImagePullPolicy == corev1.PullNever {
			reason, msg = "ErrImageNeverPull", fmt.Sprintf("Container image %q is not present with pull policy of Never", ref)
		} else if err := r.pull(ref); err == nil {
			continue
		} else {
			reason, msg = "ErrImagePull", fmt.Sprintf("Failed to pull image %q: %v", ref, err)
		}
		if r.ctx.Err() != nil {
			return "", false
		}
		failed := time.Now()
		r.log.Info("image not available", "container", c.spec.Name, "reason", reason, "msg", msg)
		r.update(func() {
			c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
		})
		pull.advance(failed)
		if !sleepCtx(r.ctx, errPullHold) {
			return "", false
		}
		backoffReason := "ImagePullBackOff"
		if reason == "ErrImageNeverPull" {
			backoffReason = reason
		}
		r.update(func() {
			c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
				Reason:  backoffReason,
				Message: fmt.Sprintf("Back-off pulling image %q: %s: %s", ref, reason, msg),
			}}
		})
		if !sleepCtx(r.ctx, time.Until(failed.Add(pull.d))) {
			return "", false
		}
	}
}

// pull asks the engine to pull ref, for at most 2 minutes.
func (r *podRun) pull(ref string) error {
	ctx, cancel := context.WithTimeout(r.ctx, 2*time.Minute)
	defer cancel()
	resp, err := r.p.docker.ImagePull(ctx, ref, client.ImagePullOptions{})
	if err != nil {
		return err
	}
	defer resp.Close()
	return resp.Wait(ctx)
}

// configError is a container that cannot be configured yet (a missing
// Secret, an unbound claim): the kubelet's CreateContainerConfigError.
type configError struct{ error }

func (e configError) Unwrap() error { return e.error }

// createContainer creates the Docker container for c's next run and
// returns its id. The run before the last is removed (the last stays for
// logs --previous).
func (r *podRun) createContainer(c *ctrRun, imageID string) (string, error) {
	ctx := r.ctx
	env, vars, err := r.resolveEnv(ctx, c.spec)
	if err != nil {
		return "", configError{err}
	}
	mounts, err := r.mounts(ctx, c.spec)
	if err != nil {
		return "", configError{err}
	}
	cfg := &container.Config{
		Image:      c.spec.Image,
		Hostname:   hostname(r.pod.Spec.Hostname, r.name),
		Env:        env,
		Entrypoint: expandAll(c.spec.Command, vars),
		Cmd:        expandAll(c.spec.Args, vars),
		WorkingDir: c.spec.WorkingDir,
		Tty:        c.spec.TTY,
		OpenStdin:  c.spec.Stdin,
		StdinOnce:  c.spec.StdinOnce,
		User:       runAsUser(r.pod, c.spec),
		Labels:     r.labels(c),
	}
	if lc := c.spec.Lifecycle; lc != nil && lc.StopSignal != nil {
		cfg.StopSignal = string(*lc.StopSignal)
	}
	hc := &container.HostConfig{
		NetworkMode: container.NetworkMode(r.p.net.name),
		Mounts:      mounts,
	}
	if sc := c.spec.SecurityContext; sc != nil {
		if sc.Privileged != nil {
			hc.Privileged = *sc.Privileged
		}
		if sc.Capabilities != nil {
			for _, cp := range sc.Capabilities.Add {
				hc.CapAdd = append(hc.CapAdd, string(cp))
			}
			for _, cp := range sc.Capabilities.Drop {
				hc.CapDrop = append(hc.CapDrop, string(cp))
			}
		}
		if sc.ReadOnlyRootFilesystem != nil {
			hc.ReadonlyRootfs = *sc.ReadOnlyRootFilesystem
		}
	}
	r.mu.Lock()
	c.attempt++
	name := fmt.Sprintf("kubeenv-%s_%s_%s_%s_%s_%d", r.p.envID, r.ns, r.name, c.spec.Name, shortUID(r.uid), c.attempt)
	ip := r.ips[c.index]
	stale := c.prevID
	r.mu.Unlock()
	if stale != "" {
		_ = r.p.removeContainers(r.p.ctx, make(client.Filters).Add("id", stale))
	}
	res, err := r.p.docker.ContainerCreate(r.p.ctx, client.ContainerCreateOptions{
		Name:       name,
		Config:     cfg,
		HostConfig: hc,
		NetworkingConfig: &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
			r.p.net.name: {IPAMConfig: &network.EndpointIPAMConfig{IPv4Address: ip}},
		}},
	})
	if err != nil {
		return "", fmt.Errorf("create container %s: %w", name, err)
	}
	r.mu.Lock()
	c.prevID, c.dockerID, c.imageID = c.dockerID, res.ID, imageID
	r.mu.Unlock()
	return res.ID, nil
}

func (r *podRun) labels(c *ctrRun) map[string]string {
	l := make(map[string]string, len(r.p.baseLbl)+3)
	for k, v := range r.p.baseLbl {
		l[k] = v
	}
	l[labelPod] = r.key
	l[labelPodUID] = string(r.uid)
	l[labelContainer] = c.spec.Name
	return l
}

// hostname is the Pod's host name as the kubelet sets it: spec.hostname,
// else the Pod's name, cut to 63 characters.
func hostname(specHostname, podName string) string {
	h := specHostname
	if h == "" {
		h = podName
	}
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-.")
	}
	return h
}

// runAsUser is the container's user from its or the Pod's securityContext
// ("uid" or "uid:gid"), or "" for the image's.
func runAsUser(pod *corev1.Pod, c corev1.Container) string {
	var uid, gid *int64
	if psc := pod.Spec.SecurityContext; psc != nil {
		uid, gid = psc.RunAsUser, psc.RunAsGroup
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = sc.RunAsGroup
		}
	}
	switch {
	case uid == nil:
		return ""
	case gid == nil:
		return fmt.Sprint(*uid)
	default:
		return fmt.Sprintf("%d:%d", *uid, *gid)
	}
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func shortUID[T ~string](uid T) string {
	s := strings.ReplaceAll(string(uid), "-", "")
	if len(s) > 8 {
		return s[:8]
	}
	return s
}

// sleepCtx waits d and reports true, or false if ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// backoff is the kubelet's per-container back-off (client-go's
// flowcontrol.Backoff as the kubelet uses it): after a failure at ts, the
// next attempt may start d after ts, d doubling from initialBackoff up to
// maxBackoff; an entry not updated for 2*maxBackoff starts over.
type backoff struct {
	d    time.Duration
	last time.Time
}

// delay is how long to wait, at now, before restarting after a failure at
// ts, and the back-off in force (for the message). The first failure, or
// the first after a long quiet, restarts at once.
func (b *backoff) delay(ts, now time.Time) (wait, current time.Duration) {
	if b.d == 0 || ts.Sub(b.last) > 2*maxBackoff {
		return 0, 0
	}
	return b.d - now.Sub(ts), b.d
}

// advance records a restart after a failure at ts.
func (b *backoff) advance(ts time.Time) {
	if b.d == 0 || ts.Sub(b.last) > 2*maxBackoff {
		b.d = initialBackoff
	} else {
		b.d = min(2*b.d, maxBackoff)
	}
	b.last = ts
}
