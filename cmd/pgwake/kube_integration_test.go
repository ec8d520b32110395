package main

// pgwake on the kubernetes backend, driven through its command line as a
// user would, against a real kube-apiserver, etcd, controller-manager and
// scheduler. Simulated: the node, whose kubelet is virtual-kubelet running
// each Pod's container on the local Docker engine (internal/testenv/kubeenv).
// pgwake reaches the servers through port-forwards via the API server,
// as from a laptop.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

// kubeHarness is a CLI harness whose daemon keeps its projects in
// namespace ns of the test control plane.
func kubeHarness(t *testing.T, ns string) *cliHarness {
	env := kubeenv.Shared(t)
	h := newHarness(t)
	out := h.env[:0:0]
	for _, kv := range h.env {
		if !strings.HasPrefix(kv, "PGWAKE_BACKEND=") && !strings.HasPrefix(kv, "KUBECONFIG=") {
			out = append(out, kv)
		}
	}
	h.env = append(out, "PGWAKE_BACKEND=kubernetes", "KUBECONFIG="+env.Kubeconfig, "PGWAKE_KUBERNETES_NAMESPACE="+ns)
	return h
}

// eventually polls fn until it returns "" (agreement) or a minute passes.
func eventually(t *testing.T, what string, fn func() string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		msg := fn()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, msg)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func stateOf(ps []admin.Project, name string) string {
	for _, p := range ps {
		if p.Name == name {
			return p.State
		}
	}
	return "absent"
}

// TestIntegrationKubernetesTwoPgwakes: two pgwakes pointed at one
// namespace agree on the projects, their passwords and states after
// create, sleep and rm by either; data written through one survives a
// sleep by the other.
func TestIntegrationKubernetesTwoPgwakes(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	a, b := kubeHarness(t, ns), kubeHarness(t, ns)
	infoA, r := a.up(t)
	if !strings.Contains(r.stderr, "backend kubernetes") {
		t.Errorf("up did not say it serves the kubernetes backend: %q", r.stderr)
	}
	var detail string
	for _, bi := range infoA.Backends {
		if bi.Name == "kubernetes" {
			detail = bi.Detail
		}
	}
	if !strings.Contains(detail, ns) || !strings.Contains(detail, "port-forward") {
		t.Errorf("backend detail %q does not name the namespace and the port-forward", detail)
	}
	b.up(t)

	a.ok(t, "create", "app")
	eventually(t, "b lists the project a created", func() string {
		if s := stateOf(b.projects(t), "app"); s == "absent" {
			return "absent"
		}
		return ""
	})
	// The same credentials: the cluster's Secret is the project's password.
	urlA, urlB := strings.TrimSpace(a.ok(t, "url", "app")), strings.TrimSpace(b.ok(t, "url", "app"))
	pw := func(u string) string {
		s, _, _ := strings.Cut(strings.TrimPrefix(u, "postgres://postgres:"), "@")
		return s
	}
	if pw(urlA) == "" || pw(urlA) != pw(urlB) {
		t.Fatalf("passwords differ: %q vs %q", urlA, urlB)
	}
	if p := b.mustProject(t, "app"); p.Backend != "kubernetes" {
		t.Errorf("b's project backend = %q", p.Backend)
	}

	b.writeNote(t, "app", "written through b") // b wakes it
	eventually(t, "a sees the project b woke as running", func() string {
		if s := stateOf(a.projects(t), "app"); s != "running" {
			return "a says " + s
		}
		return ""
	})
	a.ok(t, "sleep", "app")
	eventually(t, "b sees the project a put to sleep", func() string {
		if s := stateOf(b.projects(t), "app"); s != "sleeping" {
			return "b says " + s
		}
		return ""
	})
	a.wantNotes(t, "app", "written through b") // a wakes it, same data
	logs := a.ok(t, "logs", "app", "--tail", "50")
	if !strings.Contains(logs, "ready to accept connections") {
		t.Errorf("pgwake logs (the Pod's log) lacks Postgres's start:\n%s", logs)
	}

	// A branch made through b, of the running project, is a project of
	// the namespace: a lists it with its parent and serves its data, with
	// the branch's own password.
	b.ok(t, "branch", "app", "app-b")
	eventually(t, "a lists b's branch", func() string {
		if s := stateOf(a.projects(t), "app-b"); s == "absent" {
			return "absent"
		}
		return ""
	})
	if p := a.mustProject(t, "app-b"); p.Parent != "app" || p.BranchedAt.IsZero() {
		t.Errorf("a shows the branch's parent %q taken %v", p.Parent, p.BranchedAt)
	}
	if pb := pw(strings.TrimSpace(a.ok(t, "url", "app-b"))); pb == "" || pb == pw(urlA) {
		t.Errorf("the branch's password %q is empty or its source's", pb)
	}
	a.wantNotes(t, "app-b", "written through b")

	// What the kubernetes backend cannot do is refused in one line.
	for _, mode := range []string{"pause", "tiered"} {
		if r := a.fail(t, "create", "frozen", "--sleep-mode", mode); !strings.Contains(r.stderr, "cannot pause") {
			t.Errorf("create --sleep-mode %s: %q", mode, r.stderr)
		}
	}

	b.ok(t, "rm", "app")
	eventually(t, "a forgets the project b removed", func() string {
		if s := stateOf(a.projects(t), "app"); s != "absent" {
			return "a still lists it as " + s
		}
		return ""
	})
	// Created again by a, it reaches the data rm kept.
	a.ok(t, "create", "app")
	a.wantNotes(t, "app", "written through b")
	eventually(t, "b lists it again", func() string {
		if s := stateOf(b.projects(t), "app"); s == "absent" {
			return "absent"
		}
		return ""
	})
}

// TestIntegrationKubernetesUnboundVolume: a project whose PVC the cluster
// cannot provide (a StorageClass that does not exist) shows why in ls
// while it wakes, and the wake fails once its deadline passes, naming the
// StorageClass, instead of waiting forever.
func TestIntegrationKubernetesUnboundVolume(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	h := kubeHarness(t, ns).withEnv("PGWAKE_KUBERNETES_STORAGE_CLASS=no-such-class",
		"PGWAKE_WAKE_TIMEOUT=10s", "PGWAKE_FIRST_START_TIMEOUT=10s")
	h.up(t)
	h.ok(t, "create", "novol")
	done := make(chan runResult, 1)
	go func() { done <- h.run(t, "wake", "novol") }()
	var phase string
	eventually(t, "ls shows the waking Pod's phase", func() string {
		p := h.mustProject(t, "novol")
		if p.State == "waking" && strings.Contains(p.Phase, "no-such-class") {
			phase = p.Phase
			return ""
		}
		return fmt.Sprintf("state %s, phase %q", p.State, p.Phase)
	})
	t.Logf("phase while waking: %s", phase)
	if !strings.Contains(phase, "Pending") {
		t.Errorf("phase %q does not say the PVC is Pending", phase)
	}
	r := <-done
	if r.code == 0 {
		t.Fatal("wake succeeded without a volume")
	}
	for _, w := range []string{"StorageClass no-such-class", "data-pgwake-novol-0"} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("wake error %q lacks %q", r.stderr, w)
		}
	}
	if p := h.mustProject(t, "novol"); !strings.Contains(p.LastError, "no-such-class") {
		t.Errorf("last error %q does not name the StorageClass", p.LastError)
	}
}
