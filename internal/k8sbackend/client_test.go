package k8sbackend

import (
	"testing"

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
