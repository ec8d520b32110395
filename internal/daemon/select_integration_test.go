package daemon

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/testenv"
)

func TestIntegrationSelectBackendAuto(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	dead := "unix://" + filepath.Join(t.TempDir(), "no-docker.sock")
	tests := []struct {
		name       string
		dockerHost string
		pgBin      string // "" finds the machine's binaries
		wantName   string
		wantErr    []string
	}{
		{name: "docker answers", wantName: "docker"},
		{name: "no docker, binaries found", dockerHost: dead, wantName: "local"},
		{
			// An empty --pg-bin stands in for a machine without PostgreSQL.
			name: "neither", dockerHost: dead, pgBin: t.TempDir(),
			wantErr: []string{"no backend available", "no Docker engine answered", "DOCKER_HOST", "no PostgreSQL server binaries", "--pg-bin"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.dockerHost == "" {
				testenv.DockerClient(t) // skips under -short, fails without an engine
			}
			cfg := config.Default()
			cfg.StateDir = t.TempDir()
			cfg.DockerHost = tt.dockerHost
			cfg.PGBin = tt.pgBin
			// As root the local backend's data root may be outside the state
			// dir (/var/lib/pgwake/<instance>); remove it either way.
			t.Cleanup(func() { os.RemoveAll(localRoot(cfg.StateDir, "sel")) })
			be, reason, err := SelectBackend(t.Context(), cfg, "sel", log)
			if len(tt.wantErr) > 0 {
				if err == nil {
					be.Close()
					t.Fatalf("got backend %s, want an error", be.Name())
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error is not one line: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer be.Close()
			if be.Name() != tt.wantName || !strings.Contains(reason, "auto") {
				t.Fatalf("got %s (%s), want %s chosen by auto", be.Name(), reason, tt.wantName)
			}
		})
	}
}

func TestLocalRootReachableByServerUser(t *testing.T) {
	// Directly below os.TempDir (1777 on Linux), not t.TempDir, whose
	// parent is 0700.
	dir, err := os.MkdirTemp("", "pgwsel")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if traversable(dir) {
		t.Fatalf("%s is 0700 but reported traversable", dir)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if !traversable(dir) {
		t.Fatalf("%s is 0711 below /tmp but reported not traversable", dir)
	}
}
