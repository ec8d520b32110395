package admin

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestRequireToken(t *testing.T) {
	t.Parallel()
	h := RequireToken("s3cret", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
	}))
	for _, tc := range []struct {
		path, auth string
		want       int
	}{
		{"/healthz", "", http.StatusTeapot}, // probes carry no token
		{"/readyz", "", http.StatusTeapot},
		{"/v1/projects", "", http.StatusUnauthorized},
		{"/metrics", "Bearer wrong", http.StatusUnauthorized},
		{"/v1/projects", "Bearer s3cret", http.StatusTeapot},
	} {
		r := httptest.NewRequest(http.MethodGet, tc.path, nil)
		if tc.auth != "" {
			r.Header.Set("Authorization", tc.auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s with %q: %d, want %d", tc.path, tc.auth, w.Code, tc.want)
		}
	}
}
