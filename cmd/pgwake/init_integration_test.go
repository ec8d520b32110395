package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgwake/pgwake/internal/admin"
)

// TestIntegrationInitThroughConfig: pgwake.yaml's init and settings, and
// create's --init and --set, through the binary: scripts run once, at the
// first start; settings apply, and a changed one in pgwake.yaml applies at
// the next start after pgwake restarts; a failing script puts its project
// in the error state, clients get an ErrorResponse naming the script and
// the server's message, also after a restart, and it never runs again.
func TestIntegrationInitThroughConfig(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	write := func(name, body string) {
		t.Helper()
		p := filepath.Join(h.dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("db/init/01-schema.sql", "CREATE TABLE runs (at timestamptz DEFAULT now());")
	write("db/init/02-seed.sql", "INSERT INTO runs DEFAULT VALUES;")
	write("db/init/notes.txt", "not a script: ignored")
	write("bad.sql", "CREATE TABLE t (x int);\nINSERT INTO nope VALUES (1);\n")
	yaml := func(workMem string) string {
		return "projects:\n" +
			"  - name: app\n    init: db/init\n    settings:\n      work_mem: " + workMem + "\n      shared_buffers: 16MB\n" +
			"  - name: bad\n    init: [bad.sql]\n"
	}
	write("pgwake.yaml", yaml("7MB"))
	h.up(t)

	one := func(conn *pgx.Conn, sql string) string {
		t.Helper()
		var s string
		if err := conn.QueryRow(t.Context(), sql).Scan(&s); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return s
	}
	conn := h.connect(t, "app")
	if got := one(conn, "SELECT count(*)::text FROM runs"); got != "1" {
		t.Errorf("rows after the first start: %s, want 1", got)
	}
	if got := one(conn, "SHOW work_mem") + " " + one(conn, "SHOW shared_buffers"); got != "7MB 16MB" {
		t.Errorf("settings: %s, want 7MB 16MB", got)
	}
	conn.Close(t.Context())
	p := h.mustProject(t, "app")
	if strings.Join(p.Init, ",") != "01-schema.sql,02-seed.sql" || p.Settings["work_mem"] != "7MB" {
		t.Errorf("ls --json: init %q settings %v", p.Init, p.Settings)
	}
	h.ok(t, "sleep", "app")
	conn = h.connect(t, "app")
	if got := one(conn, "SELECT count(*)::text FROM runs"); got != "1" {
		t.Errorf("rows after a sleep and wake: %s, want 1 (init ran again)", got)
	}
	conn.Close(t.Context())

	// The failing project: the client gets an ErrorResponse with the
	// script and the server's message; ls shows the error state.
	events, err := h.admin().Events(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	const serverMsg = `relation "nope" does not exist`
	wantRefused := func(when string, want ...string) {
		t.Helper()
		url := strings.TrimSpace(h.ok(t, "url", "bad"))
		ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
		defer cancel()
		c, err := pgx.Connect(ctx, url)
		if err == nil {
			c.Close(context.Background())
			t.Fatalf("%s: connected to a project whose init failed", when)
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "08006" {
			t.Fatalf("%s: %v, want an 08006 ErrorResponse", when, err)
		}
		for _, w := range append(want, "bad.sql", serverMsg) {
			if !strings.Contains(pe.Message, w) {
				t.Errorf("%s: the client's error %q lacks %q", when, pe.Message, w)
			}
		}
	}
	wantRefused("first start")
	if !watchProjects(t, events, time.Minute, func(p admin.Project) bool {
		return p.Name == "bad" && p.State == "error" && strings.Contains(p.InitError, "init script bad.sql failed")
	}) {
		t.Fatalf("bad is not in the error state with its init error: %+v", h.mustProject(t, "bad"))
	}
	wantRefused("again", "pgwake rm --volumes bad")
	if ls := h.ok(t, "ls"); !strings.Contains(ls, "error") {
		t.Errorf("ls does not show the error state:\n%s", ls)
	}

	// Restart with a changed setting: it applies at app's next start,
	// init does not run again; bad stays refused, before any wake too.
	h.ok(t, "down")
	write("pgwake.yaml", yaml("9MB"))
	h.up(t)
	if p := h.mustProject(t, "bad"); p.State != "error" || !strings.Contains(p.LastError, serverMsg) {
		t.Errorf("after a restart bad is %q (%q), want error with the server's message", p.State, p.LastError)
	}
	conn = h.connect(t, "app")
	if got := one(conn, "SHOW work_mem"); got != "9MB" {
		t.Errorf("work_mem after pgwake.yaml changed it: %s, want 9MB", got)
	}
	if got := one(conn, "SELECT count(*)::text FROM runs"); got != "1" {
		t.Errorf("rows after the restart: %s, want 1", got)
	}
	conn.Close(t.Context())
	wantRefused("after a restart", "pgwake rm --volumes bad")
	logs := h.ok(t, "logs", "bad")
	if n := strings.Count(logs, "running /docker-entrypoint-initdb.d/0001-1-bad.sql"); n != 1 {
		t.Errorf("bad.sql ran %d times, want once:\n%s", n, logs)
	}
	// The way out.
	h.ok(t, "rm", "--volumes", "bad")

	// create's flags, and their one-line errors.
	write("extra/one.sql", "CREATE TABLE extra (x int); INSERT INTO extra VALUES (42);")
	h.ok(t, "create", "flags", "--init", "extra", "--set", "work_mem=5MB", "--set", "Maintenance_Work_Mem=70MB")
	conn = h.connect(t, "flags")
	if got := one(conn, "SELECT x::text FROM extra") + " " + one(conn, "SHOW work_mem") + " " + one(conn, "SHOW maintenance_work_mem"); got != "42 5MB 70MB" {
		t.Errorf("create --init --set: %s, want 42 5MB 70MB", got)
	}
	conn.Close(t.Context())
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "x", "--init", "missing.sql"}, "--init missing.sql: no such file or folder"},
		{[]string{"create", "x", "--init", "pgwake.yaml"}, "not a .sql, .sql.gz or .sh file"},
		{[]string{"create", "x", "--set", "work-mem=1MB"}, "not a Postgres setting name"},
		{[]string{"create", "x", "--set", "work_mem"}, "want NAME=VALUE"},
		{[]string{"create", "x", "--set", "port=5433"}, "managed by pgwake"},
	} {
		if r := h.fail(t, tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("pgwake %s: exit %d, %q; want 2 and %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}
	if _, ok := h.project(t, "x"); ok {
		t.Error("a refused create made a project")
	}
	h.ok(t, "down")
}
