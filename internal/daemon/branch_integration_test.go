package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/localbackend"
	"github.com/pgwake/pgwake/internal/testenv"
	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

// brancherBackends runs fn against a daemon on each backend that branches:
// Docker (a real engine, the offline test image), local processes
// (Debian's PostgreSQL binaries) and Kubernetes (a real control plane in
// a namespace of the test's; simulated: the node, see kubeenv).
func brancherBackends(t *testing.T, fn func(t *testing.T, cl *admin.Client)) {
	for _, name := range []string{"docker", "local", "kubernetes"} {
		t.Run(name, func(t *testing.T) {
			mutate := func(c *config.Config) { c.Backend = name }
			switch name {
			case "local":
				if _, err := localbackend.FindBinDir(); err != nil {
					t.Fatalf("this test needs PostgreSQL server binaries (scripts/setup installs them): %v", err)
				}
			case "kubernetes":
				env := kubeenv.Shared(t)
				ns := env.NewNamespace(t)
				mutate = func(c *config.Config) {
					c.Backend = name
					c.Kubernetes.Kubeconfig, c.Kubernetes.Namespace = env.Kubeconfig, ns
				}
			}
			cl, _, _ := runDaemon(t, mutate)
			fn(t, cl)
		})
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	kubeenv.StopShared()
	os.Exit(code)
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func queryInt(t *testing.T, c *pgx.Conn, sql string) int {
	t.Helper()
	var n int
	if err := c.QueryRow(t.Context(), sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// TestIntegrationBranchUnderWriteLoad takes a branch of a source that a
// writer keeps busy: each of its transactions inserts a batch of rows and
// counts the batch, so a copy of any one point in time has exactly
// batch-size rows per counted batch. A torn copy (rows of a transaction
// without its count, or the other way round) fails. The writer must see no
// error, before, during or after the branch.
func TestIntegrationBranchUnderWriteLoad(t *testing.T) {
	brancherBackends(t, func(t *testing.T, cl *admin.Client) {
		ctx := t.Context()
		src, err := cl.Create(ctx, admin.CreateRequest{Name: "src"})
		if err != nil {
			t.Fatal(err)
		}
		c := connect(t, src.URL)
		if _, err := c.Exec(ctx, `create table rows (batch int, i int); create table batches (n int); insert into batches values (0)`); err != nil {
			t.Fatal(err)
		}

		const batch = 10
		var commits atomic.Int64
		progress := make(chan struct{}, 1)
		stop := make(chan struct{})
		writerDone := make(chan error, 1)
		go func() {
			w, err := pgx.Connect(ctx, src.URL)
			if err != nil {
				writerDone <- err
				return
			}
			defer w.Close(context.Background())
			for k := 1; ; k++ {
				select {
				case <-stop:
					writerDone <- nil
					return
				default:
				}
				err := pgx.BeginFunc(ctx, w, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `insert into rows select $1, g from generate_series(1, $2) g`, k, batch); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `update batches set n = n + 1`)
					return err
				})
				if err != nil {
					writerDone <- fmt.Errorf("transaction %d: %w", k, err)
					return
				}
				commits.Add(1)
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		}()
		waitCommits := func(n int64) {
			for commits.Load() < n {
				select {
				case <-progress:
				case err := <-writerDone:
					t.Fatalf("writer stopped: %v", err)
				}
			}
		}
		waitCommits(20)
		b, err := cl.Create(ctx, admin.CreateRequest{Name: "branch", From: "src"})
		if err != nil {
			t.Fatal(err)
		}
		at := commits.Load()
		waitCommits(at + 20) // the source goes on serving after the copy
		close(stop)
		if err := <-writerDone; err != nil {
			t.Fatalf("the source's client saw an error: %v", err)
		}

		if b.Parent != "src" || b.BranchedAt.IsZero() {
			t.Errorf("branch shows parent %q taken %v, want src and a time", b.Parent, b.BranchedAt)
		}
		bc := connect(t, b.URL)
		n := queryInt(t, bc, `select n from batches`)
		rows := queryInt(t, bc, `select count(*) from rows`)
		distinct := queryInt(t, bc, `select count(distinct batch) from rows`)
		t.Logf("branch has %d batches (%d rows); the writer had committed %d before the branch returned", n, rows, at)
		if n < 20 || rows != n*batch || distinct != n {
			t.Fatalf("torn branch: batches counted %d, rows %d (want %d), distinct batches %d", n, rows, n*batch, distinct)
		}
		if max := queryInt(t, bc, `select coalesce(max(batch), 0) from rows`); max != n {
			t.Fatalf("branch has batch %d but counts %d: not one point in time", max, n)
		}
		// Its own data: a write to the branch is not the source's.
		if _, err := bc.Exec(ctx, `insert into rows values (-1, -1)`); err != nil {
			t.Fatal(err)
		}
		if got := queryInt(t, c, `select count(*) from rows where batch = -1`); got != 0 {
			t.Fatalf("a write to the branch shows on the source (%d rows)", got)
		}
		ownPassword(t, src.URL, b.URL)
		if st, _ := cl.Project(ctx, "src"); st.State != "running" {
			t.Errorf("source is %s after the branch, want running", st.State)
		}
	})
}

// ownPassword checks that the branch at branchURL has a password of its
// own (its URL's, which just logged in) and that its source's, at srcURL,
// does not open it.
func ownPassword(t *testing.T, srcURL, branchURL string) {
	t.Helper()
	srcPass := passwordOf(t, srcURL)
	if passwordOf(t, branchURL) == srcPass {
		t.Fatal("the branch has its source's password")
	}
	connect(t, branchURL)
	direct := strings.Replace(branchURL, ":"+passwordOf(t, branchURL)+"@", ":"+srcPass+"@", 1)
	if _, err := pgx.Connect(t.Context(), direct); err == nil {
		t.Fatal("the source's password opens the branch")
	}
}

func passwordOf(t *testing.T, url string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Password
}

// tableDigest is the whole table's content, in order, as one hash.
func tableDigest(t *testing.T, c *pgx.Conn) string {
	t.Helper()
	var s string
	if err := c.QueryRow(t.Context(), `select md5(coalesce(string_agg(id || ':' || v, ',' order by id), '')) from items`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestIntegrationSnapshotReset is the test loop the README documents:
// seed, snapshot; then change the data and reset, and the rows are
// exactly the snapshot's. It takes one snapshot of the awake server (a
// base backup) and one of the sleeping server (a copy of its files), and
// resets to each; a reset with a client connected is refused with the
// count, and with force ends that client's session with 57P01.
func TestIntegrationSnapshotReset(t *testing.T) {
	brancherBackends(t, func(t *testing.T, cl *admin.Client) {
		ctx := t.Context()
		p, err := cl.Create(ctx, admin.CreateRequest{Name: "app"})
		if err != nil {
			t.Fatal(err)
		}
		c, err := pgx.Connect(ctx, p.URL)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, `create table items (id int primary key, v text); insert into items select g, 'seed' || g from generate_series(1, 500) g`); err != nil {
			t.Fatal(err)
		}
		seed := tableDigest(t, c)
		if _, err := cl.Snapshot(ctx, "app", admin.SnapshotRequest{Label: "seeded"}); err != nil { // awake: a base backup
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, `update items set v = 'two' where id % 2 = 0; insert into items values (1000, 'new')`); err != nil {
			t.Fatal(err)
		}
		two := tableDigest(t, c)
		c.Close(ctx)
		sleepWhenIdle(t, cl, "app")
		if _, err := cl.Snapshot(ctx, "app", admin.SnapshotRequest{Label: "two"}); err != nil { // asleep: its files
			t.Fatal(err)
		}
		if st, _ := cl.Project(ctx, "app"); st.State != "sleeping" {
			t.Errorf("a snapshot of a sleeping project left it %s", st.State)
		}
		if _, err := cl.Snapshot(ctx, "app", admin.SnapshotRequest{Label: "two"}); err == nil {
			t.Error("a second snapshot under one label was taken")
		}
		if _, err := cl.Snapshot(ctx, "app", admin.SnapshotRequest{Label: "Bad Label"}); err == nil {
			t.Error("a snapshot with a bad label was taken")
		}
		snaps, err := cl.Snapshots(ctx, "app")
		if err != nil {
			t.Fatal(err)
		}
		if len(snaps) != 2 || snaps[0].Label != "seeded" || snaps[1].Label != "two" {
			t.Fatalf("snapshots %+v, want seeded then two", snaps)
		}
		for _, s := range snaps {
			if s.Bytes < 1<<20 || s.TakenAt.IsZero() {
				t.Errorf("snapshot %s: %d bytes taken %v, want a cluster's size and a time", s.Label, s.Bytes, s.TakenAt)
			}
		}

		// Change everything, with a client connected: refused, then forced.
		c = connect(t, p.URL)
		if _, err := c.Exec(ctx, `delete from items where id < 100; update items set v = 'changed'`); err != nil {
			t.Fatal(err)
		}
		_, err = cl.Reset(ctx, "app", admin.ResetRequest{Label: "seeded"})
		var apiErr *admin.APIError
		if !errors.As(err, &apiErr) || !strings.Contains(err.Error(), "1 open connection") {
			t.Fatalf("reset with a client connected: %v, want refused with the count", err)
		}
		if got := tableDigest(t, c); got == seed {
			t.Fatal("a refused reset changed the data")
		}
		if _, err := cl.Reset(ctx, "app", admin.ResetRequest{Label: "seeded", Force: true}); err != nil {
			t.Fatal(err)
		}
		_, err = c.Exec(ctx, `select 1`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "57P01" {
			t.Fatalf("the forced-out session got %v, want SQLSTATE 57P01", err)
		}
		c2 := connect(t, p.URL) // wakes it on the snapshot's data
		if got := tableDigest(t, c2); got != seed {
			t.Fatalf("after reset to seeded the rows differ from the snapshot's (%d rows)", queryInt(t, c2, `select count(*) from items`))
		}
		if _, err := c2.Exec(ctx, `truncate items`); err != nil {
			t.Fatal(err)
		}
		c2.Close(ctx)
		waitIdle(t, cl, "app")

		// No label: the latest.
		start := time.Now()
		s, err := cl.Reset(ctx, "app", admin.ResetRequest{})
		if err != nil || s.Label != "two" {
			t.Fatalf("reset to the latest: %+v %v, want two", s, err)
		}
		t.Logf("reset of a %d-byte snapshot took %s", s.Bytes, time.Since(start).Round(time.Millisecond))
		c3 := connect(t, p.URL)
		if got := tableDigest(t, c3); got != two {
			t.Fatal("after reset to two the rows differ from that snapshot's")
		}
		c3.Close(ctx)
		if _, err := cl.Reset(ctx, "app", admin.ResetRequest{Label: "nosuch"}); err == nil {
			t.Fatal("reset to a snapshot that does not exist succeeded")
		}

		// Deleting one, and rm --volumes taking the rest.
		if err := cl.DeleteSnapshot(ctx, "app", "two"); err != nil {
			t.Fatal(err)
		}
		if snaps, _ := cl.Snapshots(ctx, "app"); len(snaps) != 1 {
			t.Fatalf("after deleting two: %+v", snaps)
		}
		if err := cl.Remove(ctx, "app", true); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Create(ctx, admin.CreateRequest{Name: "app"}); err != nil {
			t.Fatal(err)
		}
		if snaps, err := cl.Snapshots(ctx, "app"); err != nil || len(snaps) != 0 {
			t.Fatalf("a project made again after rm --volumes has snapshots %+v (%v)", snaps, err)
		}
	})
}

// TestIntegrationBranchOfSleepingSource copies a stopped source's files:
// the source stays asleep, and the branch is whole.
func TestIntegrationBranchOfSleepingSource(t *testing.T) {
	brancherBackends(t, func(t *testing.T, cl *admin.Client) {
		ctx := t.Context()
		src, err := cl.Create(ctx, admin.CreateRequest{Name: "seed"})
		if err != nil {
			t.Fatal(err)
		}
		c, err := pgx.Connect(ctx, src.URL)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, `create table items (id int primary key, v text); insert into items select g, 'v' || g from generate_series(1, 1000) g`); err != nil {
			t.Fatal(err)
		}
		want := tableDigest(t, c)
		c.Close(ctx)
		sleepWhenIdle(t, cl, "seed")
		wakes := mustProject(t, cl, "seed").Wakes
		b, err := cl.Create(ctx, admin.CreateRequest{Name: "job1", From: "seed", Ephemeral: ptrTo(true)})
		if err != nil {
			t.Fatal(err)
		}
		if st := mustProject(t, cl, "seed"); st.State != "sleeping" || st.Wakes != wakes {
			t.Errorf("source is %s with %d wakes after the branch, want still sleeping, %d wakes", st.State, st.Wakes, wakes)
		}
		if !b.Ephemeral || b.Parent != "seed" {
			t.Errorf("branch: ephemeral %v parent %q", b.Ephemeral, b.Parent)
		}
		if st := mustProject(t, cl, "job1"); st.State != "sleeping" {
			t.Errorf("a new branch is %s, want sleeping until its first client", st.State)
		}
		bc := connect(t, b.URL)
		if got := tableDigest(t, bc); got != want {
			t.Fatal("the branch's rows differ from its source's")
		}
		ownPassword(t, src.URL, b.URL)
		if _, err := cl.Create(ctx, admin.CreateRequest{Name: "job2", From: "nosuch"}); err == nil {
			t.Fatal("a branch of a project that does not exist was made")
		}
		if _, err := cl.Create(ctx, admin.CreateRequest{Name: "job1", From: "seed"}); err == nil {
			t.Fatal("a branch over an existing project was made")
		}
	})
}

// sleepWhenIdle puts a project to sleep once it is idle (waitIdle).
func sleepWhenIdle(t *testing.T, cl *admin.Client, name string) {
	t.Helper()
	waitIdle(t, cl, name)
	if _, err := cl.Action(t.Context(), name, "sleep"); err != nil {
		t.Fatal(err)
	}
}

// waitIdle waits, on the event stream, until the proxy has seen a
// project's last client go (a closed connection is released moments
// after Close).
func waitIdle(t *testing.T, cl *admin.Client, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	events, err := cl.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for ev := range events {
		if ev.Project.Name == name && ev.Project.Active == 0 {
			break
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("%s kept connections: %v", name, ctx.Err())
	}
}

func mustProject(t *testing.T, cl *admin.Client, name string) admin.Project {
	t.Helper()
	p, err := cl.Project(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ptrTo[T any](v T) *T { return &v }

// TestIntegrationHalfMadeBranchIsRemoved: a branch whose copy a killed
// pgwake cut short is still pending in the state file, its data directory
// holding only the staged part of the copy. The next pgwake removes it,
// data and all, rather than serve it (its local server would otherwise run
// initdb on the missing data and serve an empty database as the branch).
func TestIntegrationHalfMadeBranchIsRemoved(t *testing.T) {
	if _, err := localbackend.FindBinDir(); err != nil {
		t.Fatalf("this test needs PostgreSQL server binaries (scripts/setup installs them): %v", err)
	}
	dir, err := os.MkdirTemp("", "pgwp")
	if err != nil {
		t.Fatal(err)
	}
	instance := fmt.Sprintf("pend%d", time.Now().UnixNano()%1e9)
	root := localRoot(dir, instance)
	t.Cleanup(func() {
		testenv.StopLocalServers(root)
		os.RemoveAll(root)
		os.RemoveAll(dir)
	})
	state := map[string]any{"instance": instance, "projects": []map[string]any{{
		"name": "half", "image": "", "user": "postgres", "password": "pw", "database": "seed",
		"sleep_after": 0, "sleep_mode": "stop", "created_at": "2026-01-01T00:00:00Z",
		"backend": "local", "parent": "seed", "pending": true,
	}}}
	data, err := json.Marshal(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "state.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	staged := filepath.Join(root, "half", "data.copy")
	if err := os.MkdirAll(staged, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "half", ".pgwake-project"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	cfg := config.Default()
	cfg.PortRange = testenv.PortRange(t)
	cfg.StateDir = dir
	cfg.Listen = "127.0.0.1:0"
	cfg.Backend = "local"
	cfg.SleepAfter = 0
	d, _, done := startDaemon(t, cfg, Options{})
	defer func() {
		d.Shutdown(true)
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for _, p := range d.Projects() {
		if p.Name == "half" {
			t.Fatalf("the half-made branch is served: %+v", p)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "half")); !os.IsNotExist(err) {
		t.Fatalf("the half-made branch's directory is still there (%v)", err)
	}
}

// TestIntegrationSnapshotRefusals: a project that never started holds no
// cluster, and a snapshot of it is refused (a reset to an empty copy would
// wipe the data); a label that is a path is refused before any backend
// sees it.
func TestIntegrationSnapshotRefusals(t *testing.T) {
	brancherBackends(t, func(t *testing.T, cl *admin.Client) {
		ctx := t.Context()
		p, err := cl.Create(ctx, admin.CreateRequest{Name: "fresh"})
		if err != nil {
			t.Fatal(err)
		}
		// The local backend runs initdb at create; Docker's image at the
		// first start.
		if p.Backend == "docker" {
			if s, err := cl.Snapshot(ctx, "fresh", admin.SnapshotRequest{Label: "empty"}); err == nil {
				t.Fatalf("a snapshot of a never-started project was taken: %+v", s)
			}
			if snaps, err := cl.Snapshots(ctx, "fresh"); err != nil || len(snaps) != 0 {
				t.Fatalf("after the refused snapshot: %+v (%v), want none", snaps, err)
			}
		}
		for _, label := range []string{"../../x", "..", ".partial-x", "A"} {
			err := cl.DeleteSnapshot(ctx, "fresh", label)
			var apiErr *admin.APIError
			if !errors.As(err, &apiErr) || apiErr.Status != 400 {
				t.Errorf("delete snapshot %q: %v, want 400", label, err)
			}
		}
	})
}
