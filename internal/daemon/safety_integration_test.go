package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/localbackend"
	"github.com/pgwake/pgwake/internal/state"
	"github.com/pgwake/pgwake/internal/testenv"
)

// writeState writes a state file as an older pgwake did: projects given
// with an empty backend carry no "backend" key at all.
func writeState(t *testing.T, dir, instance, image string, projects map[string]string) {
	t.Helper()
	var ps []map[string]any
	for name, be := range projects {
		p := map[string]any{
			"name": name, "image": image, "user": "postgres", "password": "pw-" + name,
			"database": name, "sleep_after": 0, "sleep_mode": "stop", "created_at": "2026-01-01T00:00:00Z",
		}
		if be != "" {
			p["backend"] = be
		}
		ps = append(ps, p)
	}
	data, err := json.Marshal(map[string]any{"instance": instance, "projects": ps})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "state.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// startDaemon runs New and Serve as Run does, and returns the daemon once
// it serves; done receives Serve's and Close's errors once it has stopped.
func startDaemon(t *testing.T, cfg config.Config, opts Options) (d *Daemon, addr string, done <-chan error) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ready := make(chan string, 1)
	opts.Ready = func(a string) { ready <- a }
	d, err := New(t.Context(), cfg, log, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ch := make(chan error, 1)
	go func() {
		serr := d.Serve(context.Background())
		ch <- errors.Join(serr, d.Close())
	}()
	select {
	case addr = <-ready:
	case err := <-ch:
		t.Fatalf("daemon stopped during start-up: %v", err)
	}
	return d, addr, ch
}

// TestIntegrationNoSilentBackendSwitch: with backend auto and the Docker
// engine unreachable, a project that lives on Docker is never served from
// a fresh local server: its clients get 08006 saying the engine is
// unreachable, no local data directory is made for it, and a state dir
// with no other project does not start at all, with a one-line error.
func TestIntegrationNoSilentBackendSwitch(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test needs PostgreSQL binaries; skipped with -short")
	}
	if _, err := localbackend.FindBinDir(); err != nil {
		t.Fatalf("this test needs PostgreSQL server binaries (scripts/setup installs them): %v", err)
	}
	start := time.Now()
	dir, err := os.MkdirTemp("", "pgwb") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	instance := fmt.Sprintf("nsw%d", time.Now().UnixNano()%1e9)
	root := localRoot(dir, instance)
	t.Cleanup(func() {
		testenv.StopLocalServers(root)
		os.RemoveAll(dir)
	})
	cfg := config.Default()
	cfg.PortRange = testenv.PortRange(t)
	cfg.StateDir = dir
	cfg.Listen = "127.0.0.1:0"
	cfg.Backend = "auto"
	cfg.DockerHost = "unix://" + filepath.Join(t.TempDir(), "no-docker.sock")
	cfg.SleepAfter = 0
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}

	t.Run("only a docker project: up fails in one line", func(t *testing.T) {
		writeState(t, dir, instance, "postgres:17", map[string]string{"dock": ""}) // written before backends were stored
		d, err := New(t.Context(), cfg, slog.New(slog.DiscardHandler), Options{})
		if err == nil {
			d.Close()
			t.Fatal("New served a state dir whose only project lives on an unreachable Docker engine")
		}
		msg := err.Error()
		if !strings.Contains(msg, "unreachable") || !strings.Contains(msg, "none of the 1 projects") || strings.Contains(msg, "\n") {
			t.Errorf("error %q: want one line saying no project can be served because the engine is unreachable", msg)
		}
		if !strings.Contains(msg, "no-docker.sock") {
			t.Errorf("error %q does not name the engine address", msg)
		}
		if _, err := os.Stat(filepath.Join(root, "dock")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a local directory was made for the docker project: %v", err)
		}
		if Locked(dir) {
			t.Error("the failed New left the state dir locked")
		}
		if _, err := os.Stat(cfg.SocketPath()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the failed New left the admin socket: %v", err)
		}
	})

	t.Run("docker and local projects: the docker one is refused with the reason", func(t *testing.T) {
		writeState(t, dir, instance, "postgres:17", map[string]string{"dock": "", "loc": "local"})
		d, addr, done := startDaemon(t, cfg, Options{})

		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		_, err := pgx.Connect(ctx, "postgres://postgres:pw-dock@"+addr+"/dock?sslmode=disable")
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "08006" || !strings.Contains(pgErr.Message, "unreachable") {
			t.Errorf("connect to the docker project: %v; want SQLSTATE 08006 saying the engine is unreachable", err)
		}
		if _, err := os.Stat(filepath.Join(root, "dock")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("connecting made a local directory for the docker project: %v", err)
		}

		p, err := d.Project("dock")
		if err != nil || p.Backend != "docker" {
			t.Errorf("API: dock is on %q (%v), want docker", p.Backend, err)
		}
		if p, _ := d.Project("loc"); p.Backend != "local" {
			t.Errorf("API: loc is on %q, want local", p.Backend)
		}
		info := d.Info()
		if info.Backend != "docker" {
			t.Errorf("new projects go to %q; want docker, what this state dir's projects use (a tie goes to docker)", info.Backend)
		}
		var dockErr string
		for _, b := range info.Backends {
			if b.Name == "docker" {
				dockErr = b.Error
			} else if b.Error != "" {
				t.Errorf("backend %s reported unavailable: %s", b.Name, b.Error)
			}
		}
		if !strings.Contains(dockErr, "unreachable") {
			t.Errorf("Info does not say the docker backend is unreachable: %+v", info.Backends)
		}
		// Creating a project on the unavailable backend fails and leaves
		// nothing.
		if _, err := d.Create(ctx, admin.CreateRequest{Name: "fresh"}); err == nil || !strings.Contains(err.Error(), "unreachable") {
			t.Errorf("create on the unreachable backend: %v", err)
		}
		if _, err := d.Project("fresh"); err == nil {
			t.Error("the failed create left project fresh behind")
		}

		d.Shutdown(false)
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
		// The choice made for the legacy project is stored.
		st, err := state.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if p, err := st.Get("dock"); err != nil || p.Backend != "docker" {
			t.Errorf("state: dock on %q (%v), want docker stored", p.Backend, err)
		}
	})
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}

