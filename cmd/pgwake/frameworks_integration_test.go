package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/config"
)

// Real frameworks and clients against a project, given nothing but what
// `pgwake env app` prints: Django's test runner, createdb/psql/dropdb, pgx
// with a database per test, and user-name routing on the shared port. The
// test never builds a project URL of its own; at most it swaps the database
// name in the printed one, as a test suite with a database per test does.

// systemPython is Debian's python3, which python3-django and
// python3-psycopg2 install into; a pyenv python may come first on PATH.
const systemPython = "/usr/bin/python3"

// envProject starts pgwake, creates project app as a user would (no
// --port: by default a project gets a port of its own from port_range,
// where every database of its server is reachable) and returns what
// `pgwake env app --format json` prints, with the daemon's info.
func envProject(t *testing.T) (*cliHarness, admin.Info, map[string]string) {
	t.Helper()
	h := newHarness(t)
	// The first start runs initdb, which took over a minute (the default
	// wake_timeout) with the machine's load at 25 on two cores.
	h.env = append(h.env, "PGWAKE_WAKE_TIMEOUT="+cmdTimeout.String())
	info, _ := h.up(t)
	h.ok(t, "create", "app")
	h.ok(t, "wake", "app")
	t.Logf("app's first start (initdb) took %.0f ms", h.mustProject(t, "app").FirstStartMS)
	out := h.ok(t, "env", "app", "--format", "json")
	var vars map[string]string
	if err := json.Unmarshal([]byte(out), &vars); err != nil {
		t.Fatalf("env app --format json: %v\n%s", err, out)
	}
	for _, k := range []string{"DATABASE_URL", "PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE"} {
		if vars[k] == "" {
			t.Fatalf("env app --format json has no %s:\n%s", k, out)
		}
	}
	low, high, err := h.portRange()
	if err != nil {
		t.Fatal(err)
	}
	_, shared, _ := net.SplitHostPort(info.Listen)
	t.Logf("pgwake env app: PGPORT %s, PGDATABASE %s; the shared port is %s", vars["PGPORT"], vars["PGDATABASE"], shared)
	if port, err := strconv.Atoi(vars["PGPORT"]); err != nil || port < low || port > high || vars["PGPORT"] == shared {
		t.Errorf("env app: PGPORT %q (shared port %s); want a port of the project's own in port_range %d-%d",
			vars["PGPORT"], shared, low, high)
	}
	return h, info, vars
}

// portRange is the daemon's port_range: the harness's PGWAKE_PORT_RANGE,
// or the default.
func (h *cliHarness) portRange() (low, high int, err error) {
	cfg := config.Default()
	for _, kv := range h.env {
		if v, ok := strings.CutPrefix(kv, "PGWAKE_PORT_RANGE="); ok {
			cfg.PortRange = v
		}
	}
	return cfg.Ports()
}

