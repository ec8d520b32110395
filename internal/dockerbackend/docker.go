// Package dockerbackend runs each project's Postgres as a Docker container
// with a named volume, through the Docker Engine API.
package dockerbackend

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"

	"github.com/pgwake/pgwake/internal/backend"
)

// Labels put on everything pgwake creates, so it adopts its own containers
// after a restart and never touches anything else.
const (
	LabelManaged  = "dev.pgwake.managed"
	LabelInstance = "dev.pgwake.instance"
	LabelProject  = "dev.pgwake.project"
	LabelSpec     = "dev.pgwake.spec"
)

// stopTimeout is how long Docker waits for Postgres's fast shutdown (SIGINT)
// before it kills the container; a kill means crash recovery on the next
// start, so leave room for a large checkpoint.
const stopTimeout = 120

// defaultPGDATA is where official images up to 17 keep data; used only when
// the image declares neither PGDATA nor a volume.
const defaultPGDATA = "/var/lib/postgresql/data"

var postgresPort = network.MustParsePort("5432/tcp")

// Options configures a Backend.
type Options struct {
	// Host is the Docker engine address; empty means DOCKER_HOST or the
	// platform default socket.
	Host string
	// Instance scopes names and labels so several pgwake state directories
	// (for example parallel tests) never share containers.
	Instance string
	Logger   *slog.Logger
}

// Backend implements backend.Backend with Docker containers.
type Backend struct {
	cli      *client.Client
	instance string
	log      *slog.Logger

	// localIPs are this host's interface addresses. A container whose
	// network gateway is one of them sits on a bridge of this host, so the
	// proxy can dial its own address and skip Docker's userland port proxy
	// (a copy through one more process on every packet).
	localIPs map[netip.Addr]bool
}

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Logger  = (*Backend)(nil)
	_ backend.Watcher = (*Backend)(nil)
)

// ErrEngineUnreachable is returned by New when no Docker engine answers.
var ErrEngineUnreachable = errors.New("docker engine unreachable")

// New connects to the Docker engine, negotiating the API version, and pings
// it so a missing engine fails here with a clear message.
func New(ctx context.Context, opts Options) (*Backend, error) {
	copts := []client.Opt{client.FromEnv}
	if opts.Host != "" {
		copts = append(copts, client.WithHost(opts.Host))
	}
	cli, err := client.New(copts...)
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cli.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w at %s (is Docker running? set DOCKER_HOST or docker_host): %v",
			ErrEngineUnreachable, cli.DaemonHost(), err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	inst := opts.Instance
	if inst == "" {
		inst = "default"
	}
	return &Backend{cli: cli, instance: inst, log: log, localIPs: interfaceAddrs()}, nil
}

func interfaceAddrs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return out
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out[p.Addr().Unmap()] = true
		}
	}
	return out
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "docker" }

// Close implements backend.Backend.
func (b *Backend) Close() error { return b.cli.Close() }

// ContainerName is the container pgwake uses for a project.
func (b *Backend) ContainerName(project string) string {
	return "pgwake-" + b.instance + "-" + project
}

// VolumeName is the data volume pgwake uses for a project.
func (b *Backend) VolumeName(project string) string {
	return b.ContainerName(project) + "-data"
}

func (b *Backend) labels(spec backend.Spec) map[string]string {
	return map[string]string{
		LabelManaged:  "true",
		LabelInstance: b.instance,
		LabelProject:  spec.Name,
	}
}

// specHash identifies the container configuration derived from spec; a
// container whose label differs was changed outside pgwake (or by an older
// spec) and is recreated.
func specHash(spec backend.Spec) string {
	h := sha256.New()
	for _, s := range []string{spec.Image, spec.User, spec.Password, spec.Database} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Ensure implements backend.Backend: it creates the volume and container if
// missing and recreates a container that no longer matches spec, keeping the
// volume.
func (b *Backend) Ensure(ctx context.Context, spec backend.Spec) error {
	name := b.ContainerName(spec.Name)
	res, err := b.cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	switch {
	case err == nil:
		c := res.Container
		if b.matches(c, spec) {
			return nil
		}
		b.log.Warn("container changed outside pgwake; recreating it with its volume",
			"project", spec.Name, "container", name)
		if _, err := b.cli.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			return fmt.Errorf("remove drifted container %q: %w", name, err)
		}
	case cerrdefs.IsNotFound(err):
	default:
		return fmt.Errorf("inspect container %q: %w", name, err)
	}
	return b.create(ctx, spec)
}

