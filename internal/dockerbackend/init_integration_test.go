package dockerbackend_test

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
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/dockerbackend"
	"github.com/pgwake/pgwake/internal/testenv"
)

// writeScripts writes init scripts into a new folder and returns their
// paths in order. Names ending in "+x" are made executable (without it).
func writeScripts(t testing.TB, files ...[2]string) []string {
	t.Helper()
	dir := t.TempDir()
	var out []string
	for _, f := range files {
		name, body := f[0], []byte(f[1])
		mode := os.FileMode(0o644)
		if n, ok := strings.CutSuffix(name, "+x"); ok {
			name, mode = n, 0o755
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

// startServing starts the project's server and waits until it serves.
func startServing(t testing.TB, cli *client.Client, b *dockerbackend.Backend, spec backend.Spec) *pgx.Conn {
	t.Helper()
	ep, err := b.Start(t.Context(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	waitServing(t, cli, b.ContainerName(spec.Name))
	conn, err := pgx.Connect(t.Context(), fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", spec.User, spec.Password, ep.Addr, spec.Database))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func queryString(t testing.TB, conn *pgx.Conn, sql string) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(t.Context(), sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

// containerLog is the whole log of a container.
func containerLog(t testing.TB, cli *client.Client, name string) string {
	t.Helper()
	rc, err := cli.ContainerLogs(t.Context(), name, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var buf bytes.Buffer
	if _, err := stdcopy.StdCopy(&buf, &buf, rc); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// TestIntegrationInitAndSettings: init scripts of every kind run once, at
// the first start, against a server that has the settings already;
// settings apply at every start, and a changed one at the next start (the
// container is recreated on its volume), without init running again.
func TestIntegrationInitAndSettings(t *testing.T) {
	t.Parallel()
	cli := testenv.DockerClient(t)
	img := testenv.PostgresImage(t)
	b := newBackend(t, cli, newInstance(t))
	spec := projectSpec("initok", img)
	spec.Init = writeScripts(t,
		[2]string{"01-schema.sql", `
			DO $$ BEGIN
				IF current_setting('work_mem') <> '7MB' THEN
					RAISE EXCEPTION 'init runs without the settings: work_mem %', current_setting('work_mem');
				END IF;
			END $$;
			CREATE TABLE runs (script text);
			INSERT INTO runs VALUES ('schema');`},
		[2]string{"02-seed.sql.gz", `INSERT INTO runs VALUES ('seed');`},
		[2]string{"03-exec.sh+x", "#!/bin/sh\nset -e\npsql -v ON_ERROR_STOP=1 -U \"$POSTGRES_USER\" -d \"$POSTGRES_DB\" -c \"INSERT INTO runs VALUES ('exec')\"\n"},
		[2]string{"04-sourced.sh", "psql -v ON_ERROR_STOP=1 -U \"$POSTGRES_USER\" -d \"$POSTGRES_DB\" -c \"INSERT INTO runs VALUES ('sourced')\"\n"},
	)
	spec.Settings = map[string]string{"work_mem": "7MB", "shared_buffers": "16MB"}
	ctx := t.Context()
	if err := b.Ensure(ctx, spec); err != nil {
		t.Fatal(err)
	}

	conn := startServing(t, cli, b, spec)
	const all = "SELECT string_agg(script, ',' ORDER BY script) FROM runs"
	if got := queryString(t, conn, all); got != "exec,schema,seed,sourced" {
		t.Fatalf("rows after the first start: %q, want every script's", got)
	}
	if got := queryString(t, conn, "SHOW work_mem") + " " + queryString(t, conn, "SHOW shared_buffers"); got != "7MB 16MB" {
		t.Errorf("settings: %s, want 7MB 16MB", got)
	}
	conn.Close(ctx)

	if err := b.Sleep(ctx, spec, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	conn = startServing(t, cli, b, spec)
	if got := queryString(t, conn, all); got != "exec,schema,seed,sourced" {
		t.Fatalf("rows after a sleep and wake: %q, want each script's once", got)
	}
	if got := queryString(t, conn, "SHOW work_mem"); got != "7MB" {
		t.Errorf("work_mem after a wake: %s, want 7MB", got)
	}
	conn.Close(ctx)

	// A changed setting: the next start has it, on the same data.
	if err := b.Sleep(ctx, spec, backend.SleepStop); err != nil {
		t.Fatal(err)
	}
	name := b.ContainerName(spec.Name)
	before, err := cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec.Settings = map[string]string{"work_mem": "9MB"}
	conn = startServing(t, cli, b, spec)
	if got := queryString(t, conn, "SHOW work_mem"); got != "9MB" {
		t.Errorf("work_mem after the change: %s, want 9MB", got)
	}
	if got := queryString(t, conn, "SHOW shared_buffers"); got == "16MB" {
		t.Errorf("shared_buffers is still 16MB after it was dropped from the settings")
	}
	if got := queryString(t, conn, all); got != "exec,schema,seed,sourced" {
		t.Fatalf("rows after the settings changed: %q, want each script's once", got)
	}
	after, err := cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.Container.ID == before.Container.ID {
		t.Errorf("the container was not recreated for the changed setting")
	}
	if n := strings.Count(containerLog(t, cli, name), "01-schema.sql"); n != 0 {
		t.Errorf("the recreated container's log mentions the init script %d times: init ran again", n)
	}
}

// TestIntegrationInitFailure: a failing init script leaves the project in
// an error state: the server exits at its first start (Status says which
// script failed and why), every later Start fails with an *InitError
// naming the script and the server's message, also from a new Backend (a
// restarted pgwake) and after the container is recreated, and the scripts
// never run again.
func TestIntegrationInitFailure(t *testing.T) {
	t.Parallel()
	cli := testenv.DockerClient(t)
	img := testenv.PostgresImage(t)
	inst := newInstance(t)
	b := newBackend(t, cli, inst)
	spec := projectSpec("initbad", img)
	spec.Init = writeScripts(t,
		[2]string{"01-ok.sql", "CREATE TABLE t (x int); INSERT INTO t VALUES (1);"},
		[2]string{"02-bad.sql", "INSERT INTO t VALUES (2);\nINSERT INTO nope VALUES (1);\n"},
		[2]string{"03-never.sql", "INSERT INTO t VALUES (3);"},
	)
	ctx := t.Context()
	name := b.ContainerName(spec.Name)
	if _, err := b.Start(ctx, spec); err != nil {
		t.Logf("first Start failed at once: %v", err) // the entrypoint may have exited already
	}
	w := cli.ContainerWait(ctx, name, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case r := <-w.Result:
		if r.StatusCode == 0 {
			t.Fatalf("the container exited 0 after a failing init script")
		}
	case err := <-w.Error:
		t.Fatal(err)
	}
	const serverMsg = `relation "nope" does not exist`
	st, err := b.Status(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != backend.StateStopped || !strings.Contains(st.Exit, "init script 02-bad.sql failed") || !strings.Contains(st.Log, serverMsg) {
		t.Errorf("Status after the failure = %+v; want stopped, naming 02-bad.sql, with %q", st, serverMsg)
	}

	check := func(b *dockerbackend.Backend, when string) {
		t.Helper()
		_, err := b.Start(ctx, spec)
		var ie *backend.InitError
		if !errors.As(err, &ie) || !errors.Is(err, backend.ErrInitFailed) {
			t.Fatalf("Start %s: %v, want an InitError", when, err)
		}
		if ie.Script != "02-bad.sql" || !strings.Contains(ie.Message, serverMsg) || strings.Contains(ie.Message, "/docker-entrypoint-initdb.d") {
			t.Errorf("Start %s: InitError %+v; want script 02-bad.sql and %q, without the container's path", when, ie, serverMsg)
		}
		if msg := err.Error(); !strings.Contains(msg, "pgwake rm --volumes initbad") {
			t.Errorf("Start %s: %q does not say the way out", when, msg)
		}
		if err := b.InitFailure(ctx, spec); !errors.As(err, &ie) {
			t.Errorf("InitFailure %s: %v, want the InitError", when, err)
		}
	}
	check(b, "again")
	b2 := newBackend(t, cli, inst)
	check(b2, "from a new backend")
	// Drifted (a changed setting): refused before the container (and its
	// log) is replaced; and once replaced by hand, the data still says so.
	spec.Settings = map[string]string{"work_mem": "8MB"}
	check(b2, "with changed settings")
	if _, err := cli.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	b3 := newBackend(t, cli, inst)
	check(b3, "after the container was removed by hand")

	// The scripts ran once: the first container's first start.
	res, err := cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Container.State.StartedAt != "" && !strings.HasPrefix(res.Container.State.StartedAt, "0001-") {
		t.Errorf("the recreated container was started (at %s) on half-initialised data", res.Container.State.StartedAt)
	}
}
