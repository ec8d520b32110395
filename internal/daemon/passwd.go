package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/pgauth"
	"github.com/pgwake/pgwake/internal/state"
)

// SetPassword implements admin.Service: it rotates a project's password on
// its server and in pgwake's store, so that no client sees a moment where
// neither works. The old password keeps working for clients until the
// server has the new one; pgwake's own login to the server tries the new
// one as well from the start (it is stored as pending first), so a
// rotation cut short by a crash still logs in.
func (d *Daemon) SetPassword(ctx context.Context, name string, req admin.PasswordRequest) (admin.Project, error) {
	p, err := d.store.Get(name)
	if err != nil {
		return admin.Project{}, apiErr(err)
	}
	switch {
	case p.Adopted != "":
		return admin.Project{}, admin.Invalid(fmt.Errorf("project %q is adopted from %s: its owner manages its password (change it there and in its Secret)", name, p.Adopted))
	case p.Password == "":
		return admin.Project{}, admin.Invalid(fmt.Errorf("pgwake does not hold project %q's password", name))
	}
	pw := req.Password
	if pw == "" {
		pw = state.NewPassword()
	}
	switch {
	case strings.ContainsRune(pw, 0):
		return admin.Project{}, admin.Invalid(errors.New("a password cannot contain a NUL byte"))
	case pw == p.Password:
		return admin.Project{}, admin.Invalid(fmt.Errorf("that is project %q's password already", name))
	}
	if !d.claimName(name) {
		return admin.Project{}, admin.Conflict(fmt.Errorf("project %q is busy (being created, removed or copied); try again", name))
	}
	defer d.releaseName(name)

	// Pending first, durably: from here on pgwake can log in to the
	// server whichever of the two it has.
	if err := d.store.Update(name, func(q *state.Project) { q.PendingPassword = pw }); err != nil {
		return admin.Project{}, apiErr(err)
	}
	if err := d.srv.SetPassword(name, p.Password, pw); err != nil {
		return admin.Project{}, apiErr(err)
	}
	err = d.srv.WithAwake(ctx, name, func(ctx context.Context) error { return d.alterPassword(ctx, p, pw) })
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			// The server refused the statement: it keeps the old one.
			_ = d.store.Update(name, func(q *state.Project) { q.PendingPassword = "" })
			_ = d.srv.SetPassword(name, p.Password, "")
		}
		return admin.Project{}, fmt.Errorf("set project %q's password on its server: %w", name, err)
	}
	if err := d.store.Update(name, func(q *state.Project) { q.Password, q.PendingPassword = pw, "" }); err != nil {
		return admin.Project{}, apiErr(err)
	}
	if err := d.srv.SetPassword(name, pw, ""); err != nil {
		return admin.Project{}, apiErr(err)
	}
	d.saveToCatalog(name) // Kubernetes keeps it in the project's Secret
	d.hub.changed(name)
	d.log.Info("password changed", "project", name)
	return d.Project(name)
}

// alterPassword logs in to p's server through pgwake's own shared port
// with the password clients use now, and gives the role the new one. The
// verifier, not the password, goes in the statement, where log_statement
// or pg_stat_statements would keep it.
func (d *Daemon) alterPassword(ctx context.Context, p state.Project, password string) error {
	conn, err := pgconn.Connect(ctx, d.sharedURL(p))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sql, err := pgauth.SetPasswordSQL(p.User, password)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, sql).ReadAll()
	return err
}