// TestIntegrationConnectDuringDrainGets57P01: once `down` has begun,
// a client that connects while open sessions drain is answered 57P01
// (admin shutdown), never "connection refused".
func TestIntegrationConnectDuringDrainGets57P01(t *testing.T) {
	image := testenv.PostgresImage(t)
	docker := testenv.DockerClient(t)
	dir, err := os.MkdirTemp("", "pgwd")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.PortRange = testenv.PortRange(t)
	cfg.StateDir = dir
	cfg.Image = image
	cfg.Listen = "127.0.0.1:0"
	cfg.SleepAfter = 0
	cfg.Backend = "docker"
	cfg.ShutdownTimeout = 2 * time.Minute // the test ends the drain itself
	d, _, done := startDaemon(t, cfg, Options{})
	instance := d.store.Instance()
	t.Cleanup(func() {
		testenv.RemoveInstance(t, docker, instance)
		os.RemoveAll(dir)
	})

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	p, err := d.Create(ctx, admin.CreateRequest{Name: "drain"})
	if err != nil {
		t.Fatal(err)
	}
	held, err := pgx.Connect(ctx, p.URL)
	if err != nil {
		t.Fatal(err)
	}
	sessions := []*pgx.Conn{held}
	defer func() {
		for _, c := range sessions {
			c.Close(context.Background())
		}
	}()

	d.Shutdown(true) // as `down --volumes`: nothing is left behind
	// Until the proxy's shutdown has begun a connect is an ordinary session
	// (kept open, so the drain goes on); from then on it must be 57P01.
	for {
		c, err := pgx.Connect(ctx, p.URL)
		if err == nil {
			sessions = append(sessions, c)
			continue
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "57P01" {
			break
		}
		t.Fatalf("connect during the drain: %v; want SQLSTATE 57P01", err)
	}
	for _, c := range sessions {
		c.Close(ctx)
	}
	sessions = nil
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("daemon: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the daemon did not stop once the sessions closed")
	}
}

// TestIntegrationBackendReconnects: a Docker engine that answers only
// after pgwake started is picked up by the next connect to one of its
// projects, without a restart: the project is then served from Docker.
func TestIntegrationBackendReconnects(t *testing.T) {
	image := testenv.PostgresImage(t)
	docker := testenv.DockerClient(t)
	if _, err := localbackend.FindBinDir(); err != nil {
		t.Fatalf("this test needs PostgreSQL server binaries (scripts/setup installs them): %v", err)
	}
	start := time.Now()
	dir, err := os.MkdirTemp("", "pgwr")
	if err != nil {
		t.Fatal(err)
	}
	instance := fmt.Sprintf("rec%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() {
		testenv.RemoveInstance(t, docker, instance)
		testenv.StopLocalServers(localRoot(dir, instance))
		os.RemoveAll(dir)
	})
	writeState(t, dir, instance, image, map[string]string{"dock": "docker", "loc": "local"})
	sock := filepath.Join(t.TempDir(), "late-docker.sock")
	cfg := config.Default()
	cfg.PortRange = testenv.PortRange(t)
	cfg.StateDir = dir
	cfg.Listen = "127.0.0.1:0"
	cfg.DockerHost = "unix://" + sock
	cfg.SleepAfter = 0
	// Retry at once: the test brings the engine up before it connects.
	d, addr, done := startDaemon(t, cfg, Options{ReconnectInterval: time.Nanosecond})
	if b := d.Info().Backends; len(b) != 2 || b[0].Name != "docker" || b[0].Error == "" {
		t.Fatalf("backends at start: %+v; want docker unavailable", b)
	}

	// The engine "starts": its socket appears where pgwake looks for it.
	forwardUnix(t, sock, docker.DaemonHost())
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, "postgres://postgres:pw-dock@"+addr+"/dock?sslmode=disable")
	if err != nil {
		t.Fatalf("connect once the engine answers: %v", err)
	}
	var db string
	if err := conn.QueryRow(ctx, "select current_database()").Scan(&db); err != nil || db != "dock" {
		t.Errorf("select current_database(): %q, %v", db, err)
	}
	conn.Close(ctx)
	if b := d.Info().Backends; b[0].Error != "" {
		t.Errorf("docker still reported unavailable: %+v", b)
	}
	if p, _ := d.Project("dock"); p.State != "running" || p.Backend != "docker" {
		t.Errorf("dock: %s on %s, want running on docker", p.State, p.Backend)
	}
	d.Shutdown(true)
	if err := <-done; err != nil {
		t.Errorf("daemon: %v", err)
	}
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}

// forwardUnix serves a unix socket at path that relays every connection
// to the Docker engine at host (unix:// or tcp://), until the test ends.
func forwardUnix(t *testing.T, path, host string) {
	t.Helper()
	network, addr, ok := strings.Cut(host, "://")
	if !ok || (network != "unix" && network != "tcp") {
		t.Fatalf("cannot forward to Docker engine %q", host)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial(network, addr)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { io.Copy(up, c); up.(interface{ CloseWrite() error }).CloseWrite() }()
				io.Copy(c, up)
			}()
		}
	}()
}