// matches reports whether a container is the one pgwake would create for
// spec: its labels carry spec's hash and this instance, and 5432 is
// published on loopback only.
func (b *Backend) matches(c container.InspectResponse, spec backend.Spec) bool {
	return c.Config != nil && c.Config.Labels[LabelSpec] == specHash(spec) &&
		c.Config.Labels[LabelInstance] == b.instance && hasLoopbackBinding(c.HostConfig)
}

func hasLoopbackBinding(hc *container.HostConfig) bool {
	if hc == nil {
		return false
	}
	for _, pb := range hc.PortBindings[postgresPort] {
		if pb.HostIP.IsLoopback() {
			return true
		}
	}
	return false
}

func (b *Backend) create(ctx context.Context, spec backend.Spec) error {
	if err := b.ensureImage(ctx, spec.Image); err != nil {
		return err
	}
	img, err := b.cli.ImageInspect(ctx, spec.Image)
	if err != nil {
		return fmt.Errorf("inspect image %q: %w", spec.Image, err)
	}
	var imgEnv []string
	var imgVolumes map[string]struct{}
	if cfg := img.Config; cfg != nil {
		imgEnv, imgVolumes = cfg.Env, cfg.Volumes
	}
	target := dataMountTarget(imgEnv, imgVolumes)

	labels := b.labels(spec)
	vol := b.VolumeName(spec.Name)
	if _, err := b.cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: vol, Labels: labels}); err != nil {
		return fmt.Errorf("create volume %q: %w", vol, err)
	}

	clabels := b.labels(spec)
	clabels[LabelSpec] = specHash(spec)
	timeout := stopTimeout
	_, err = b.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: b.ContainerName(spec.Name),
		Config: &container.Config{
			Image: spec.Image,
			Env: []string{
				"POSTGRES_PASSWORD=" + spec.Password,
				"POSTGRES_USER=" + spec.User,
				"POSTGRES_DB=" + spec.Database,
				"POSTGRES_INITDB_ARGS=--auth-host=scram-sha-256",
			},
			ExposedPorts: network.PortSet{postgresPort: {}},
			Labels:       clabels,
			// Set here, not trusted from the image: SIGINT is Postgres's
			// fast shutdown, and some images (or engines) lose STOPSIGNAL.
			StopSignal:  "SIGINT",
			StopTimeout: &timeout,
		},
		HostConfig: &container.HostConfig{
			// An empty host port lets Docker pick a free one on each start;
			// 127.0.0.1 keeps the server off other machines.
			PortBindings: network.PortMap{postgresPort: {{HostIP: netip.MustParseAddr("127.0.0.1")}}},
			Mounts:       []mount.Mount{{Type: mount.TypeVolume, Source: vol, Target: target}},
		},
	})
	if err != nil {
		return fmt.Errorf("create container for project %q: %w", spec.Name, err)
	}
	return nil
}

// dataMountTarget picks where the volume goes from the image's own config:
// the declared VOLUME that holds PGDATA (postgres:18 declares
// /var/lib/postgresql and keeps PGDATA below it), else PGDATA itself.
func dataMountTarget(env []string, volumes map[string]struct{}) string {
	pgdata := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PGDATA="); ok {
			pgdata = v
		}
	}
	best := ""
	for v := range volumes {
		v = strings.TrimRight(v, "/")
		if pgdata != "" && (pgdata == v || strings.HasPrefix(pgdata, v+"/")) && len(v) > len(best) {
			best = v
		}
	}
	switch {
	case best != "":
		return best
	case pgdata != "":
		return pgdata
	}
	for v := range volumes {
		return v
	}
	return defaultPGDATA
}

func (b *Backend) ensureImage(ctx context.Context, ref string) error {
	if _, err := b.cli.ImageInspect(ctx, ref); err == nil {
		return nil
	} else if !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("inspect image %q: %w", ref, err)
	}
	b.log.Info("pulling image", "image", ref)
	resp, err := b.cli.ImagePull(ctx, ref, client.ImagePullOptions{})
	if err != nil {
		return fmt.Errorf("pull image %q: %w", ref, err)
	}
	if err := resp.Wait(ctx); err != nil {
		return fmt.Errorf("pull image %q: %w", ref, err)
	}
	return nil
}

