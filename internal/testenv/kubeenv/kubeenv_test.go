package kubeenv

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "a", "EMPTY": ""}
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"$(A)", "a"},
		{"x$(A)y$(A)", "xaya"},
		{"$(EMPTY)!", "!"},
		{"$(UNDEFINED)", "$(UNDEFINED)"},
		{"$$(A)", "$(A)"},
		{"$$", "$"},
		{"$A", "$A"},
		{"$(A", "$(A"},
		{"tail$", "tail$"},
		{"$(A)$$(A)$(A)", "a$(A)a"},
	} {
		if got := expand(tc.in, vars); got != tc.want {
			t.Errorf("expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := expandAll([]string{}, vars); got != nil {
		t.Errorf("expandAll of an empty list = %#v, want nil (the image's own)", got)
	}
}

// TestBackoff: the kubelet's crash-loop schedule: the first exit restarts
// at once, then 10 s, 20 s, 40 s ... up to 5 minutes, and a long quiet
// starts over.
func TestBackoff(t *testing.T) {
	var b backoff
	t0 := time.Unix(1000, 0)
	if wait, _ := b.delay(t0, t0); wait != 0 {
		t.Fatalf("first exit waits %v", wait)
	}
	b.advance(t0)
	ts := t0
	for i, want := range []time.Duration{10, 20, 40, 80, 160, 300, 300} {
		ts = ts.Add(time.Second)
		wait, current := b.delay(ts, ts)
		if wait != want*time.Second || current != want*time.Second {
			t.Fatalf("exit %d: wait %v (back-off %v), want %vs", i+2, wait, current, want)
		}
		ts = ts.Add(wait)
		b.advance(ts)
	}
	later := ts.Add(11 * time.Minute)
	if wait, _ := b.delay(later, later); wait != 0 {
		t.Errorf("after 11 quiet minutes the exit waits %v, want a restart at once", wait)
	}
}

func TestNamespacePrefix(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"TestIntegrationPostgresPod", "postgrespod-"},
		{"TestIntegrationFailures/missing_image", "failures-missing-image-"},
		{"TestX", "testx-"},
		{"TestIntegration", "test-"},
		{"TestIntegrationAVeryLongNameThatGoesOnAndOnAndOnForeverAndEver", "averylongnamethatgoesonandonandonforever-"},
	} {
		if got := namespacePrefix(tc.in); got != tc.want {
			t.Errorf("namespacePrefix(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestAllocate(t *testing.T) {
	sub := netip.MustParsePrefix("172.30.0.0/29") // .1 gateway, .2-.6 usable, .7 broadcast
	n := &podNetwork{name: "t", subnet: sub, gateway: netip.MustParseAddr("172.30.0.1"),
		used: map[netip.Addr]bool{}, next: netip.MustParseAddr("172.30.0.2")}
	var got []string
	for range 5 {
		a, err := n.allocate()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, a.String())
	}
	if want := "[172.30.0.2 172.30.0.3 172.30.0.4 172.30.0.5 172.30.0.6]"; fmtList(got) != want {
		t.Fatalf("allocated %v, want %s", got, want)
	}
	if a, err := n.allocate(); err == nil {
		t.Fatalf("a full subnet gave %v", a)
	}
	n.release(netip.MustParseAddr("172.30.0.3"))
	if a, err := n.allocate(); err != nil || a.String() != "172.30.0.3" {
		t.Fatalf("after a release: %v, %v", a, err)
	}
}

func fmtList(l []string) string {
	s := "["
	for i, x := range l {
		if i > 0 {
			s += " "
		}
		s += x
	}
	return s + "]"
}

func TestPhase(t *testing.T) {
	running := corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	creating := corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
	crashLoop := corev1.ContainerStatus{
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3}},
	}
	exited := func(code int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}
	}
	for _, tc := range []struct {
		name     string
		policy   corev1.RestartPolicy
		finished bool
		cs       []corev1.ContainerStatus
		want     corev1.PodPhase
	}{
		{"creating", corev1.RestartPolicyAlways, false, []corev1.ContainerStatus{creating}, corev1.PodPending},
		{"running", corev1.RestartPolicyAlways, false, []corev1.ContainerStatus{running}, corev1.PodRunning},
		{"crash loop", corev1.RestartPolicyAlways, false, []corev1.ContainerStatus{crashLoop}, corev1.PodRunning},
		{"one waits", corev1.RestartPolicyAlways, false, []corev1.ContainerStatus{running, creating}, corev1.PodPending},
		{"never, failed", corev1.RestartPolicyNever, false, []corev1.ContainerStatus{exited(1)}, corev1.PodFailed},
		{"never, done", corev1.RestartPolicyNever, false, []corev1.ContainerStatus{exited(0)}, corev1.PodSucceeded},
		{"on failure, done", corev1.RestartPolicyOnFailure, false, []corev1.ContainerStatus{exited(0)}, corev1.PodSucceeded},
		{"deleted, clean stop", corev1.RestartPolicyAlways, true, []corev1.ContainerStatus{exited(0)}, corev1.PodSucceeded},
		{"deleted, killed", corev1.RestartPolicyAlways, true, []corev1.ContainerStatus{exited(137)}, corev1.PodFailed},
	} {
		r := &podRun{pod: &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: tc.policy}}, finished: tc.finished}
		if got := r.phaseLocked(tc.cs); got != tc.want {
			t.Errorf("%s: phase %s, want %s", tc.name, got, tc.want)
		}
	}
}
