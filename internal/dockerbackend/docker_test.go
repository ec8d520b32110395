package dockerbackend

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/moby/moby/api/types/container"

	"github.com/pgwake/pgwake/internal/backend"
)

func TestExitReason(t *testing.T) {
	for _, tc := range []struct {
		state container.State
		want  string
	}{
		{container.State{Status: container.StateCreated}, ""},
		{container.State{Status: container.StateExited, ExitCode: 0}, "exited with code 0"},
		{container.State{Status: container.StateExited, ExitCode: 3}, "exited with code 3"},
		{container.State{Status: container.StateExited, ExitCode: 137, OOMKilled: true}, "exited with code 137 (OOM killed)"},
		{container.State{Status: container.StateCreated, ExitCode: 127, Error: "exec: \"nope\": executable file not found in $PATH"},
			"exited with code 127: exec: \"nope\": executable file not found in $PATH"},
	} {
		if got := exitReason(&tc.state); got != tc.want {
			t.Errorf("exitReason(%+v) = %q, want %q", tc.state, got, tc.want)
		}
	}
}

func TestNotOwned(t *testing.T) {
	b := &Backend{instance: "a"}
	for _, tc := range []struct {
		labels map[string]string
		owned  bool
		want   string
	}{
		{map[string]string{LabelManaged: "true", LabelInstance: "a", LabelProject: "p"}, true, ""},
		{nil, false, `container "c" exists but was not created by this pgwake (no dev.pgwake labels): rename or remove it yourself`},
		{map[string]string{LabelInstance: "a", LabelProject: "p"}, false, `container "c" exists but was not created by this pgwake (no dev.pgwake labels): rename or remove it yourself`},
		{map[string]string{LabelManaged: "true", LabelInstance: "a-x", LabelProject: "p"}, false,
			`container "c" exists but was not created by this pgwake (it belongs to pgwake instance "a-x", project "p"): use another project name`},
		{map[string]string{LabelManaged: "true", LabelInstance: "a", LabelProject: "q"}, false,
			`container "c" exists but was not created by this pgwake (it belongs to pgwake instance "a", project "q"): use another project name`},
	} {
		if got := b.owns(tc.labels, "p"); got != tc.owned {
			t.Errorf("owns(%v) = %v, want %v", tc.labels, got, tc.owned)
		}
		if tc.owned {
			continue
		}
		err := notOwned("container", "c", tc.labels)
		if !errors.Is(err, backend.ErrNotOwned) || err.Error() != tc.want {
			t.Errorf("notOwned(%v) = %q, want %q wrapping ErrNotOwned", tc.labels, err, tc.want)
		}
	}
}

// TestUnavailable: an engine that does not answer makes New, Check and
// every project call fail with backend.ErrUnavailable.
func TestUnavailable(t *testing.T) {
	dir, err := os.MkdirTemp("", "pgwake-docker")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "docker.sock")
	host := "unix://" + sock

	if _, err := New(t.Context(), Options{Host: host}); !errors.Is(err, backend.ErrUnavailable) || !errors.Is(err, ErrEngineUnreachable) {
		t.Fatalf("New without an engine: %v, want ErrUnavailable and ErrEngineUnreachable", err)
	}

	// An engine that answers the ping in New, then goes away.
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Api-Version", "1.41")
		_, _ = w.Write([]byte("OK"))
	})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	b, err := New(t.Context(), Options{Host: host})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_ = srv.Close()
	<-done

	ctx := context.Background()
	spec := backend.Spec{Name: "p", Image: "postgres:17"}
	_, startErr := b.Start(ctx, spec)
	_, statusErr := b.Status(ctx, spec)
	_, logsErr := b.Logs(ctx, spec, false, 1)
	for name, err := range map[string]error{
		"Check":     b.Check(ctx),
		"Ensure":    b.Ensure(ctx, spec),
		"Start":     startErr,
		"Sleep":     b.Sleep(ctx, spec, backend.SleepStop),
		"Status":    statusErr,
		"Remove":    b.Remove(ctx, spec, true),
		"RemoveAll": b.RemoveAll(ctx, true),
		"Logs":      logsErr,
	} {
		if !errors.Is(err, backend.ErrUnavailable) {
			t.Errorf("%s: %v, want ErrUnavailable", name, err)
		}
	}
}