// Start implements backend.Backend: it unpauses or starts the container,
// creating it first when missing or drifted from spec. It returns once
// Docker reports the container running; Postgres may still be booting.
// The common paths cost one inspect plus the start or unpause itself, since
// every millisecond here is on a waiting client's clock.
func (b *Backend) Start(ctx context.Context, spec backend.Spec) (backend.Endpoint, error) {
	name := b.ContainerName(spec.Name)
	res, err := b.cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	switch {
	case cerrdefs.IsNotFound(err):
		if err := b.create(ctx, spec); err != nil {
			return backend.Endpoint{}, err
		}
	case err != nil:
		return backend.Endpoint{}, fmt.Errorf("inspect container %q: %w", name, err)
	default:
		c := res.Container
		if st := b.containerStatus(c); st.State == backend.StateRunning {
			return backend.Endpoint{Addr: st.Addr}, nil
		} else if st.State == backend.StatePaused {
			if _, err := b.cli.ContainerUnpause(ctx, name, client.ContainerUnpauseOptions{}); err != nil {
				return backend.Endpoint{}, fmt.Errorf("unpause container %q: %w", name, err)
			}
			// Addresses survive a pause: no second inspect.
			if addr := b.dialAddr(c); addr != "" {
				return backend.Endpoint{Addr: addr, Serving: true}, nil
			}
			break
		}
		if !b.matches(c, spec) { // stopped and drifted: recreate it on its volume
			if err := b.Ensure(ctx, spec); err != nil {
				return backend.Endpoint{}, err
			}
		}
	}
	if _, err := b.cli.ContainerStart(ctx, name, client.ContainerStartOptions{}); err != nil {
		return backend.Endpoint{}, fmt.Errorf("start container %q: %w", name, err)
	}
	st, err := b.Status(ctx, spec)
	if err != nil {
		return backend.Endpoint{}, err
	}
	if st.State != backend.StateRunning {
		return backend.Endpoint{}, fmt.Errorf("container %q is %s right after start (see pgwake logs %s)", name, st.State, spec.Name)
	}
	return backend.Endpoint{Addr: st.Addr}, nil
}

// Sleep implements backend.Backend.
func (b *Backend) Sleep(ctx context.Context, spec backend.Spec, mode backend.SleepMode) error {
	name := b.ContainerName(spec.Name)
	if mode == backend.SleepPause {
		if _, err := b.cli.ContainerPause(ctx, name, client.ContainerPauseOptions{}); err != nil {
			return fmt.Errorf("pause container %q: %w", name, err)
		}
		return nil
	}
	st, err := b.Status(ctx, spec)
	if err != nil {
		return err
	}
	if st.State == backend.StatePaused {
		// A frozen Postgres cannot handle SIGINT; thaw it so the stop is a
		// clean fast shutdown rather than a kill after the timeout.
		if _, err := b.cli.ContainerUnpause(ctx, name, client.ContainerUnpauseOptions{}); err != nil {
			return fmt.Errorf("unpause container %q before stop: %w", name, err)
		}
	}
	timeout := stopTimeout
	if _, err := b.cli.ContainerStop(ctx, name, client.ContainerStopOptions{Timeout: &timeout}); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("stop container %q: %w", name, err)
	}
	return nil
}

// Status implements backend.Backend.
func (b *Backend) Status(ctx context.Context, spec backend.Spec) (backend.Status, error) {
	name := b.ContainerName(spec.Name)
	res, err := b.cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return backend.Status{State: backend.StateMissing}, nil
	}
	if err != nil {
		return backend.Status{}, fmt.Errorf("inspect container %q: %w", name, err)
	}
	st := b.containerStatus(res.Container)
	if st.State == backend.StateRunning && st.Addr == "" {
		return backend.Status{}, fmt.Errorf("container %q runs without a published 5432 port on 127.0.0.1", name)
	}
	return st, nil
}

func (b *Backend) containerStatus(c container.InspectResponse) backend.Status {
	switch {
	case c.State == nil:
		return backend.Status{State: backend.StateStopped}
	case c.State.Paused:
		return backend.Status{State: backend.StatePaused}
	case c.State.Running:
		return backend.Status{State: backend.StateRunning, Addr: b.dialAddr(c)}
	}
	return backend.Status{State: backend.StateStopped}
}

