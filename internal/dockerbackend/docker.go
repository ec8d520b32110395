// Package dockerbackend runs each project's Postgres as a Docker container
// with a named volume, through the Docker Engine API.
package dockerbackend

import (
	"bytes"
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
	"sync"
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
	// LabelNewData marks a container created together with its volume:
	// its first start runs initdb.
	LabelNewData = "dev.pgwake.new-data"
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

	init initState // what each container's init markers said

	frozen frozenRuns // the containers this backend paused
}

// frozenRuns remembers, per container name, the container this backend
// paused and where it served, so that waking it costs the unpause alone:
// the inspect Start would make first is the only other engine call on a
// wake from pause, and a waiting client's. A container's ID names it for
// good, labels included, so an unpause by ID touches only the container
// pgwake paused. An entry is used once, and dropped when the engine reports
// the container started, stopped, unpaused or removed (Watch). If the
// container changed behind pgwake's back unseen, the unpause fails (not
// paused, gone) and Start takes its usual path; one restarted and paused
// again outside unpauses with the old run and address, which the proxy's
// check of every connection (Status, before a byte is relayed or pgwake's
// login is sent) refuses, and the wake is made again.
type frozenRuns struct {
	mu   sync.Mutex
	runs map[string]frozenRun
}

type frozenRun struct{ id, addr, run string }

func (f *frozenRuns) put(name string, r frozenRun) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.runs == nil {
		f.runs = map[string]frozenRun{}
	}
	f.runs[name] = r
}

// take removes and returns name's entry.
func (f *frozenRuns) take(name string) (frozenRun, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.runs[name]
	delete(f.runs, name)
	return r, ok
}

// forget removes the entry of the container with id.
func (f *frozenRuns) forget(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, r := range f.runs {
		if r.id == id {
			delete(f.runs, name)
		}
	}
}

var (
	_ backend.Backend     = (*Backend)(nil)
	_ backend.Logger      = (*Backend)(nil)
	_ backend.Watcher     = (*Backend)(nil)
	_ backend.Sweeper     = (*Backend)(nil)
	_ backend.Checker     = (*Backend)(nil)
	_ backend.Initializer = (*Backend)(nil)
	_ backend.InitChecker = (*Backend)(nil)
)

// ErrEngineUnreachable is returned by New when no Docker engine answers,
// and by any method that cannot connect to it. Such errors also match
// backend.ErrUnavailable.
var ErrEngineUnreachable = errors.New("docker engine unreachable")

// unavailableError marks an error caused by an engine that does not answer,
// keeping its message.
type unavailableError struct{ error }

func (e unavailableError) Unwrap() error { return e.error }

func (e unavailableError) Is(target error) bool {
	return target == backend.ErrUnavailable || target == ErrEngineUnreachable
}

// markUnavailable, deferred with a method's named error, marks a failure
// to connect to the engine as backend.ErrUnavailable.
func markUnavailable(err *error) {
	if *err != nil && client.IsErrConnectionFailed(*err) {
		*err = unavailableError{*err}
	}
}

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
		return nil, unavailableError{fmt.Errorf("%w at %s (is Docker running? set DOCKER_HOST or docker_host): %v",
			ErrEngineUnreachable, cli.DaemonHost(), err)}
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

// owns reports whether labels mark a container or volume that this
// instance made for project. A name alone proves nothing: somebody may have
// made it by hand, and instance "a" with project "b-c" shares its names
// with instance "a-b" and project "c".
func (b *Backend) owns(labels map[string]string, project string) bool {
	return labels[LabelManaged] == "true" && labels[LabelInstance] == b.instance && labels[LabelProject] == project
}

// notOwned is the error for a container or volume that has pgwake's name
// for a project but is not this instance's.
func notOwned(kind, name string, labels map[string]string) error {
	if labels[LabelManaged] == "true" {
		return fmt.Errorf("%s %q exists but was %w (it belongs to pgwake instance %q, project %q): use another project name",
			kind, name, backend.ErrNotOwned, labels[LabelInstance], labels[LabelProject])
	}
	return fmt.Errorf("%s %q exists but was %w (no dev.pgwake labels): rename or remove it yourself",
		kind, name, backend.ErrNotOwned)
}

