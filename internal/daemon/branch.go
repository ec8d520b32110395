package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/pgauth"
	"github.com/pgwake/pgwake/internal/proxy"
	"github.com/pgwake/pgwake/internal/state"
)

// brancher returns the backend's copier, or nil when its runtime cannot
// copy data (or does not answer: then err says why).
func (l *lazyBackend) brancher(ctx context.Context) (backend.Brancher, error) {
	be, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	br, _ := be.(backend.Brancher)
	return br, nil
}

// brancherOf returns p's backend's copier, or an error for a project whose
// data pgwake cannot copy.
func (d *Daemon) brancherOf(ctx context.Context, p state.Project) (backend.Brancher, error) {
	if p.Adopted != "" {
		return nil, admin.Invalid(fmt.Errorf("project %q is %s, which pgwake adopted: its data is its owner's to copy", p.Name, p.Adopted))
	}
	br, err := d.backendOf(p).brancher(ctx)
	if err != nil {
		return nil, err
	}
	if br == nil {
		return nil, admin.Invalid(fmt.Errorf("the %s backend cannot branch, snapshot or reset projects yet", p.Backend))
	}
	return br, nil
}

// dropPending removes a branch a killed pgwake left half made (its data
// may be a partial copy, or none, from which a start would run initdb),
// with its data: its source keeps the real one. If the backend cannot do
// it now, the project stays pending and unserved until a later start.
func (d *Daemon) dropPending(ctx context.Context, p state.Project) {
	d.log.Warn("removing a branch whose copy was cut short (pgwake was stopped during it)", "project", p.Name, "parent", p.Parent)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := d.backendOf(p).Remove(rctx, spec(p), true); err != nil {
		d.log.Error("cannot remove the half-made branch now; it is not served", "project", p.Name, "err", err)
		return
	}
	if err := d.store.Remove(p.Name, false); err != nil {
		d.log.Error("remove the half-made branch from the state", "project", p.Name, "err", err)
	}
}

// branchSource checks a create request's From and returns its project.
func (d *Daemon) branchSource(ctx context.Context, req admin.CreateRequest) (state.Project, error) {
	s, err := d.store.Get(req.From)
	if err != nil {
		return state.Project{}, admin.NotFound(fmt.Errorf("branch source: %w", err))
	}
	if req.Image != "" && req.Image != s.Image {
		return state.Project{}, admin.Invalid(fmt.Errorf("a branch runs its source's image (%s), not %s: its data is that server's", s.Image, req.Image))
	}
	if len(req.Init) > 0 {
		return state.Project{}, admin.Invalid(errors.New("a branch's data is its source's: init scripts do not run on it"))
	}
	if s.InitError != "" {
		return state.Project{}, admin.Conflict(fmt.Errorf("project %q failed its init scripts; its data is half-initialised and not copied", s.Name))
	}
	if _, err := d.brancherOf(ctx, s); err != nil {
		return state.Project{}, err
	}
	return s, nil
}

var validLabel = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// copyHeld runs copy with p's server held still: asleep (the caller keeps
// clients waiting; copy gets live false and copies the stopped files) when
// it sleeps stopped, else awake (live true: a base backup from the
// server, which serves its clients meanwhile). A server that sleeps
// paused is woken for the backup: its files are not whole.
func (d *Daemon) copyHeld(ctx context.Context, name, why string, copy func(ctx context.Context, live bool) error) error {
	err := d.srv.HoldAsleep(ctx, name, proxy.HoldNoStop, false, why, func(ctx context.Context) error { return copy(ctx, false) })
	if errors.Is(err, proxy.ErrAwake) || errors.Is(err, backend.ErrNotStopped) {
		err = d.srv.WithAwake(ctx, name, func(ctx context.Context) error { return copy(ctx, true) })
	}
	return err
}

