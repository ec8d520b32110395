package k8sbackend

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/client-go/rest"
)

// TestClientsetSharesRateLimit: the QPS and burst in the config bound all
// of pgwake's calls together, as with client-go's clientset, rather than
// each API group's on its own (three times the limit).
func TestClientsetSharesRateLimit(t *testing.T) {
	cs, err := newClientset(&rest.Config{Host: "https://127.0.0.1:1", QPS: 50, Burst: 100})
	if err != nil {
		t.Fatal(err)
	}
	core := cs.core.rest.GetRateLimiter()
	if core == nil || core.QPS() != 50 {
		t.Fatalf("core's rate limiter %v, want 50/s", core)
	}
	if apps, coord := cs.apps.rest.GetRateLimiter(), cs.coord.rest.GetRateLimiter(); apps != core || coord != core {
		t.Errorf("apps %p and coordination %p do not share core's rate limiter %p", apps, coord, core)
	}
	if _, err := newClientset(&rest.Config{Host: "https://127.0.0.1:1", QPS: 50}); err == nil {
		t.Error("a QPS limit with no burst was accepted")
	}
}

// TestDynamicClientSharesRateLimit: the dynamic client (CloudNativePG's
// Clusters) waits on the same limit as the typed groups. With the one
// token taken through core, a call through it must wait for the next,
// which the context's deadline does not allow; a limiter of its own would
// let the call reach the server.
func TestDynamicClientSharesRateLimit(t *testing.T) {
	var reached atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		http.NotFound(w, r)
	}))
	defer srv.Close()
	cs, err := newClientset(&rest.Config{Host: srv.URL, QPS: 0.001, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := cs.dynamic()
	if err != nil {
		t.Fatal(err)
	}
	if !cs.core.rest.GetRateLimiter().TryAccept() {
		t.Fatal("the shared limiter had no token to begin with")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = dyn.Resource(clusterGVR).Namespace("default").Get(ctx, "c", metav1.GetOptions{})
	if err == nil || !strings.Contains(err.Error(), "rate limiter") {
		t.Errorf("Get through the dynamic client: %v, want the shared rate limiter's refusal", err)
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("%d requests reached the server past the spent limit", n)
	}
}
