package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/dockerbackend"
	"github.com/pgwake/pgwake/internal/localbackend"
)

// ErrNoBackend is returned by auto selection when neither Docker nor local
// PostgreSQL binaries are available.
var ErrNoBackend = errors.New("no backend available")

// SelectBackend connects the configured backend. With "auto" it takes
// Docker when an engine answers, else local PostgreSQL binaries when found.
// reason says which was chosen and why, for the user.
func SelectBackend(ctx context.Context, cfg config.Config, instance string, log *slog.Logger) (be backend.Backend, reason string, err error) {
	switch cfg.Backend {
	case "docker":
		d, err := dockerbackend.New(ctx, dockerbackend.Options{Host: cfg.DockerHost, Instance: instance, Logger: log})
		if err != nil {
			return nil, "", err
		}
		return d, "docker (backend: docker)", nil
	case "local":
		l, err := newLocal(ctx, cfg, instance, log)
		if err != nil {
			return nil, "", err
		}
		return l, "local (backend: local), binaries in " + l.BinDir(), nil
	}
	d, derr := dockerbackend.New(ctx, dockerbackend.Options{Host: cfg.DockerHost, Instance: instance, Logger: log})
	if derr == nil {
		return d, "docker (auto: a Docker engine answered)", nil
	}
	l, lerr := newLocal(ctx, cfg, instance, log)
	if lerr == nil {
		return l, "local (auto: no Docker engine answered; PostgreSQL binaries in " + l.BinDir() + ")", nil
	}
	return nil, "", fmt.Errorf("%w: no Docker engine answered (start Docker, or set DOCKER_HOST) and no PostgreSQL server binaries were found (install postgresql, or pass --pg-bin DIR)", ErrNoBackend)
}

func newLocal(ctx context.Context, cfg config.Config, instance string, log *slog.Logger) (*localbackend.Backend, error) {
	return localbackend.New(ctx, localbackend.Options{BinDir: cfg.PGBin, Root: localRoot(cfg.StateDir, instance), Logger: log})
}

// localRoot is where the local backend keeps data directories: in the
// state dir, unless pgwake runs as root and the state dir cannot be reached
// by the unprivileged user postgres runs as (root's home is 0700).
func localRoot(stateDir, instance string) string {
	root := filepath.Join(stateDir, "local")
	if os.Geteuid() != 0 || traversable(stateDir) {
		return root
	}
	return filepath.Join("/var/lib/pgwake", instance)
}

// traversable reports whether every directory from / to dir lets others
// pass through (x for others).
func traversable(dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for d := abs; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == "/" {
			return true
		}
	}
}