// branchData makes dst's data a copy of src's (the caller made dst's state
// entry; a failure is rolled back by the caller's Remove with volumes) and
// creates dst's server on it. The copy's superuser gets dst's own password
// in the copy where the backend can do that; else the server is started
// once, the password changed through src's, and stopped again.
func (d *Daemon) branchData(ctx context.Context, src, dst state.Project) error {
	br, err := d.brancherOf(ctx, src)
	if err != nil {
		return err
	}
	var passwordSet bool
	err = d.copyHeld(ctx, src.Name, "branch "+dst.Name, func(ctx context.Context, live bool) (err error) {
		passwordSet, err = br.Branch(ctx, spec(src), spec(dst), live)
		return err
	})
	if err != nil {
		return err
	}
	be := d.backendOf(dst)
	if err := be.Ensure(ctx, spec(dst)); err != nil {
		return err
	}
	if passwordSet {
		return nil
	}
	return d.setPassword(ctx, be, spec(dst), src.Password)
}

// setPassword starts sp's server, logs in with the password its data
// knows (was) and sets sp.Password, then stops the server.
func (d *Daemon) setPassword(ctx context.Context, be backend.Backend, sp backend.Spec, was string) (err error) {
	ctx, cancel := context.WithTimeout(ctx, max(d.cfg.FirstStartTimeout, time.Minute))
	defer cancel()
	ep, err := be.Start(ctx, sp)
	if err != nil {
		return fmt.Errorf("start the branch to set its password: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if serr := be.Sleep(sctx, sp, backend.SleepStop); serr != nil {
			err = errors.Join(err, serr)
		}
	}()
	host, port, err := net.SplitHostPort(ep.Addr)
	if err != nil {
		return err
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(sp.User, was), Host: net.JoinHostPort(host, port),
		Path: "/" + sp.Database, RawQuery: "sslmode=disable&connect_timeout=5"}
	var conn *pgconn.PgConn
	for {
		conn, err = pgconn.Connect(ctx, u.String())
		if err == nil {
			break
		}
		// Starting up (57P03, or nothing listening yet): wait; anything
		// else (a wrong password) will not change.
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code != "57P03" {
			return fmt.Errorf("log in to the branch: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("log in to the branch: %w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The verifier, not the password, goes in the statement, where
	// log_statement or pg_stat_statements would keep it.
	sql, err := pgauth.SetPasswordSQL(sp.User, sp.Password)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
		return fmt.Errorf("set the branch's password: %w", err)
	}
	return nil
}

// Snapshot implements admin.Service.
func (d *Daemon) Snapshot(ctx context.Context, name string, req admin.SnapshotRequest) (admin.Snapshot, error) {
	p, err := d.store.Get(name)
	if err != nil {
		return admin.Snapshot{}, apiErr(err)
	}
	label := req.Label
	if label == "" {
		label = time.Now().UTC().Format("20060102-150405")
	}
	if err := checkLabel(label); err != nil {
		return admin.Snapshot{}, err
	}
	br, err := d.brancherOf(ctx, p)
	if err != nil {
		return admin.Snapshot{}, err
	}
	var snap backend.Snapshot
	err = d.copyHeld(ctx, name, "snapshot "+label, func(ctx context.Context, live bool) (err error) {
		snap, err = br.Snapshot(ctx, spec(p), label, live)
		return err
	})
	if err != nil {
		return admin.Snapshot{}, apiErr(err)
	}
	d.log.Info("snapshot taken", "project", name, "label", label, "bytes", snap.Bytes)
	if snap.Bytes > 0 {
		err := d.store.Update(name, func(p *state.Project) {
			if p.SnapshotBytes == nil {
				p.SnapshotBytes = map[string]int64{}
			}
			p.SnapshotBytes[label] = snap.Bytes
		})
		if err != nil {
			d.log.Warn("recording the snapshot's size", "project", name, "label", label, "err", err)
		}
	}
	d.hub.changed(name)
	return apiSnapshot(snap), nil
}

func apiSnapshot(s backend.Snapshot) admin.Snapshot {
	return admin.Snapshot{Label: s.Label, TakenAt: s.Taken, Bytes: s.Bytes}
}

// Snapshots implements admin.Service.
func (d *Daemon) Snapshots(ctx context.Context, name string) ([]admin.Snapshot, error) {
	p, err := d.store.Get(name)
	if err != nil {
		return nil, apiErr(err)
	}
	br, err := d.brancherOf(ctx, p)
	if err != nil {
		return nil, err
	}
	// Sizes recorded when the snapshots were taken first: the runtime is
	// asked to measure only those it has none for (taken by an older
	// pgwake, or by another).
	snaps, err := br.Snapshots(ctx, spec(p), false)
	if err != nil {
		return nil, apiErr(err)
	}
	if !knownSizes(snaps, p.SnapshotBytes) {
		if snaps, err = br.Snapshots(ctx, spec(p), true); err != nil {
			return nil, apiErr(err)
		}
		knownSizes(snaps, p.SnapshotBytes)
	}
	out := make([]admin.Snapshot, 0, len(snaps))
	for _, s := range snaps {
		out = append(out, apiSnapshot(s))
	}
	return out, nil
}

// knownSizes gives the snapshots without a size the one recorded for
// their label and reports whether every one has a size now.
func knownSizes(snaps []backend.Snapshot, recorded map[string]int64) bool {
	all := true
	for i := range snaps {
		if snaps[i].Bytes == 0 {
			snaps[i].Bytes = recorded[snaps[i].Label]
		}
		all = all && snaps[i].Bytes > 0
	}
	return all
}

// checkLabel refuses what cannot be a snapshot's label (a path, say).
func checkLabel(label string) error {
	if !validLabel.MatchString(label) {
		return admin.Invalid(fmt.Errorf("snapshot label %q: use up to 63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit", label))
	}
	return nil
}

// DeleteSnapshot implements admin.Service.
func (d *Daemon) DeleteSnapshot(ctx context.Context, name, label string) error {
	if err := checkLabel(label); err != nil {
		return err
	}
	p, err := d.store.Get(name)
	if err != nil {
		return apiErr(err)
	}
	br, err := d.brancherOf(ctx, p)
	if err != nil {
		return err
	}
	if err := br.DeleteSnapshot(ctx, spec(p), label); err != nil {
		if errors.Is(err, backend.ErrNotFound) {
			return admin.NotFound(err)
		}
		return apiErr(err)
	}
	if _, ok := p.SnapshotBytes[label]; ok {
		err := d.store.Update(name, func(p *state.Project) { delete(p.SnapshotBytes, label) })
		if err != nil {
			d.log.Warn("forgetting the snapshot's size", "project", name, "label", label, "err", err)
		}
	}
	return nil
}

// Reset implements admin.Service: the project is held asleep (clients
// that connect meanwhile wait, then wake it on the snapshot's data), its
// server stopped if it runs, and its data replaced by the snapshot's.
func (d *Daemon) Reset(ctx context.Context, name string, req admin.ResetRequest) (admin.Snapshot, error) {
	if req.Label != "" {
		if err := checkLabel(req.Label); err != nil {
			return admin.Snapshot{}, err
		}
	}
	p, err := d.store.Get(name)
	if err != nil {
		return admin.Snapshot{}, apiErr(err)
	}
	br, err := d.brancherOf(ctx, p)
	if err != nil {
		return admin.Snapshot{}, err
	}
	snaps, err := br.Snapshots(ctx, spec(p), false) // sizes would cost seconds
	if err != nil {
		return admin.Snapshot{}, apiErr(err)
	}
	var snap *backend.Snapshot
	for i := range snaps {
		if req.Label == "" || snaps[i].Label == req.Label {
			snap = &snaps[i] // the latest, with no label: they come oldest first
		}
	}
	switch {
	case snap == nil && req.Label == "":
		return admin.Snapshot{}, admin.NotFound(fmt.Errorf("project %q has no snapshots: take one with `pgwake snapshot %s`", name, name))
	case snap == nil:
		return admin.Snapshot{}, admin.NotFound(fmt.Errorf("project %q has no snapshot %q (`pgwake snapshots %s` lists them)", name, req.Label, name))
	}
	start := time.Now()
	err = d.srv.HoldAsleep(ctx, name, proxy.HoldStopDiscard, req.Force, "reset to snapshot "+snap.Label, func(ctx context.Context) error {
		return br.Restore(ctx, spec(p), snap.Label)
	})
	var busy *proxy.BusyError
	if errors.As(err, &busy) {
		return admin.Snapshot{}, admin.Conflict(fmt.Errorf("%w: reset refused (--force ends them with FATAL 57P01)", err))
	}
	if err != nil {
		return admin.Snapshot{}, apiErr(err)
	}
	d.log.Info("project reset", "project", name, "snapshot", snap.Label, "took", time.Since(start).Round(time.Millisecond))
	return apiSnapshot(*snap), nil
}
