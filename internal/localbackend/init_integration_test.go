package localbackend

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgwake/pgwake/internal/backend"
)

// scripts writes init scripts into a new folder (one the server's user
// may not reach, as pgwake's state dir) and returns their paths in order.
// Names ending in "+x" are made executable (without it).
func scripts(t *testing.T, files ...[2]string) []string {
	t.Helper()
	dir := t.TempDir()
	var out []string
	for _, f := range files {
		name, body := f[0], []byte(f[1])
		mode := os.FileMode(0o600)
		if n, ok := strings.CutSuffix(name, "+x"); ok {
			name, mode = n, 0o700
		}
		if strings.HasSuffix(name, ".gz") {
			var buf bytes.Buffer
			zw := gzip.NewWriter(&buf)
			zw.Write(body)
			zw.Close()
			body = buf.Bytes()
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, body, mode); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// query runs one query returning one text value.
func query(t *testing.T, ep backend.Endpoint, spec backend.Spec, sql string) string {
	t.Helper()
	serve(t, ep, spec)
	url := fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", spec.User, spec.Password, ep.Addr, spec.Database)
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var s string
	if err := conn.QueryRow(t.Context(), sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

// TestIntegrationInitAndSettings: init scripts of every kind run once, at
// the first start, on a server that has the settings; settings apply at
// every start, a changed one at the next.
func TestIntegrationInitAndSettings(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	b := newBackend(t, root)
	spec := testSpec("initok")
	spec.Init = scripts(t,
		[2]string{"01-schema.sql", `
			DO $$ BEGIN
				IF current_setting('work_mem') <> '7MB' THEN
					RAISE EXCEPTION 'init runs without the settings: work_mem %', current_setting('work_mem');
				END IF;
			END $$;
			CREATE TABLE runs (script text);
			INSERT INTO runs VALUES ('schema');`},
		[2]string{"02-seed.sql.gz", `INSERT INTO runs VALUES ('seed');`},
		[2]string{"03-exec.sh+x", "#!/bin/sh\nset -e\npsql -v ON_ERROR_STOP=1 -X -c \"INSERT INTO runs VALUES ('exec')\"\n"},
		[2]string{"04-sourced.sh", "psql -v ON_ERROR_STOP=1 -X -c \"INSERT INTO runs VALUES ('sourced:$POSTGRES_DB')\"\n"},
	)
	spec.Settings = map[string]string{"work_mem": "7MB", "shared_buffers": "16MB"}
	ctx := t.Context()
	if err := b.Ensure(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if !b.WillInitialize(ctx, spec) {
		t.Error("WillInitialize is false before the first start that runs init scripts")
	}
	ep := start(t, b, spec)
	if !ep.First {
		t.Error("the start that ran init scripts is not reported as the first")
	}
	const all = "SELECT string_agg(script, ',' ORDER BY script) FROM runs"
	want := "exec,schema,seed,sourced:app"
	if got := query(t, ep, spec, all); got != want {
		t.Fatalf("rows after the first start: %q, want %q", got, want)
	}
	if got := query(t, ep, spec, "SHOW work_mem") + " " + query(t, ep, spec, "SHOW shared_buffers"); got != "7MB 16MB" {
		t.Errorf("settings: %s, want 7MB 16MB", got)
	}
	if err := b.Sleep(ctx, spec, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	if b.WillInitialize(ctx, spec) {
		t.Error("WillInitialize is true after init ran")
	}
	spec.Settings = map[string]string{"work_mem": "9MB"}
	ep = start(t, b, spec)
	if ep.First {
		t.Error("a wake after init is reported as a first start")
	}
	if got := query(t, ep, spec, all); got != want {
		t.Fatalf("rows after a sleep and wake: %q, want each script's once", got)
	}
	if got := query(t, ep, spec, "SHOW work_mem"); got != "9MB" {
		t.Errorf("work_mem after the change: %s, want 9MB", got)
	}
	// A value Postgres rejects is the server's own error at start.
	if err := b.Sleep(ctx, spec, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	spec.Settings = map[string]string{"work_mem": "lots"}
	if _, err := b.Start(ctx, spec); err == nil || !strings.Contains(err.Error(), "work_mem") {
		t.Errorf("Start with work_mem=lots: %v, want the server's error naming work_mem", err)
	}
}

// TestIntegrationInitFailure: a failing script makes the first start fail
// with an InitError naming it and the server's message; every later start
// fails the same way, also from a new Backend (a restarted pgwake), and
// the scripts never run again.
func TestIntegrationInitFailure(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	b := newBackend(t, root)
	spec := testSpec("initbad")
	spec.Init = scripts(t,
		[2]string{"01-ok.sql", "CREATE TABLE t (x int); INSERT INTO t VALUES (1);"},
		[2]string{"02-bad.sql", "INSERT INTO t VALUES (2);\nINSERT INTO nope VALUES (1);\n"},
		[2]string{"03-never.sql", "INSERT INTO t VALUES (3);"},
	)
	ctx := t.Context()
	const serverMsg = `relation "nope" does not exist`
	check := func(b *Backend, when string) {
		t.Helper()
		_, err := b.Start(ctx, spec)
		var ie *backend.InitError
		if !errors.As(err, &ie) {
			t.Fatalf("Start %s: %v, want an InitError", when, err)
		}
		if ie.Script != "02-bad.sql" || !strings.Contains(ie.Message, serverMsg) || !strings.Contains(ie.Message, "02-bad.sql:2") {
			t.Errorf("Start %s: %+v; want script 02-bad.sql and %q at its line 2", when, ie, serverMsg)
		}
		if !strings.Contains(err.Error(), "pgwake rm --volumes initbad") {
			t.Errorf("Start %s: %q does not say the way out", when, err)
		}
		if err := b.InitFailure(ctx, spec); !errors.As(err, &ie) {
			t.Errorf("InitFailure %s: %v", when, err)
		}
		if st := status(t, b, spec); st.State != backend.StateStopped {
			t.Errorf("after Start %s the server is %s, want stopped", when, st.State)
		}
	}
	check(b, "the first time")
	check(b, "again")
	check(newBackend(t, root), "from a new backend")
	log, err := os.ReadFile(b.LogFile(spec.Name))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "running init script 01-ok.sql"); n != 1 {
		t.Errorf("01-ok.sql ran %d times, want once", n)
	}
	if strings.Contains(string(log), "03-never.sql") {
		t.Error("the script after the failed one ran")
	}
}