// clientEnv is the harness's environment without the PG* variables (other
// than pgwake's own) and DATABASE_URL the user may have set: only what
// `pgwake env` prints may reach the clients.
func (h *cliHarness) clientEnv(extra ...string) []string {
	var env []string
	for _, kv := range h.env {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(name, "PG") && !strings.HasPrefix(name, "PGWAKE_"):
		case name == "DATABASE_URL", name == "DJANGO_SETTINGS_MODULE", name == "PYTHONPATH", name == "PYTHONHOME":
		default:
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// evalEnv runs args in dir under bash after `eval "$(pgwake env project)"`
// and returns their combined output and how long they took.
func (h *cliHarness) evalEnv(t *testing.T, dir, project string, env []string, args ...string) (string, time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
	defer cancel()
	script := `vars=$("$1" env "$2") || exit; eval "$vars"; shift 2; exec "$@"`
	cmd := exec.CommandContext(ctx, "bash", append([]string{"-c", script, "bash", h.bin, project}, args...)...)
	cmd.Env, cmd.Dir = env, dir
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	t.Logf(`$ eval "$(pgwake env %s)"; %s  # %v in %v`+"\n%s", project, strings.Join(args, " "), err,
		took.Round(time.Millisecond), strings.TrimRight(string(out), "\n"))
	return string(out), took, err
}

// okEvalEnv is evalEnv that must succeed.
func (h *cliHarness) okEvalEnv(t *testing.T, project string, args ...string) string {
	t.Helper()
	out, _, err := h.evalEnv(t, h.dir, project, h.clientEnv(), args...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// connectDB connects with the URL `pgwake env` printed, to database db
// ("" keeps the printed one): the database name is all that changes.
func connectDB(t *testing.T, vars map[string]string, db string) *pgx.Conn {
	t.Helper()
	conn, err := tryConnectDB(t, vars, db)
	if err != nil {
		t.Fatalf("connect to database %q with DATABASE_URL: %v", db, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func tryConnectDB(t *testing.T, vars map[string]string, db string) (*pgx.Conn, error) {
	t.Helper()
	cfg, err := pgx.ParseConfig(vars["DATABASE_URL"])
	if err != nil {
		t.Fatalf("parse DATABASE_URL: %v", err)
	}
	if db != "" {
		cfg.Database = db
	}
	ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
	defer cancel()
	return pgx.ConnectConfig(ctx, cfg)
}

// queryTexts runs sql and returns its one text column.
func queryTexts(t *testing.T, conn *pgx.Conn, sql string, args ...any) []string {
	t.Helper()
	rows, err := conn.Query(t.Context(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return got
}

// wantNoDatabase checks that connecting to db fails with the real
// server's 3D000 (Postgres names the database and the routine that
// refused it), not pgwake's "project does not exist".
func wantNoDatabase(t *testing.T, vars map[string]string, db string) {
	t.Helper()
	conn, err := tryConnectDB(t, vars, db)
	if err == nil {
		conn.Close(context.Background())
		t.Fatalf("connect to database %q succeeded, want 3D000", db)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" || pgErr.Message != `database "`+db+`" does not exist` || pgErr.Routine == "" {
		t.Errorf("connect to database %q: %v (%+v); want the server's 3D000 database %q does not exist", db, err, pgErr, db)
	}
}

// TestIntegrationDjangoTestRunner: Django's own test runner, configured
// from `pgwake env app` alone, connects to the server's postgres database,
// creates test_app, migrates it, runs a TestCase that writes and reads a
// row, and drops it again; the project's own database is left untouched.
func TestIntegrationDjangoTestRunner(t *testing.T) {
	t.Parallel()
	if out, err := exec.Command(systemPython, "-c", "import django, psycopg2").CombinedOutput(); err != nil {
		if testing.Short() {
			t.Skipf("%s has no django or psycopg2 (%v: %s); ./scripts/setup installs python3-django and python3-psycopg2", systemPython, err, out)
		}
		t.Fatalf("%s -c 'import django, psycopg2': %v\n%s\nrun ./scripts/setup (python3-django, python3-psycopg2)", systemPython, err, out)
	}
	h, _, vars := envProject(t)
	dir, err := filepath.Abs(filepath.Join("..", "..", "testdata", "django"))
	if err != nil {
		t.Fatal(err)
	}
	testDB := "test_" + vars["PGDATABASE"]
	conn := connectDB(t, vars, "")

	for _, tt := range []struct {
		name  string
		unset string // what settings.py must do without
	}{
		{"DATABASE_URL", ""},
		{"PG variables", "DATABASE_URL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{systemPython, "manage.py", "test", "--noinput", "-v", "2"}
			if tt.unset != "" {
				args = append([]string{"env", "-u", tt.unset}, args...)
			}
			out, took, err := h.evalEnv(t, dir, "app", h.clientEnv("PYTHONDONTWRITEBYTECODE=1"), args...)
			if err != nil {
				t.Fatalf("manage.py test: %v (want exit 0)\n%s", err, out)
			}
			t.Logf("manage.py test took %v", took.Round(time.Millisecond))
			for _, want := range []string{
				"Creating test database for alias 'default' ('" + testDB + "')",
				"Applying notes.0001_initial... OK",
				"Ran 1 test in ",
				"\nOK\n",
				"Destroying test database for alias 'default' ('" + testDB + "')",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("manage.py test output lacks %q", want)
				}
			}
			// Python 3.11 names the test "(notes.tests.NoteTests.test_write_and_read)",
			// earlier ones "(notes.tests.NoteTests)".
			if !regexp.MustCompile(`(?m)^test_write_and_read \(notes\.tests\.NoteTests[.)].* \.\.\. ok$`).MatchString(out) {
				t.Error("manage.py test output does not report test_write_and_read ... ok")
			}
			// Django falls back to the project's own database, with this
			// warning, when it cannot reach postgres.
			if strings.Contains(out, "Normally Django will use a connection to the 'postgres' database") {
				t.Error("Django could not connect to the postgres database")
			}
			if got := queryTexts(t, conn, "select datname::text from pg_database where datname = $1", testDB); len(got) != 0 {
				t.Errorf("the test database %s is left after the run", testDB)
			}
			tables := queryTexts(t, conn, "select schemaname || '.' || tablename from pg_tables where schemaname not in ('pg_catalog', 'information_schema')")
			if len(tables) != 0 {
				t.Errorf("tables in the project's database %s after the run: %q, want none", vars["PGDATABASE"], tables)
			}
		})
	}
}

// TestIntegrationCreatedbDropdb: Debian's createdb, psql and dropdb with the
// PG* variables of `pgwake env app`; once dropped, the database is gone on
// the project's server.
func TestIntegrationCreatedbDropdb(t *testing.T) {
	t.Parallel()
	h, _, vars := envProject(t)
	const db = "scratch1"

	h.okEvalEnv(t, "app", "createdb", db)
	conn := connectDB(t, vars, "")
	if got := queryTexts(t, conn, "select datname::text from pg_database where datname = $1", db); len(got) != 1 {
		t.Fatalf("createdb %s: the project's server lists %q", db, got)
	}
	h.okEvalEnv(t, "app", "psql", "-v", "ON_ERROR_STOP=1", "-d", db, "-c",
		"create table scratch (id int primary key, body text not null); insert into scratch values (1, 'written by psql')")
	out := h.okEvalEnv(t, "app", "psql", "-v", "ON_ERROR_STOP=1", "-d", db, "-Atc",
		"select current_database() || ' ' || id || ' ' || body from scratch")
	if want := db + " 1 written by psql\n"; out != want {
		t.Errorf("psql -d %s read back %q, want %q", db, out, want)
	}
	h.okEvalEnv(t, "app", "dropdb", db)

	wantNoDatabase(t, vars, db)
	out, _, err := h.evalEnv(t, h.dir, "app", h.clientEnv(), "psql", "-d", db, "-Atc", "select 1")
	if err == nil || !strings.Contains(out, `database "`+db+`" does not exist`) {
		t.Errorf("psql -d %s after dropdb: %v, %q; want the server's database does not exist", db, err, out)
	}
}

// TestIntegrationDatabasePerTest: the pattern of test suites that give each
// test its own database: CREATE DATABASE through DATABASE_URL, then the
// same URL with only the database name replaced. Two such databases hold
// the same table apart.
func TestIntegrationDatabasePerTest(t *testing.T) {
	t.Parallel()
	h, _, vars := envProject(t)
	adminConn := connectDB(t, vars, "")
	names := []string{"t_1", "t_2"}
	t.Cleanup(func() {
		for _, name := range names {
			if _, err := adminConn.Exec(context.Background(), "drop database if exists "+name+" with (force)"); err != nil {
				t.Errorf("drop database %s: %v", name, err)
			}
		}
	})

	conns := map[string]*pgx.Conn{}
	for i, name := range names {
		t.Run(name, func(t *testing.T) {
			h.exec(t, adminConn, "create database "+name)
			conn, err := tryConnectDB(t, vars, name)
			if err != nil {
				t.Fatalf("connect to %s: %v", name, err)
			}
			conns[name] = conn
			if got := queryTexts(t, conn, "select current_database()::text"); len(got) != 1 || got[0] != name {
				t.Errorf("current_database() = %q, want %s", got, name)
			}
			// The same table name in every database; rows say whose they are.
			h.exec(t, conn, "create table items (id int primary key, owner text not null)")
			h.exec(t, conn, "insert into items select n, current_database() from generate_series(1, $1::int) n", i+1)
		})
	}
	t.Cleanup(func() {
		for _, conn := range conns {
			conn.Close(context.Background())
		}
	})
	if t.Failed() {
		return
	}

	t.Run("isolated", func(t *testing.T) {
		for i, name := range names {
			got := queryTexts(t, conns[name], "select owner || ' ' || count(*) from items group by owner")
			if want := name + " " + strconv.Itoa(i+1); len(got) != 1 || got[0] != want {
				t.Errorf("items in %s: %q, want only %q", name, got, want)
			}
		}
		h.exec(t, conns["t_2"], "create table only_in_t_2 ()")
		if got := queryTexts(t, conns["t_1"], "select coalesce(to_regclass('only_in_t_2')::text, '')"); len(got) != 1 || got[0] != "" {
			t.Errorf("t_1 sees t_2's table: %q", got)
		}
		if got := queryTexts(t, adminConn, "select datname::text from pg_database where datname like 't\\_%' order by 1"); strings.Join(got, " ") != "t_1 t_2" {
			t.Errorf("the project's server lists databases %q, want t_1 t_2", got)
		}
	})
}

// TestIntegrationSharedPortUserRouting: on the shared proxy port, user name
// USER.PROJECT reaches PROJECT's server as USER, with the database passed
// through: postgres.app with database postgres is the postgres database of
// the same server the project's own port serves.
func TestIntegrationSharedPortUserRouting(t *testing.T) {
	t.Parallel()
	h, info, vars := envProject(t)

	own := connectDB(t, vars, "postgres")
	marker := "written through port " + vars["PGPORT"]
	h.exec(t, own, "create table routing_marker (body text not null)")
	h.exec(t, own, "insert into routing_marker values ($1)", marker)

	cfg, err := pgx.ParseConfig(vars["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(info.Listen)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port = host, uint16(p)
	cfg.User, cfg.Database = vars["PGUSER"]+".app", "postgres"
	ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
	defer cancel()
	shared, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to the shared port %s as %s, database postgres: %v", info.Listen, cfg.User, err)
	}
	defer shared.Close(context.Background())

	var user, db string
	if err := shared.QueryRow(t.Context(), "select current_user::text, current_database()::text").Scan(&user, &db); err != nil {
		t.Fatal(err)
	}
	if user != "postgres" || user != vars["PGUSER"] || db != "postgres" {
		t.Errorf("as %s on the shared port: current_user %q, current_database %q; want postgres, postgres", cfg.User, user, db)
	}
	if got := queryTexts(t, shared, "select body from routing_marker"); len(got) != 1 || got[0] != marker {
		t.Errorf("routing_marker on the shared port: %q, want [%q] (project app's server)", got, marker)
	}
}
