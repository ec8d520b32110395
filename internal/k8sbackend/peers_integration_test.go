package k8sbackend_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/k8sbackend"
	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

// peerEntry is one project's entry in a peer Lease, as the API holds it.
type peerEntry struct {
	Conns  int   `json:"c"`
	Waking bool  `json:"w"`
	Last   int64 `json:"t"`
}

// waitLease waits until the peer Lease name exists and its published use
// satisfies ok, reading it from the API server as a peer does.
func waitLease(t *testing.T, env *kubeenv.Env, ns, name string, ok func(map[string]peerEntry) bool) *coordinationv1.Lease {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		l, err := env.Client.CoordinationV1().Leases(ns).Get(t.Context(), name, metav1.GetOptions{})
		var use map[string]peerEntry
		if err == nil {
			err = json.Unmarshal([]byte(l.Annotations[k8sbackend.AnnotationUse]), &use)
		}
		if err == nil && ok(use) {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %s: %v, use %v", name, err, use)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func peerBackend(t *testing.T, env *kubeenv.Env, ns, peer string, lease time.Duration) *k8sbackend.Backend {
	t.Helper()
	be, err := k8sbackend.New(t.Context(), k8sbackend.Options{
		Config: env.RESTConfig, Namespace: ns, Dial: k8sbackend.DialPortForward,
		Instance: "test", Peer: peer, LeaseDuration: lease,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

// TestIntegrationPeerLeases: two backends on one namespace (two pgwake
// processes) see each other's use of a project through their Leases in
// the real API server, and not their own; an expired Lease is doubt, an
// old one a dead peer's; a closed backend deletes its Lease.
func TestIntegrationPeerLeases(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	ctx := t.Context()
	a := peerBackend(t, env, ns, "replica-a", 30*time.Second)
	b := peerBackend(t, env, ns, "Replica_B.example", 30*time.Second)

	idA, leaseA := a.Peer()
	_, leaseB := b.Peer()
	if idA != "replica-a" || leaseA != "pgwake-peer-replica-a" {
		t.Errorf("a's peer id, lease = %q, %q", idA, leaseA)
	}
	if leaseB == "pgwake-peer-replica-b-example" || len(leaseB) > 63 {
		t.Errorf("a changed name %q must carry a digest (two ids must not meet in one lease)", leaseB)
	}

	// A use is published at once, not at the next renewal (10 s away).
	t0 := time.Now()
	a.Use("app", backend.Use{Conns: 2, LastActive: t0})
	waitLease(t, env, ns, leaseA, func(u map[string]peerEntry) bool { return u["app"].Conns == 2 })
	if took := time.Since(t0); took > 5*time.Second {
		t.Errorf("a new use took %v to be published", took)
	}
	pu, err := b.PeerUse(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	if pu.Conns != 2 || len(pu.Peers) != 1 || pu.Peers[0] != "replica-a" || pu.LastActive.UnixMilli() != t0.UnixMilli() {
		t.Errorf("b sees %+v, want a's 2 connections, last active %v", pu, t0)
	}
	if own, err := a.PeerUse(ctx, "app"); err != nil || own.Conns != 0 {
		t.Errorf("a sees its own use as a peer's: %+v, %v", own, err)
	}
	if other, err := b.PeerUse(ctx, "other"); err != nil || other.Conns != 0 || other.Waking {
		t.Errorf("another project: %+v, %v", other, err)
	}

	// A wake is published at once too; the end of a use soon.
	b.Use("app", backend.Use{Waking: true})
	waitLease(t, env, ns, leaseB, func(u map[string]peerEntry) bool { return u["app"].Waking })
	if pu, err := a.PeerUse(ctx, "app"); err != nil || !pu.Waking {
		t.Errorf("a does not see b waking the project: %+v, %v", pu, err)
	}
	a.Use("app", backend.Use{LastActive: time.Now()})
	waitLease(t, env, ns, leaseA, func(u map[string]peerEntry) bool { return u["app"].Conns == 0 })

	// A peer that stopped renewing: first in doubt, then dead.
	stale := func(name string, age time.Duration) {
		renew := metav1.NewMicroTime(time.Now().Add(-age))
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{k8sbackend.LabelManaged: "true", k8sbackend.LabelRole: "peer"},
				Annotations: map[string]string{k8sbackend.AnnotationUse: `{"app":{"c":1}}`}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](10), RenewTime: &renew},
		}
		if _, err := env.Client.CoordinationV1().Leases(ns).Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	stale("pgwake-peer-gone-recently", 15*time.Second) // expired 5 s ago
	if _, err := a.PeerUse(ctx, "app"); !errors.Is(err, backend.ErrPeerInDoubt) {
		t.Errorf("a peer expired 5 s ago: err = %v, want ErrPeerInDoubt", err)
	}
	if err := env.Client.CoordinationV1().Leases(ns).Delete(ctx, "pgwake-peer-gone-recently", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	stale("pgwake-peer-dead", 25*time.Second) // past twice its duration
	if pu, err := a.PeerUse(ctx, "app"); err != nil || pu.Conns != 0 {
		t.Errorf("a dead peer's use counts: %+v, %v", pu, err)
	}
	stale("pgwake-peer-long-dead", time.Hour)
	if _, err := a.PeerUse(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, func() error {
		_, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, "pgwake-peer-long-dead", metav1.GetOptions{})
		return err
	})

	// Closing deletes the Lease: peers need not wait for it to expire.
	a.Close()
	if _, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, leaseA, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a's lease after Close: %v", err)
	}
}

// TestIntegrationPeerNamesakes: two live pgwakes given the same peer name
// (and so the same cancel tag) do not share one Lease, which would hide
// each one's clients from the other, and end up with tags of their own.
func TestIntegrationPeerNamesakes(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	ctx := t.Context()
	a := peerBackend(t, env, ns, "same", 30*time.Second)
	_, leaseA := a.Peer()
	waitLease(t, env, ns, leaseA, func(map[string]peerEntry) bool { return true })
	b := peerBackend(t, env, ns, "same", 30*time.Second)
	a.Use("app", backend.Use{Conns: 1})
	b.Use("app", backend.Use{Conns: 2})
	deadline := time.Now().Add(time.Minute)
	for {
		pa, errA := a.PeerUse(ctx, "app")
		pb, errB := b.PeerUse(ctx, "app")
		_, leaseB := b.Peer()
		ta, tb := a.CancelTag(), b.CancelTag()
		if errA == nil && errB == nil && pa.Conns == 2 && pb.Conns == 1 && leaseA != leaseB && ta != 0 && tb != 0 && ta != tb {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a sees %+v (%v), b sees %+v (%v); leases %s, %s; tags %d, %d", pa, errA, pb, errB, leaseA, leaseB, ta, tb)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
