package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/state"
)

// ErrNothingToPurge is Purge's answer for a state dir without state.
var ErrNothingToPurge = errors.New("no pgwake state here")

// Purge is `down --volumes` without a running daemon (after a crash, or
// a kill): it removes every project of the state dir with its data and,
// on each backend, everything labelled with its instance, exactly as a
// daemon's `down --volumes` does. It takes the state dir's lock, so it
// refuses while a daemon runs.
func Purge(ctx context.Context, cfg config.Config, log *slog.Logger, opts Options) error {
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "state.json")); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w (%s)", ErrNothingToPurge, cfg.StateDir)
	}
	if opts.Connect == nil {
		opts.Connect = ConnectBackend
	}
	d := &Daemon{cfg: cfg, log: log, opts: opts, backends: map[string]*lazyBackend{}}
	defer d.release()
	unlock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return err
	}
	d.cleanups = append(d.cleanups, unlock)
	if d.store, err = state.Open(cfg.StateDir); err != nil {
		return err
	}
	if err := d.openBackends(ctx); err != nil {
		return fmt.Errorf("cannot reach what pgwake created: %w", err)
	}
	if err := d.removeOnShutdown(ctx, true); err != nil {
		return err
	}
	// A backend that cannot be reached kept what pgwake made there: say
	// so rather than report everything removed.
	var errs []error
	for _, l := range d.backends {
		if ok, err := l.available(); !ok {
			errs = append(errs, fmt.Errorf("what pgwake created on the %s backend is left: %w", l.name, err))
		}
	}
	return errors.Join(errs...)
}