// dialAddr is where the proxy connects: the container's own address when
// it is on a bridge of this host (Linux with a local engine), else the
// port published on 127.0.0.1 (Docker Desktop, remote or rootless engines).
func (b *Backend) dialAddr(c container.InspectResponse) string {
	if c.NetworkSettings != nil {
		for _, ep := range c.NetworkSettings.Networks {
			if ep != nil && ep.IPAddress.IsValid() && b.localIPs[ep.Gateway.Unmap()] {
				return net.JoinHostPort(ep.IPAddress.String(), "5432")
			}
		}
	}
	return publishedAddr(c)
}

// publishedAddr is the loopback address Docker published 5432 on.
func publishedAddr(c container.InspectResponse) string {
	if c.NetworkSettings == nil {
		return ""
	}
	for _, pb := range c.NetworkSettings.Ports[postgresPort] {
		if pb.HostPort != "" && (pb.HostIP.IsLoopback() || !pb.HostIP.IsValid()) {
			return net.JoinHostPort("127.0.0.1", pb.HostPort)
		}
	}
	return ""
}

// Remove implements backend.Backend.
func (b *Backend) Remove(ctx context.Context, spec backend.Spec, volumes bool) error {
	name := b.ContainerName(spec.Name)
	if _, err := b.cli.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove container %q: %w", name, err)
	}
	if !volumes {
		return nil
	}
	vol := b.VolumeName(spec.Name)
	if _, err := b.cli.VolumeRemove(ctx, vol, client.VolumeRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove volume %q: %w", vol, err)
	}
	return nil
}

// Logs implements backend.Logger, demultiplexing Docker's stdout/stderr
// stream into one.
func (b *Backend) Logs(ctx context.Context, spec backend.Spec, follow bool, tail int) (io.ReadCloser, error) {
	t := "all"
	if tail > 0 {
		t = fmt.Sprint(tail)
	}
	rc, err := b.cli.ContainerLogs(ctx, b.ContainerName(spec.Name), client.ContainerLogsOptions{
		ShowStdout: true, ShowStderr: true, Follow: follow, Tail: t,
	})
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, fmt.Errorf("project %q: %w", spec.Name, backend.ErrNotFound)
		}
		return nil, fmt.Errorf("container logs: %w", err)
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := stdcopy.StdCopy(pw, pw, rc)
		rc.Close()
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// Watch implements backend.Watcher: it follows the engine's events for this
// instance's containers and reports start, stop, pause and removal.
// The channel closes when ctx ends.
func (b *Backend) Watch(ctx context.Context) <-chan backend.Event {
	out := make(chan backend.Event, 16)
	go func() {
		defer close(out)
		backoff := 100 * time.Millisecond
		for ctx.Err() == nil {
			err := b.watchOnce(ctx, out)
			if ctx.Err() != nil {
				return
			}
			b.log.Warn("docker event stream broke; reconnecting", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 10*time.Second)
		}
	}()
	return out
}

func (b *Backend) watchOnce(ctx context.Context, out chan<- backend.Event) error {
	f := make(client.Filters).
		Add("type", string(events.ContainerEventType)).
		Add("label", LabelInstance+"="+b.instance).
		Add("event", "start", "die", "pause", "unpause", "destroy")
	res := b.cli.Events(ctx, client.EventsListOptions{Filters: f})
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-res.Err:
			return err
		case m := <-res.Messages:
			ev := backend.Event{Project: m.Actor.Attributes[LabelProject]}
			switch m.Action {
			case events.ActionStart, events.ActionUnPause:
				ev.State = backend.StateRunning
			case events.ActionDie:
				ev.State = backend.StateStopped
			case events.ActionPause:
				ev.State = backend.StatePaused
			case events.ActionDestroy:
				ev.State = backend.StateMissing
			default:
				continue
			}
			if ev.Project == "" {
				continue
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// Check implements backend.Checker: the engine answers a ping.
func (b *Backend) Check(ctx context.Context) error {
	if _, err := b.cli.Ping(ctx, client.PingOptions{}); err != nil {
		return fmt.Errorf("%w: %v", ErrEngineUnreachable, err)
	}
	return nil
}
