package kubeenv

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// nodeIP is the node's InternalIP and every Pod's hostIP.
const nodeIP = "127.0.0.1"

// podLocked returns a copy of the Pod with the status the kubelet would
// report now. r.mu must be held.
func (r *podRun) podLocked() *corev1.Pod {
	pod := r.pod.DeepCopy()
	st := &pod.Status
	st.Reason, st.Message = "", ""
	st.HostIP = nodeIP
	st.HostIPs = []corev1.HostIP{{IP: nodeIP}}
	if ip := r.podIP(); ip.IsValid() {
		st.PodIP = ip.String()
		st.PodIPs = []corev1.PodIP{{IP: st.PodIP}}
	}
	st.StartTime = r.startTime.DeepCopy()

	st.ContainerStatuses = make([]corev1.ContainerStatus, 0, len(r.containers))
	var unready []string
	for _, c := range r.containers {
		cs := r.containerStatusLocked(c)
		if !cs.Ready {
			unready = append(unready, c.spec.Name)
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	st.Phase = r.phaseLocked(st.ContainerStatuses)

	// Conditions: those the kubelet owns, with their transition times kept
	// across reports; others (PodScheduled) as the API server has them.
	var conds []corev1.PodCondition
	for _, c := range st.Conditions {
		switch c.Type {
		case corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady:
		default:
			conds = append(conds, c)
		}
	}
	sandbox := corev1.ConditionTrue
	if r.finished {
		sandbox = corev1.ConditionFalse
	}
	conds = append(conds,
		r.condLocked(corev1.PodReadyToStartContainers, sandbox, "", ""),
		r.condLocked(corev1.PodInitialized, corev1.ConditionTrue, "", ""))
	switch {
	case r.finished || st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed:
		conds = append(conds,
			r.condLocked(corev1.ContainersReady, corev1.ConditionFalse, "PodCompleted", ""),
			r.condLocked(corev1.PodReady, corev1.ConditionFalse, "PodCompleted", ""))
	case len(unready) > 0:
		msg := fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " "))
		conds = append(conds,
			r.condLocked(corev1.ContainersReady, corev1.ConditionFalse, "ContainersNotReady", msg),
			r.condLocked(corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", msg))
	default:
		conds = append(conds,
			r.condLocked(corev1.ContainersReady, corev1.ConditionTrue, "", ""),
			r.condLocked(corev1.PodReady, corev1.ConditionTrue, "", ""))
	}
	st.Conditions = conds
	return pod
}

func (r *podRun) containerStatusLocked(c *ctrRun) corev1.ContainerStatus {
	cs := corev1.ContainerStatus{
		Name:                 c.spec.Name,
		Image:                c.spec.Image,
		State:                *c.state.DeepCopy(),
		LastTerminationState: *c.last.DeepCopy(),
		RestartCount:         c.restarts,
		Ready:                c.ready && c.state.Running != nil && !r.finished,
	}
	if c.imageID != "" {
		cs.ImageID = "docker://" + c.imageID
	}
	if c.dockerID != "" {
		cs.ContainerID = "docker://" + c.dockerID
	}
	if r.finished && cs.State.Terminated == nil {
		// Never ran to an end here (still waiting to start or to restart):
		// what the kubelet reports for such a container of a Pod it has
		// terminated.
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 137,
			Reason:   "ContainerStatusUnknown",
			Message:  "The container could not be located when the pod was terminated",
		}}
	}
	started := cs.State.Running != nil
	cs.Started = &started
	return cs
}

// phaseLocked is the Pod's phase from its containers' states, by the
// kubelet's rules (getPhase, for Pods without init containers).
func (r *podRun) phaseLocked(statuses []corev1.ContainerStatus) corev1.PodPhase {
	var waiting, running, stopped, succeeded int
	for _, cs := range statuses {
		switch {
		case cs.State.Running != nil:
			running++
		case cs.State.Terminated != nil:
			stopped++
			if cs.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case cs.State.Waiting != nil:
			if cs.LastTerminationState.Terminated != nil {
				stopped++
			} else {
				waiting++
			}
		}
	}
	if r.finished {
		if stopped == succeeded {
			return corev1.PodSucceeded
		}
		return corev1.PodFailed
	}
	switch {
	case waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case stopped > 0:
		switch r.pod.Spec.RestartPolicy {
		case corev1.RestartPolicyNever:
			if stopped == succeeded {
				return corev1.PodSucceeded
			}
			return corev1.PodFailed
		case corev1.RestartPolicyOnFailure:
			if stopped == succeeded {
				return corev1.PodSucceeded
			}
			return corev1.PodRunning
		default:
			return corev1.PodRunning
		}
	}
	return corev1.PodPending
}

// condLocked returns the condition t with status, its transition time
// moved only when the status changes.
func (r *podRun) condLocked(t corev1.PodConditionType, status corev1.ConditionStatus, reason, msg string) corev1.PodCondition {
	c := r.conds[t]
	if c == nil || c.Status != status {
		c = &corev1.PodCondition{Type: t, Status: status, LastTransitionTime: metav1.Now()}
		r.conds[t] = c
	}
	c.Reason, c.Message = reason, msg
	return *c
}
