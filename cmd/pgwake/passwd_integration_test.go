package main

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestIntegrationPasswd: `pgwake passwd` rotates a sleeping project's
// password on its server and in pgwake: the new URL logs in (through
// pgwake's SCRAM and pgwake's own login to the server, after a sleep too),
// the old password gets 28P01 from pgwake, a session opened before keeps
// working, and --password-stdin sets a chosen one.
func TestIntegrationPasswd(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.up(t)
	h.ok(t, "create", "acct")
	before := h.connect(t, "acct")
	h.exec(t, before, "create table ledger (n int); insert into ledger values (7)")
	oldURL := strings.TrimSpace(h.ok(t, "url", "acct"))
	if p := h.mustProject(t, "acct"); p.Auth != "scram" {
		t.Fatalf("auth %q, want scram", p.Auth)
	}

	newURL := strings.TrimSpace(h.ok(t, "passwd", "acct"))
	if newURL == oldURL || newURL != strings.TrimSpace(h.ok(t, "url", "acct")) {
		t.Fatalf("passwd printed %q; url says %q; the old one was %q", newURL, h.ok(t, "url", "acct"), oldURL)
	}
	var n int
	if err := before.QueryRow(t.Context(), "select n from ledger").Scan(&n); err != nil || n != 7 {
		t.Fatalf("session opened before the change: %d, %v", n, err)
	}
	login := func(u string) error {
		c, err := pgx.Connect(t.Context(), u)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		return c.QueryRow(t.Context(), "select n from ledger").Scan(&n)
	}
	if err := login(newURL); err != nil {
		t.Fatalf("new password: %v", err)
	}
	var pe *pgconn.PgError
	if err := login(oldURL); !errors.As(err, &pe) || pe.Code != "28P01" {
		t.Fatalf("old password: %v, want 28P01", err)
	}
	// The server itself has it: pgwake's login after a cold start uses it.
	before.Close(t.Context())
	h.ok(t, "sleep", "acct")
	if err := login(newURL); err != nil {
		t.Fatalf("new password after a sleep: %v", err)
	}

	cmd := exec.Command(h.bin, "passwd", "acct", "--password-stdin")
	cmd.Env, cmd.Dir, cmd.Stdin = h.env, h.dir, strings.NewReader("chosen secret\n")
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), "chosen%20secret@") {
		t.Fatalf("passwd --password-stdin: %v, %q", err, out)
	}
	if err := login(strings.TrimSpace(string(out))); err != nil {
		t.Fatalf("chosen password: %v", err)
	}

	if r := h.fail(t, "passwd", "nope"); !strings.Contains(r.stderr, "nope") {
		t.Errorf("passwd of a missing project: %q", r.stderr)
	}
}