// projectFilter selects what this instance made for project, under any
// name.
func (b *Backend) projectFilter(project string) client.Filters {
	return b.instanceFilter().Add("label", LabelProject+"="+project)
}

// instanceFilter selects everything this instance made.
func (b *Backend) instanceFilter() client.Filters {
	return make(client.Filters).Add("label", LabelManaged+"=true", LabelInstance+"="+b.instance)
}

// inspect returns the project's container, nil when there is none, or an
// error wrapping backend.ErrNotOwned when its name is taken by a container
// this instance did not make for the project.
func (b *Backend) inspect(ctx context.Context, spec backend.Spec) (*container.InspectResponse, error) {
	name := b.ContainerName(spec.Name)
	res, err := b.cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inspect container %q: %w", name, err)
	}
	c := res.Container
	var labels map[string]string
	if c.Config != nil {
		labels = c.Config.Labels
	}
	if !b.owns(labels, spec.Name) {
		return nil, notOwned("container", name, labels)
	}
	return &c, nil
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
	// Settings become the container's command. Without any the hash is
	// what it was before settings existed, so containers made then stay.
	// Init is not hashed: it runs once, and changing it later changes
	// nothing.
	if len(spec.Settings) > 0 {
		h.Write([]byte("settings\x00"))
		for _, a := range backend.SettingArgs(spec.Settings) {
			h.Write([]byte(a))
			h.Write([]byte{0})
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Ensure implements backend.Backend: it creates the volume and container if
// missing and recreates a container that no longer matches spec, keeping the
// volume. A container or volume with pgwake's name but without this
// instance's labels for the project is left alone: Ensure returns an error
// wrapping backend.ErrNotOwned and changes nothing.
//
// When Ensure fails, nothing it created in this call remains: the
// container is created last, and a volume it created for it is removed
// again. (A drifted container it removed stays removed; its volume stays.)
func (b *Backend) Ensure(ctx context.Context, spec backend.Spec) (err error) {
	defer markUnavailable(&err)
	c, err := b.inspect(ctx, spec)
	if err != nil {
		return err
	}
	_, err = b.reconcile(ctx, spec, c)
	return err
}

// reconcile returns the ID of a container that matches spec: c itself
// (the project's container, nil when missing) if it does, else a new one on
// the project's volume.
func (b *Backend) reconcile(ctx context.Context, spec backend.Spec, c *container.InspectResponse) (string, error) {
	if c != nil {
		if b.matches(*c, spec) {
			return c.ID, nil
		}
		name := b.ContainerName(spec.Name)
		b.log.Warn("container changed outside pgwake; recreating it with its volume",
			"project", spec.Name, "container", name)
		if err := b.removeContainer(ctx, c.ID); err != nil {
			return "", fmt.Errorf("remove drifted container %q: %w", name, err)
		}
	}
	return b.create(ctx, spec)
}

// matches reports whether an owned container is the one pgwake would create
// for spec: its labels carry spec's hash, and 5432 is published on loopback
// only.
func (b *Backend) matches(c container.InspectResponse, spec backend.Spec) bool {
	return c.Config != nil && c.Config.Labels[LabelSpec] == specHash(spec) && hasLoopbackBinding(c.HostConfig)
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

// removeContainer force-removes one of pgwake's own containers with its
// anonymous volumes (those the image declares and the data mount does not
// cover; named volumes stay), so none is left dangling.
func (b *Backend) removeContainer(ctx context.Context, id string) error {
	_, err := b.cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return err
	}
	return nil
}

// create makes the project's volume (unless it exists) and container, and
// returns the container's ID. If the container cannot be created, a volume
// made by this call is removed again; one that existed before may hold a
// kept project's data and stays.
func (b *Backend) create(ctx context.Context, spec backend.Spec) (string, error) {
	img, err := b.ensureImage(ctx, spec.Image)
	if err != nil {
		return "", err
	}
	var imgEnv, imgCmd []string
	var imgVolumes map[string]struct{}
	if cfg := img.Config; cfg != nil {
		imgEnv, imgVolumes, imgCmd = cfg.Env, cfg.Volumes, cfg.Cmd
	}
	target := dataMountTarget(imgEnv, imgVolumes)

	vol := b.VolumeName(spec.Name)
	made, err := b.ensureVolume(ctx, spec, vol)
	if err != nil {
		return "", err
	}

	clabels := b.labels(spec)
	clabels[LabelSpec] = specHash(spec)
	if made {
		clabels[LabelNewData] = "true"
	}
	if len(spec.Init) > 0 {
		clabels[LabelInit] = "true"
	}
	// Settings go on the image's own command (postgres, for the official
	// image, whose entrypoint passes -c options on to the server, its
	// temporary initdb server included).
	var cmd []string
	if len(spec.Settings) > 0 {
		cmd = append(cmd, imgCmd...)
		if len(cmd) == 0 {
			cmd = []string{"postgres"}
		}
		cmd = append(cmd, backend.SettingArgs(spec.Settings)...)
	}
	timeout := stopTimeout
	res, err := b.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Name: b.ContainerName(spec.Name),
		Config: &container.Config{
			Image: spec.Image,
			Cmd:   cmd,
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
	if err == nil && len(spec.Init) > 0 {
		// Before its first start: the entrypoint looks for them then.
		if err = b.copyInit(ctx, res.ID, spec); err != nil {
			if rerr := b.removeContainer(context.WithoutCancel(ctx), res.ID); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	} else if err != nil {
		err = fmt.Errorf("create container for project %q: %w", spec.Name, err)
	}
	if err != nil {
		if made {
			err = errors.Join(err, b.rollbackVolume(ctx, vol))
		}
		return "", err
	}
	return res.ID, nil
}

// ensureVolume makes the project's data volume unless this instance
// already made it, and reports whether it did. A volume of that name
// without this instance's labels for the project is an error wrapping
// backend.ErrNotOwned.
func (b *Backend) ensureVolume(ctx context.Context, spec backend.Spec, vol string) (made bool, err error) {
	res, err := b.cli.VolumeInspect(ctx, vol, client.VolumeInspectOptions{})
	switch {
	case err == nil:
		if !b.owns(res.Volume.Labels, spec.Name) {
			return false, notOwned("volume", vol, res.Volume.Labels)
		}
		return false, nil
	case !cerrdefs.IsNotFound(err):
		return false, fmt.Errorf("inspect volume %q: %w", vol, err)
	}
	cres, err := b.cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: vol, Labels: b.labels(spec)})
	if err != nil {
		return false, fmt.Errorf("create volume %q: %w", vol, err)
	}
	// Creating a volume that exists returns the existing one: somebody
	// else made it since the inspect.
	if !b.owns(cres.Volume.Labels, spec.Name) {
		return false, notOwned("volume", vol, cres.Volume.Labels)
	}
	return true, nil
}

// rollbackVolume removes a volume create made before failing. It runs even
// when ctx has ended (that may be why create failed) and never forces: a
// volume something already uses stays.
func (b *Backend) rollbackVolume(ctx context.Context, vol string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, err := b.cli.VolumeRemove(ctx, vol, client.VolumeRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove volume %q made for it (pgwake rm --volumes removes it later): %w", vol, err)
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

// ErrImagePull matches a PullError: the engine lacks the image and could
// not pull it (no registry, as on an offline machine, or no such image).
var ErrImagePull = errors.New("image cannot be pulled")

// PullError is an image the engine lacks and could not pull. Its message
// is one line naming the ways out, since the usual cause is a machine
// without registry access, where every create and first start would fail
// alike.
type PullError struct {
	Ref string
	Err error // the engine's reason
}

func (e *PullError) Error() string {
	return fmt.Sprintf("image %q is not on this Docker engine and cannot be pulled (%s); "+
		"use an image the engine has (create --image, or the image config key / PGWAKE_IMAGE), "+
		"the local backend (pgwake up --backend local), "+
		"or build one offline with pgwake's testdata/postgres-image/build.sh",
		e.Ref, strings.Join(strings.Fields(e.Err.Error()), " "))
}

func (e *PullError) Unwrap() []error { return []error{ErrImagePull, e.Err} }

// ensureImage pulls ref when the engine lacks it, and returns its config.
func (b *Backend) ensureImage(ctx context.Context, ref string) (client.ImageInspectResult, error) {
	img, err := b.cli.ImageInspect(ctx, ref)
	if err == nil {
		return img, nil
	} else if !cerrdefs.IsNotFound(err) {
		return img, fmt.Errorf("inspect image %q: %w", ref, err)
	}
	b.log.Info("pulling image", "image", ref)
	resp, err := b.cli.ImagePull(ctx, ref, client.ImagePullOptions{})
	if err == nil {
		err = resp.Wait(ctx)
	}
	if err != nil {
		if client.IsErrConnectionFailed(err) || ctx.Err() != nil {
			return img, fmt.Errorf("pull image %q: %w", ref, err)
		}
		return img, &PullError{Ref: ref, Err: err}
	}
	img, err = b.cli.ImageInspect(ctx, ref)
	if err != nil {
		return img, fmt.Errorf("inspect image %q: %w", ref, err)
	}
	return img, nil
}

// Start implements backend.Backend: it unpauses or starts the container,
// creating it first when missing or drifted from spec. It returns once
// Docker reports the container running; Postgres may still be booting.
// The common paths cost one inspect plus the start itself (and the inspect
// after it that reads the new address and run ID), and a wake from a pause
// this backend made only the unpause (frozenRuns), since every millisecond
// here is on a waiting client's clock.
//
// A container that is no longer running when inspected after the start
// (its entrypoint failed at once) is an error carrying its exit reason and
// the last lines of its log. One that dies a moment later is reported as
// running: the caller learns otherwise from Status (its Exit) or Watch.
func (b *Backend) Start(ctx context.Context, spec backend.Spec) (_ backend.Endpoint, err error) {
	defer markUnavailable(&err)
	name := b.ContainerName(spec.Name)
	if r, ok := b.frozen.take(name); ok {
		if _, err := b.cli.ContainerUnpause(ctx, r.id, client.ContainerUnpauseOptions{}); err == nil {
			return backend.Endpoint{Addr: r.addr, ID: r.run, Serving: true}, nil
		}
		// Not paused any more, or gone: find out what is there.
	}
	c, err := b.inspect(ctx, spec)
	if err != nil {
		return backend.Endpoint{}, err
	}
	var id string
	if c != nil {
		id = c.ID
		switch st := b.containerStatus(*c); st.State {
		case backend.StateRunning:
			if st.Addr == "" {
				return backend.Endpoint{}, noPortError(name)
			}
			return backend.Endpoint{Addr: st.Addr, ID: st.ID}, nil
		case backend.StatePaused:
			if _, err := b.cli.ContainerUnpause(ctx, id, client.ContainerUnpauseOptions{}); err != nil {
				return backend.Endpoint{}, fmt.Errorf("unpause container %q: %w", name, err)
			}
			// Addresses and the run survive a pause: no second inspect.
			if addr := b.dialAddr(*c); addr != "" {
				return backend.Endpoint{Addr: addr, ID: st.ID, Serving: true}, nil
			}
			return b.endpointAfterStart(ctx, spec, id, "")
		}
	}
	// An init that began on this data and did not complete: refuse to
	// serve it, before a drifted container (and its log) is replaced.
	if c != nil && c.Config != nil {
		if err := b.checkInit(ctx, spec, c.ID, c.Config.Env); err != nil {
			return backend.Endpoint{}, err
		}
	}
	// Missing, or stopped and drifted: (re)create it on its volume.
	if c == nil || !b.matches(*c, spec) {
		if id, err = b.reconcile(ctx, spec, c); err != nil {
			return backend.Endpoint{}, err
		}
		// A new container on data that may exist (a drifted or removed
		// one's): its markers hold.
		if err := b.checkInitOf(ctx, spec, id); err != nil {
			return backend.Endpoint{}, err
		}
	}
	// This run's log begins after this call. Not at the earlier run's
	// FinishedAt: that is when its process exited, and the engine stamps
	// a log line when it reads it, which under load is later (seen: the
	// earlier crash's last line shown as this run's).
	startCalled := time.Now()
	if _, err := b.cli.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil {
		return backend.Endpoint{}, fmt.Errorf("start container %q: %w", name, err)
	}
	since := ""
	neverStarted := c == nil || c.ID != id || c.State == nil
	if !neverStarted {
		t, err := time.Parse(time.RFC3339Nano, c.State.StartedAt)
		neverStarted = err != nil || t.IsZero() || t.Year() < 2
		if !neverStarted {
			since = startCalled.UTC().Format(time.RFC3339Nano)
		}
	}
	ep, err := b.endpointAfterStart(ctx, spec, id, since)
	if err == nil && neverStarted {
		ep.First = b.hasNewData(ctx, id)
	}
	return ep, err
}

// WillInitialize implements backend.Initializer: a container that was
// made together with its volume and never started runs initdb when it
// starts, and so does one Start makes with a new volume. (A container
// recreated on its existing volume does not.)
func (b *Backend) WillInitialize(ctx context.Context, spec backend.Spec) bool {
	res, err := b.cli.ContainerInspect(ctx, b.ContainerName(spec.Name), client.ContainerInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		_, verr := b.cli.VolumeInspect(ctx, b.VolumeName(spec.Name), client.VolumeInspectOptions{})
		return cerrdefs.IsNotFound(verr)
	}
	if err != nil || res.Container.State == nil || res.Container.Config == nil {
		return false
	}
	t, err := time.Parse(time.RFC3339Nano, res.Container.State.StartedAt)
	neverStarted := err != nil || t.Year() < 2
	return neverStarted && res.Container.Config.Labels[LabelNewData] == "true"
}

// hasNewData reports whether the container was made together with its
// volume, so that its first start runs initdb.
func (b *Backend) hasNewData(ctx context.Context, id string) bool {
	res, err := b.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	return err == nil && res.Container.Config != nil && res.Container.Config.Labels[LabelNewData] == "true"
}

// endpointAfterStart inspects a container just started or unpaused for its
// address and run ID. If it is not running, the error shows its log
// since this run's start (since, an RFC 3339 time; "" for all of it).
func (b *Backend) endpointAfterStart(ctx context.Context, spec backend.Spec, id, since string) (backend.Endpoint, error) {
	name := b.ContainerName(spec.Name)
	res, err := b.cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		return backend.Endpoint{}, fmt.Errorf("inspect container %q after start: %w", name, err)
	}
	st := b.containerStatus(res.Container)
	switch {
	case st.State == backend.StateStopped:
		msg := fmt.Sprintf("container %q %s right after start", name, st.Exit)
		if st.Exit == "" {
			msg = fmt.Sprintf("container %q stopped right after start", name)
		}
		if tail := b.logTail(ctx, id, logTailLines, since); tail != "" {
			msg += "; its log ends: " + tail
		}
		return backend.Endpoint{}, errors.New(msg)
	case st.State != backend.StateRunning:
		return backend.Endpoint{}, fmt.Errorf("container %q is %s right after start", name, st.State)
	case st.Addr == "":
		return backend.Endpoint{}, noPortError(name)
	}
	return backend.Endpoint{Addr: st.Addr, ID: st.ID}, nil
}

func noPortError(name string) error {
	return fmt.Errorf("container %q runs without a published 5432 port on 127.0.0.1", name)
}

// pause freezes the container's cgroup. runc gives up freezing when the
// processes keep changing state (seen on a loaded machine: "OCI runtime
// pause failed: unable to freeze"), and leaves them running: that is
// worth a few more tries.
func (b *Backend) pause(ctx context.Context, id, name string) error {
	var err error
	for attempt, delay := 0, 50*time.Millisecond; attempt < 4; attempt, delay = attempt+1, delay*2 {
		if _, err = b.cli.ContainerPause(ctx, id, client.ContainerPauseOptions{}); err == nil {
			return nil
		}
		if !strings.Contains(err.Error(), "unable to freeze") {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pause container %q: %w", name, err)
		case <-time.After(delay):
		}
	}
	return fmt.Errorf("pause container %q: %w", name, err)
}

// logTailLines is how much of a container's log an error shows.
const logTailLines = 10

// LogTail returns the last n lines of the project's container log (stdout
// and stderr in order) joined with " | " for an error message, or "" when
// there is none or it cannot be read.
func (b *Backend) LogTail(ctx context.Context, spec backend.Spec, n int) string {
	c, err := b.inspect(ctx, spec)
	if err != nil || c == nil {
		return ""
	}
	return b.logTail(ctx, c.ID, n, "")
}

// logTail is LogTail for a container, of its log after since (an RFC 3339
// time; "" for all of it).
func (b *Backend) logTail(ctx context.Context, id string, n int, since string) string {
	if n <= 0 {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rc, err := b.cli.ContainerLogs(ctx, id, client.ContainerLogsOptions{
		ShowStdout: true, ShowStderr: true, Tail: fmt.Sprint(n), Since: since,
	})
	if err != nil {
		return ""
	}
	defer rc.Close()
	var buf bytes.Buffer
	lw := &limitedWriter{w: &buf, n: 64 << 10}
	if _, err := stdcopy.StdCopy(lw, lw, rc); err != nil && !errors.Is(err, errLimit) {
		return ""
	}
	var lines []string
	for l := range strings.Lines(buf.String()) {
		if l = strings.TrimSpace(l); l != "" {
			if len(l) > maxLogLine {
				l = l[:maxLogLine] + "..."
			}
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// maxLogLine bounds one log line in an error message.
const maxLogLine = 300

var errLimit = errors.New("log tail too long")

// limitedWriter writes up to n bytes, then fails with errLimit.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if len(p) > l.n {
		k, _ := l.w.Write(p[:l.n])
		l.n = 0
		return k, errLimit
	}
	l.n -= len(p)
	return l.w.Write(p)
}

// Sleep implements backend.Backend.
func (b *Backend) Sleep(ctx context.Context, spec backend.Spec, mode backend.SleepMode) (err error) {
	defer markUnavailable(&err)
	name := b.ContainerName(spec.Name)
	c, err := b.inspect(ctx, spec)
	if err != nil {
		return err
	}
	if c == nil {
		if mode == backend.SleepPause {
			return fmt.Errorf("pause container %q: %w", name, backend.ErrNotFound)
		}
		return nil
	}
	paused := c.State != nil && c.State.Paused
	if mode == backend.SleepPause {
		if !paused {
			if err := b.pause(ctx, c.ID, name); err != nil {
				return err
			}
		}
		if addr := b.dialAddr(*c); addr != "" && c.State != nil && (c.State.Running || c.State.Paused) {
			b.frozen.put(name, frozenRun{id: c.ID, addr: addr, run: runID(*c)})
		}
		return nil
	}
	if err := b.stop(ctx, c.ID, paused); err != nil {
		return fmt.Errorf("container %q: %w", name, err)
	}
	return nil
}

// Kill implements backend.Killer: SIGQUIT, Postgres's immediate shutdown.
// Sent with kill, not stop: engines before API 1.42 ignore stop's signal.
func (b *Backend) Kill(ctx context.Context, spec backend.Spec) (err error) {
	defer markUnavailable(&err)
	c, err := b.inspect(ctx, spec)
	if err != nil || c == nil || c.State == nil || !c.State.Running {
		return err
	}
	name := b.ContainerName(spec.Name)
	if err := b.thaw(ctx, c.ID, c.State.Paused); err != nil {
		return fmt.Errorf("container %q: %w", name, err)
	}
	wctx, cancel := context.WithTimeout(ctx, stopTimeout*time.Second)
	defer cancel()
	exited := b.cli.ContainerWait(wctx, c.ID, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	if _, err := b.cli.ContainerKill(ctx, c.ID, client.ContainerKillOptions{Signal: "SIGQUIT"}); err != nil &&
		!cerrdefs.IsNotFound(err) && !cerrdefs.IsConflict(err) { // gone, or not running
		return fmt.Errorf("container %q: kill: %w", name, err)
	}
	select {
	case <-exited.Result:
		return nil
	case err := <-exited.Error:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Not out yet (or the wait failed): the stop's own timeout and
		// SIGKILL end it.
		b.log.Warn("the server did not exit on its immediate shutdown; stopping it", "container", name, "err", err)
		return b.stop(ctx, c.ID, false)
	}
}

// stop shuts a container's Postgres down fast (SIGINT, with stopTimeout to
// finish its checkpoint before Docker kills it: a kill means crash recovery
// on the next start).
func (b *Backend) stop(ctx context.Context, id string, paused bool) error {
	if err := b.thaw(ctx, id, paused); err != nil {
		return err
	}
	timeout := stopTimeout
	if _, err := b.cli.ContainerStop(ctx, id, client.ContainerStopOptions{Signal: "SIGINT", Timeout: &timeout}); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("stop: %w", err)
	}
	return nil
}

// thaw unpauses a paused container before a stop or kill: a frozen
// Postgres handles no signal, and would be killed after the timeout
// rather than shut down.
func (b *Backend) thaw(ctx context.Context, id string, paused bool) error {
	if !paused {
		return nil
	}
	if _, err := b.cli.ContainerUnpause(ctx, id, client.ContainerUnpauseOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("unpause before stopping: %w", err)
	}
	return nil
}

// Status implements backend.Backend. A container with the project's name
// that is not this instance's is an error wrapping backend.ErrNotOwned.
func (b *Backend) Status(ctx context.Context, spec backend.Spec) (_ backend.Status, err error) {
	defer markUnavailable(&err)
	c, err := b.inspect(ctx, spec)
	if err != nil {
		return backend.Status{}, err
	}
	if c == nil {
		return backend.Status{State: backend.StateMissing}, nil
	}
	st := b.containerStatus(*c)
	if st.State == backend.StateRunning && st.Addr == "" {
		return backend.Status{}, noPortError(b.ContainerName(spec.Name))
	}
	if st.State == backend.StateStopped && c.Config != nil && c.Config.Labels[LabelInit] == "true" {
		// A first start whose init script failed: say which and why (the
		// caller's wake ends with it) rather than only the exit code.
		var ie *backend.InitError
		if err := b.checkInit(ctx, spec, c.ID, c.Config.Env); errors.As(err, &ie) {
			st.Exit = strings.TrimSpace(fmt.Sprintf("%s: init script %s failed; its data is not served and init does not run again: `pgwake rm --volumes %s`, then create it again",
				st.Exit, ie.Script, spec.Name))
			st.Log = ie.Message
		}
	}
	return st, nil
}

func (b *Backend) containerStatus(c container.InspectResponse) backend.Status {
	s := c.State
	switch {
	case s == nil:
		return backend.Status{State: backend.StateStopped}
	case s.Paused:
		return backend.Status{State: backend.StatePaused, ID: runID(c)}
	case s.Running:
		return backend.Status{State: backend.StateRunning, Addr: b.dialAddr(c), ID: runID(c)}
	}
	return backend.Status{State: backend.StateStopped, Exit: exitReason(s)}
}

// runID identifies one run of a container: Docker sets StartedAt on every
// start (not on unpause), and the container ID tells a recreated container
// from the old one.
func runID(c container.InspectResponse) string {
	return c.ID + "@" + c.State.StartedAt
}

// exitReason says why a container that is not running stopped, or "" when
// it never ran.
func exitReason(s *container.State) string {
	if s.Status == container.StateCreated && s.Error == "" {
		return ""
	}
	r := fmt.Sprintf("exited with code %d", s.ExitCode)
	if s.OOMKilled {
		r += " (OOM killed)"
	}
	if s.Error != "" {
		r += ": " + s.Error
	}
	return r
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

// Remove implements backend.Backend. It removes every container (and, with
// volumes, every volume) labelled for this instance and project, whatever
// its name, so leftovers of failed operations and of a crashed pgwake go
// too. If the project's container name (or, with volumes, its volume name)
// is taken by something this instance did not make, Remove touches nothing
// and returns an error wrapping backend.ErrNotOwned.
//
// Without volumes the data stays, so a running server is first shut down
// fast (as Sleep does) and the next server starts without crash recovery;
// with volumes it is simply killed.
func (b *Backend) Remove(ctx context.Context, spec backend.Spec, volumes bool) (err error) {
	defer markUnavailable(&err)
	if _, err := b.inspect(ctx, spec); err != nil {
		return err
	}
	if volumes {
		vol := b.VolumeName(spec.Name)
		res, err := b.cli.VolumeInspect(ctx, vol, client.VolumeInspectOptions{})
		switch {
		case err == nil:
			if !b.owns(res.Volume.Labels, spec.Name) {
				return notOwned("volume", vol, res.Volume.Labels)
			}
		case !cerrdefs.IsNotFound(err):
			return fmt.Errorf("inspect volume %q: %w", vol, err)
		}
	}
	return b.removeLabelled(ctx, b.projectFilter(spec.Name), volumes)
}

// RemoveAll implements backend.Sweeper: it removes every container this
// instance made (labels dev.pgwake.managed=true and dev.pgwake.instance)
// and, with volumes, every such volume. Like Remove, it shuts servers down
// fast first when their data stays.
func (b *Backend) RemoveAll(ctx context.Context, volumes bool) (err error) {
	defer markUnavailable(&err)
	return b.removeLabelled(ctx, b.instanceFilter(), volumes)
}

// removeLabelled removes the containers and, with volumes, the volumes
// that f selects. Containers go in parallel (each fast shutdown may take a
// checkpoint's time), volumes after them, since Docker refuses to remove a
// volume a container still uses.
func (b *Backend) removeLabelled(ctx context.Context, f client.Filters, volumes bool) error {
	cs, err := b.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for _, c := range cs.Items {
		wg.Go(func() {
			name := c.ID
			if len(c.Names) > 0 {
				name = strings.TrimPrefix(c.Names[0], "/")
			}
			if !volumes && (c.State == container.StateRunning || c.State == container.StatePaused) {
				if err := b.stop(ctx, c.ID, c.State == container.StatePaused); err != nil {
					fail(fmt.Errorf("container %q: %w", name, err))
					return
				}
			}
			if err := b.removeContainer(ctx, c.ID); err != nil {
				fail(fmt.Errorf("remove container %q: %w", name, err))
			}
		})
	}
	wg.Wait()
	if volumes {
		vs, err := b.cli.VolumeList(ctx, client.VolumeListOptions{Filters: f})
		if err != nil {
			errs = append(errs, fmt.Errorf("list volumes: %w", err))
		}
		for _, v := range vs.Items {
			if _, err := b.cli.VolumeRemove(ctx, v.Name, client.VolumeRemoveOptions{}); err != nil && !cerrdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("remove volume %q: %w", v.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Logs implements backend.Logger, demultiplexing Docker's stdout/stderr
// stream into one.
func (b *Backend) Logs(ctx context.Context, spec backend.Spec, follow bool, tail int) (_ io.ReadCloser, err error) {
	defer markUnavailable(&err)
	c, err := b.inspect(ctx, spec)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, fmt.Errorf("project %q: %w", spec.Name, backend.ErrNotFound)
	}
	t := "all"
	if tail > 0 {
		t = fmt.Sprint(tail)
	}
	rc, err := b.cli.ContainerLogs(ctx, c.ID, client.ContainerLogsOptions{
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
// instance's containers and reports start, stop (die: a crash as well as a
// stop), pause and removal. The channel closes when ctx ends.
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
			if m.Actor.Attributes[LabelRole] != "" {
				continue // a helper (a copy), not the project's server
			}
			if m.Action != events.ActionPause {
				// Changed since pgwake paused it: the next wake looks.
				b.frozen.forget(m.Actor.ID)
			}
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
		return unavailableError{fmt.Errorf("%w: %v", ErrEngineUnreachable, err)}
	}
	return nil
}
