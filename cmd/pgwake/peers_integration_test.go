package main

// Several pgwake processes in front of one Kubernetes namespace, as
// replicas of a Deployment would be (here: processes on this machine,
// each with its own state dir), against the test control plane.
// Simulated: the node (virtual-kubelet running Pods on the local Docker
// engine, internal/testenv/kubeenv). The Leases every process publishes,
// the StatefulSet controller, the scale subresource and Postgres are real.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

// peerHarness is a pgwake of ns with short leases, so that a killed
// peer's lease expires within seconds.
func peerHarness(t *testing.T, ns string) *cliHarness {
	return kubeHarness(t, ns).withEnv("PGWAKE_KUBERNETES_LEASE_DURATION=3s", "PGWAKE_GRACE_PERIOD=0s")
}

// peerLease finds the Lease of the pgwake whose state dir is h's.
func peerLease(t *testing.T, env *kubeenv.Env, ns string, h *cliHarness) (renewed time.Time, duration time.Duration) {
	t.Helper()
	inst := h.instanceOrEmpty()
	list, err := env.Client.CoordinationV1().Leases(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "dev.pgwake.role=peer"})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range list.Items {
		if l.Spec.HolderIdentity != nil && strings.HasSuffix(*l.Spec.HolderIdentity, "-"+inst) {
			return l.Spec.RenewTime.Time, time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
	}
	t.Fatalf("no peer lease for instance %s among %d", inst, len(list.Items))
	return
}

// TestIntegrationKubernetesPeersIdle: a client held through pgwake A keeps
// the project awake past sleep_after although pgwake B, which sees no
// client of its own, finds it due; B's sleep is refused naming A's
// connection; once A is killed (SIGKILL: no goodbye, its lease stays), B
// puts the project to sleep, but not before A's lease expired.
func TestIntegrationKubernetesPeersIdle(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	a, b := peerHarness(t, ns), peerHarness(t, ns)
	infoA, _ := a.up(t)
	b.up(t)
	a.ok(t, "create", "app", "--sleep-after", "2s")
	a.ok(t, "wake", "app") // the first start (initdb) out of the way

	conn := a.connect(t, "app")
	a.exec(t, conn, "select 1")
	eventually(t, "b holds off for a's client", func() string {
		p := b.mustProject(t, "app")
		if p.State == "running" && strings.Contains(p.PeersBusy, "1 connection(s) on other pgwake processes") {
			return ""
		}
		return fmt.Sprintf("b: state %s, peers_busy %q", p.State, p.PeersBusy)
	})
	// b found it due (sleep_after passed there): the server still serves a.
	a.exec(t, conn, "select 1")
	if r := b.fail(t, "sleep", "app"); !strings.Contains(r.stderr, "connection(s) on other pgwake processes") {
		t.Errorf("b's sleep: %q, want it refused for a's connection", r.stderr)
	}
	if p := a.mustProject(t, "app"); p.State != "running" || p.Active != 1 {
		t.Fatalf("a: state %s with %d connections", p.State, p.Active)
	}

	a.kill(t, infoA.PID)
	renewed, duration := peerLease(t, env, ns, a)
	eventually(t, "b puts it to sleep once a's lease expired", func() string {
		if p := b.mustProject(t, "app"); p.State != "sleeping" {
			return fmt.Sprintf("b: state %s, peers_busy %q", p.State, p.PeersBusy)
		}
		return ""
	})
	var slept time.Time
	for _, e := range b.mustProject(t, "app").Events {
		if strings.HasPrefix(e.Msg, "going to sleep") {
			slept = e.At
		}
	}
	if expiry := renewed.Add(duration); slept.Before(expiry) {
		t.Errorf("b went to sleep at %v, before a's lease expired at %v", slept, expiry)
	}
	set, err := env.Client.AppsV1().StatefulSets(ns).Get(t.Context(), "pgwake-app", metav1.GetOptions{})
	if err != nil || *set.Spec.Replicas != 0 {
		t.Errorf("statefulset after b's sleep: %v replicas, err %v", set.Spec.Replicas, err)
	}
}

// podStarts counts the Pods created for project in ns from now on: each
// is the StatefulSet controller's answer to one scale from 0 to 1.
func podStarts(t *testing.T, env *kubeenv.Env, ns, project string) func() int {
	t.Helper()
	w, err := env.Client.CoreV1().Pods(ns).Watch(t.Context(), metav1.ListOptions{LabelSelector: "dev.pgwake.project=" + project})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	var mu sync.Mutex
	seen := map[string]bool{}
	initial := map[string]bool{}
	list, err := env.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "dev.pgwake.project=" + project})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		initial[string(p.UID)] = true
	}
	go func() {
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added && !initial[string(p.UID)] {
				mu.Lock()
				seen[string(p.UID)] = true
				mu.Unlock()
			}
		}
	}()
	return func() int {
		// A final list catches a Pod whose event is still on its way.
		list, err := env.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "dev.pgwake.project=" + project})
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			for _, p := range list.Items {
				if !initial[string(p.UID)] {
					seen[string(p.UID)] = true
				}
			}
		}
		return len(seen)
	}
}

