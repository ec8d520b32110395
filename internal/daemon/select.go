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
	"github.com/pgwake/pgwake/internal/k8sbackend"
	"github.com/pgwake/pgwake/internal/localbackend"
)

// ErrNoBackend is returned by auto selection when neither Docker nor local
// PostgreSQL binaries are available.
var ErrNoBackend = errors.New("no backend available")

// Connect connects one named backend ("docker" or "local"). It is
// Options.Connect's type; ConnectBackend is the real one.
type Connect func(ctx context.Context, name string, cfg config.Config, instance string, log *slog.Logger) (backend.Backend, error)

// ConnectBackend connects the named backend.
func ConnectBackend(ctx context.Context, name string, cfg config.Config, instance string, log *slog.Logger) (backend.Backend, error) {
	switch name {
	case "docker":
		return dockerbackend.New(ctx, dockerbackend.Options{Host: cfg.DockerHost, Instance: instance, Logger: log})
	case "local":
		return newLocal(ctx, cfg, instance, log)
	case "kubernetes":
		k := cfg.Kubernetes
		return k8sbackend.New(ctx, k8sbackend.Options{
			Kubeconfig: k.Kubeconfig, Context: k.Context, Namespace: k.Namespace,
			StorageClass: k.StorageClass, StorageSize: k.StorageSize, Dial: k.Dial,
			Peer: k.Peer, LeaseDuration: k.LeaseDuration,
			Adopt: k.Adopt, AdoptSleepAfter: cfg.SleepAfter,
			Instance: instance, Logger: log,
		})
	}
	return nil, fmt.Errorf("unknown backend %q (this pgwake knows docker, local and kubernetes)", name)
}

// SelectBackend connects the configured backend. With "auto" it takes
// Docker when an engine answers, else local PostgreSQL binaries when found;
// never Kubernetes, which a user names.
// reason says which was chosen and why, for the user. The daemon lets auto
// choose only for a state dir without projects: see New.
func SelectBackend(ctx context.Context, cfg config.Config, instance string, log *slog.Logger) (be backend.Backend, reason string, err error) {
	return selectBackend(ctx, ConnectBackend, cfg, instance, log)
}

func selectBackend(ctx context.Context, connect Connect, cfg config.Config, instance string, log *slog.Logger) (be backend.Backend, reason string, err error) {
	if cfg.Backend != "auto" {
		be, err := connect(ctx, cfg.Backend, cfg, instance, log)
		if err != nil {
			return nil, "", err
		}
		return be, describe(be, cfg.Backend+" (backend: "+cfg.Backend+")"), nil
	}
	d, derr := connect(ctx, "docker", cfg, instance, log)
	if derr == nil {
		return d, "docker (auto: a Docker engine answered)", nil
	}
	l, lerr := connect(ctx, "local", cfg, instance, log)
	if lerr == nil {
		return l, describe(l, "local (auto: no Docker engine answered)"), nil
	}
	return nil, "", fmt.Errorf("%w: no Docker engine answered (start Docker, or set DOCKER_HOST) and no PostgreSQL server binaries were found (install postgresql, or pass --pg-bin DIR)", ErrNoBackend)
}

// describe adds where a local backend found its binaries to reason.
func describe(be backend.Backend, reason string) string {
	if l, ok := be.(*localbackend.Backend); ok {
		return reason + "; PostgreSQL binaries in " + l.BinDir()
	}
	return reason
}

// hasLocalData reports whether the local backend keeps a data directory
// for project under root: evidence that a project recorded without its
// backend lives there.
func hasLocalData(root, project string) bool {
	fi, err := os.Stat(filepath.Join(root, project, "data"))
	return err == nil && fi.IsDir()
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
