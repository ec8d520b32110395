package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestVersionStampedByLinker builds the binary the way goreleaser does and
// checks that `pgwake version` reports the stamped values: the -X paths
// must match the module path exactly or the stamp is silently dropped.
func TestVersionStampedByLinker(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "pgwake")
	const pkg = "github.com/pgwake/pgwake/internal/version"
	ldflags := strings.Join([]string{
		"-X " + pkg + ".Version=9.8.7-test",
		"-X " + pkg + ".Commit=abc1234",
		"-X " + pkg + ".Date=2026-11-30T00:00:00Z",
	}, " ")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", bin, ".")
	build.Env = append(build.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "pgwake 9.8.7-test (commit abc1234, built 2026-11-30T00:00:00Z)\n"
	if string(out) != want {
		t.Fatalf("version printed %q, want %q", out, want)
	}
}
