package testenv_test

import (
	"slices"
	"testing"

	"github.com/pgwake/pgwake/internal/testenv"
)

// TestIntegrationPostgresImage checks that the image is available (building
// it if need be) and carries the parts of the official image's contract that
// pgwake's Docker backend relies on.
func TestIntegrationPostgresImage(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test; skipped with -short")
	}
	ref := testenv.PostgresImage(t)
	img, err := testenv.DockerClient(t).ImageInspect(t.Context(), ref)
	if err != nil {
		t.Fatalf("inspect %s: %v", ref, err)
	}
	cfg := img.Config
	if cfg == nil {
		t.Fatalf("image %s has no config", ref)
	}
	if !slices.Contains(cfg.Env, "PGDATA=/var/lib/postgresql/data") {
		t.Errorf("env %q lacks PGDATA=/var/lib/postgresql/data", cfg.Env)
	}
	if _, ok := cfg.ExposedPorts["5432/tcp"]; !ok {
		t.Errorf("exposed ports %v lack 5432/tcp", cfg.ExposedPorts)
	}
	if !slices.Equal(cfg.Entrypoint, []string{"docker-entrypoint.sh"}) || !slices.Equal(cfg.Cmd, []string{"postgres"}) {
		t.Errorf("entrypoint %q cmd %q, want [docker-entrypoint.sh] [postgres]", cfg.Entrypoint, cfg.Cmd)
	}
	t.Logf("%s: %s, %d bytes", ref, img.ID, img.Size)
}
