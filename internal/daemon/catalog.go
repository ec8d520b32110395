package daemon

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
	"github.com/pgwake/pgwake/internal/state"
)

// catalogSyncEvery is how often the daemon reads the projects of backends
// that keep them (a Kubernetes namespace) from their caches: what another
// pgwake created or removed shows up here within it.
const catalogSyncEvery = time.Second

// syncCatalogs runs syncCatalog for every connected backend that keeps
// its projects itself (backend.Catalog), every catalogSyncEvery until ctx
// ends.
func (d *Daemon) syncCatalogs(ctx context.Context) {
	t := time.NewTicker(catalogSyncEvery)
	defer t.Stop()
	for {
		d.syncCatalogsOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (d *Daemon) syncCatalogsOnce(ctx context.Context) {
	for _, name := range slices.Sorted(maps.Keys(d.backends)) {
		l := d.backends[name]
		if ok, _ := l.available(); !ok {
			continue
		}
		cat := l.catalog(ctx)
		if cat == nil {
			continue
		}
		if err := d.syncCatalog(ctx, name, cat); err != nil && ctx.Err() == nil {
			d.log.Warn("reading the projects of a backend that keeps them", "backend", name, "err", err)
		}
	}
}

// syncCatalog makes the state agree with a backend that is the source of
// truth for its projects: projects found there are adopted (with their
// password and settings), projects of that backend gone from there
// (removed by another pgwake or by hand) are forgotten, and settings
// changed there (pin) are taken. Projects being created or removed here
// are left to that call.
func (d *Daemon) syncCatalog(ctx context.Context, name string, cat backend.Catalog) error {
	recs, err := cat.Projects(ctx)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, r := range recs {
		seen[r.Spec.Name] = true
		if !r.Saved || !d.claimName(r.Spec.Name) {
			continue // being created, here or by another pgwake
		}
		d.adoptRecord(ctx, name, r)
		d.releaseName(r.Spec.Name)
	}
	for _, p := range d.store.Projects() {
		if p.Backend != name || seen[p.Name] || !d.claimName(p.Name) {
			continue
		}
		if _, err := d.store.Get(p.Name); err == nil {
			d.forget(p.Name)
		}
		d.releaseName(p.Name)
	}
	return nil
}

// adoptRecord registers a project found on backend name, or takes its
// settings when it is known already.
func (d *Daemon) adoptRecord(ctx context.Context, name string, r backend.Record) {
	log := d.log.With("project", r.Spec.Name, "backend", name)
	if p, err := d.store.Get(r.Spec.Name); err == nil {
		if p.Backend != name {
			log.Warn("a project of this name lives on another backend here; the one in the cluster is not served", "here", p.Backend)
			return
		}
		if p.Pinned != r.Pinned {
			if err := d.store.Update(p.Name, func(q *state.Project) { q.Pinned = r.Pinned }); err == nil {
				_ = d.srv.SetPinned(p.Name, r.Pinned)
				d.hub.changed(p.Name)
			}
		}
		// Settings another pgwake changed, unless pgwake.yaml here
		// declares the project: then the file's apply.
		if p.Adopted == "" && !maps.Equal(p.Settings, r.Spec.Settings) && !d.declared(p.Name) {
			settings := maps.Clone(r.Spec.Settings)
			if err := d.store.Update(p.Name, func(q *state.Project) { q.Settings = settings }); err == nil {
				_ = d.srv.SetSettings(p.Name, settings)
				d.hub.changed(p.Name)
			}
		}
		// An adopted object's owner may change its annotations (sleep-after)
		// or its Secret (the password `pgwake url` shows) at any time.
		if p.Adopted != "" && (p.SleepAfter != r.SleepAfter || p.Password != r.Spec.Password) {
			if err := d.store.Update(p.Name, func(q *state.Project) { q.SleepAfter, q.Password = r.SleepAfter, r.Spec.Password }); err == nil {
				_ = d.srv.SetSleepAfter(p.Name, r.SleepAfter)
				// Who authenticates follows: pgwake with the Secret's
				// password, the server when there is none.
				_ = d.srv.SetPassword(p.Name, r.Spec.Password, "")
				d.hub.changed(p.Name)
			}
		}
		return
	}
	p := state.Project{
		Name: r.Spec.Name, Image: r.Spec.Image, User: r.Spec.User, Password: r.Spec.Password,
		Database: r.Spec.Database, SleepAfter: r.SleepAfter, SleepMode: string(r.SleepMode),
		Pinned: r.Pinned, Ephemeral: r.Ephemeral, Backend: name, CreatedAt: r.CreatedAt, Adopted: r.Adopted,
		Parent: r.Parent, BranchedAt: r.BranchedAt, Settings: maps.Clone(r.Spec.Settings),
	}
	if p.SleepMode == "" {
		p.SleepMode = string(backend.SleepStop)
	}
	ln, err := d.claimPort(&p)
	if err != nil {
		log.Warn("no port of its own for an adopted project; it is reached on the shared port", "err", err)
		p.NoPort, p.Port = true, 0
	}
	p, _, err = d.store.Add(p)
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		log.Warn("adopting a project found on its backend", "err", err)
		return
	}
	if err := d.srv.AddProject(ctx, d.proxyProject(p)); err != nil {
		if ln != nil {
			ln.Close()
		}
		_ = d.store.Remove(p.Name, false)
		log.Warn("adopting a project found on its backend", "err", err)
		return
	}
	if ln != nil {
		d.addProjectPort(p.Name, ln)
	}
	d.hub.changed(p.Name)
	if p.Adopted != "" {
		log.Info("project adopted from an annotated object; pgwake sleeps and wakes it and never deletes it", "object", p.Adopted, "port", p.Port)
		return
	}
	log.Info("project adopted from its backend (created elsewhere or before this pgwake)", "port", p.Port)
}

// forget drops a project that its backend no longer holds; its data is
// that backend's business.
func (d *Daemon) forget(name string) {
	if err := d.srv.RemoveProject(name); err != nil && !errors.Is(err, proxy.ErrNoProject) {
		d.log.Warn("forgetting a removed project", "project", name, "err", err)
	}
	d.closeProjectPort(name)
	_ = d.store.Remove(name, false)
	d.hub.changed(name)
	d.log.Info("project removed on its backend by someone else; forgotten", "project", name)
}

// claimName marks a project name busy (a create, remove or sync acts on
// it); false if it is busy already.
func (d *Daemon) claimName(name string) bool {
	d.busyMu.Lock()
	defer d.busyMu.Unlock()
	if d.busy[name] {
		return false
	}
	if d.busy == nil {
		d.busy = map[string]bool{}
	}
	d.busy[name] = true
	return true
}

func (d *Daemon) releaseName(name string) {
	d.busyMu.Lock()
	defer d.busyMu.Unlock()
	delete(d.busy, name)
}

// declared reports whether pgwake.yaml declares project.
func (d *Daemon) declared(project string) bool {
	for _, pc := range d.cfg.Projects {
		if pc.Name == project {
			return true
		}
	}
	return false
}

// record is p as a catalog stores it.
func record(p state.Project) backend.Record {
	return backend.Record{
		Spec: spec(p), SleepAfter: p.SleepAfter, SleepMode: backend.SleepMode(p.SleepMode),
		Pinned: p.Pinned, Ephemeral: p.Ephemeral, CreatedAt: p.CreatedAt, Saved: true, Adopted: p.Adopted,
		Parent: p.Parent, BranchedAt: p.BranchedAt,
	}
}