// TestIntegrationKubernetesPeersStorm: three pgwakes; clients of a
// sleeping project arrive at all three at once: one scale-up, no client
// sees an error. Then 20 cycles of a write through one and a sleep by
// another lose no row.
func TestIntegrationKubernetesPeersStorm(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	hs := []*cliHarness{peerHarness(t, ns), peerHarness(t, ns), peerHarness(t, ns)}
	for _, h := range hs {
		h.up(t)
	}
	hs[0].ok(t, "create", "app", "--sleep-after", "1h")
	hs[0].ok(t, "wake", "app") // initdb out of the way
	hs[0].ok(t, "sleep", "app")
	urls := make([]string, len(hs))
	for i, h := range hs {
		eventually(t, "every pgwake sees it asleep", func() string {
			if s := stateOf(h.projects(t), "app"); s != "sleeping" {
				return fmt.Sprintf("pgwake %d: %s", i, s)
			}
			return ""
		})
		urls[i] = strings.TrimSpace(h.ok(t, "url", "app"))
	}

	starts := podStarts(t, env, ns, "app")
	const clients = 12
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
			defer cancel()
			conn, err := pgx.Connect(ctx, urls[i%len(urls)])
			if err != nil {
				errs <- fmt.Errorf("client %d via pgwake %d: %w", i, i%len(urls), err)
				return
			}
			defer conn.Close(context.Background())
			var one int
			if err := conn.QueryRow(ctx, "select 1").Scan(&one); err != nil {
				errs <- fmt.Errorf("client %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := starts(); n != 1 {
		t.Errorf("%d Pods started for %d clients across %d pgwakes, want 1", n, clients, len(hs))
	}

	const cycles = 20
	var want []string
	for i := range cycles {
		writer, sleeper := hs[i%3], hs[(i+1)%3]
		body := fmt.Sprintf("cycle %d via pgwake %d", i, i%3)
		writer.writeNote(t, "app", body)
		want = append(want, body)
		// The writer's lease may still show its connection for a moment:
		// the sleeper refuses until it does not.
		eventually(t, "sleep by another pgwake", func() string {
			if r := sleeper.run(t, "sleep", "app"); r.code != 0 {
				return r.stderr
			}
			return ""
		})
	}
	hs[2].wantNotes(t, "app", want...)
	data, _ := json.Marshal(hs[1].mustProject(t, "app").Events)
	t.Logf("pgwake 1's events: %s", data)
}

// TestIntegrationKubernetesPeersCancel: a session through pgwake A, its
// CancelRequest sent to pgwake B (behind a Service it could land on
// either): B finds A by the tag in the key A issued, A passes it to the
// server, and the query ends with 57014.
func TestIntegrationKubernetesPeersCancel(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	a, b := peerHarness(t, ns), peerHarness(t, ns)
	a.up(t)
	infoB, _ := b.up(t)
	a.ok(t, "create", "app")
	a.ok(t, "wake", "app")

	conn := a.connect(t, "app")
	key := conn.PgConn().SecretKey()
	list, err := env.Client.CoordinationV1().Leases(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "dev.pgwake.role=peer"})
	if err != nil {
		t.Fatal(err)
	}
	var tags []string
	for _, l := range list.Items {
		tags = append(tags, l.Annotations["dev.pgwake.cancel"])
	}
	if len(key) == 0 || key[0] == 0 || !strings.Contains(strings.Join(tags, ","), fmt.Sprintf("%d 127.0.0.1:", key[0])) {
		t.Fatalf("key %x does not carry a tag its peers publish (%q)", key, tags)
	}

	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(context.Background(), "select pg_sleep(120)")
		done <- err
	}()
	watcher := a.connect(t, "app")
	eventually(t, "the query runs", func() string {
		var n int
		if err := watcher.QueryRow(t.Context(), "select count(*) from pg_stat_activity where query = 'select pg_sleep(120)' and state = 'active'").Scan(&n); err != nil || n != 1 {
			return fmt.Sprintf("%d running, err %v", n, err)
		}
		return ""
	})

	packet, err := (&pgproto3.CancelRequest{ProcessID: conn.PgConn().PID(), SecretKey: key}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", infoB.Listen)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(packet); err != nil {
		t.Fatal(err)
	}
	c.Read(make([]byte, 1)) // B closes once it passed the cancel on
	c.Close()

	select {
	case err := <-done:
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
			t.Fatalf("query ended with %v, want 57014", err)
		}
	case <-time.After(cmdTimeout):
		t.Fatal("the query was not cancelled")
	}
}
