// Package backend defines what the proxy needs from a runtime that hosts
// per-project Postgres servers. The proxy knows nothing about Docker,
// processes or Kubernetes; each runtime is its own package implementing
// Backend.
package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"
)

// SleepMode says how a project sleeps.
type SleepMode string

const (
	// SleepStop shuts Postgres down (fast shutdown). Costs nothing while
	// asleep; waking pays a Postgres start.
	SleepStop SleepMode = "stop"
	// SleepPause freezes the server (cgroup freezer). Memory stays
	// allocated; waking is nearly instant.
	SleepPause SleepMode = "pause"
	// SleepTiered pauses first (a wake takes milliseconds) and stops the
	// paused server later (freeing its memory). It is the proxy's, not a
	// backend's: Backend.Sleep is only ever called with SleepStop or
	// SleepPause, and a backend that cannot pause cannot sleep tiered.
	SleepTiered SleepMode = "tiered"
)

// ParseSleepMode validates a sleep mode name.
func ParseSleepMode(s string) (SleepMode, error) {
	switch SleepMode(s) {
	case SleepStop, SleepPause, SleepTiered:
		return SleepMode(s), nil
	}
	return "", errors.New(`sleep mode must be "stop", "pause" or "tiered"`)
}

// Spec is everything a backend needs to create a project's server. It is
// the project's desired state: a server that drifted from it is recreated
// (keeping its data).
type Spec struct {
	Name     string // project name, also the routing key
	Image    string // container image, for backends that use one
	User     string // superuser name
	Password string // superuser password (scram-sha-256)
	Database string // database created on first start
	// Adopted names the object the project was adopted from (see
	// Record.Adopted): a backend never creates a server for such a spec,
	// whatever it finds missing.
	Adopted string
	// Init are the project's init scripts, absolute paths of files named
	// by InitKind, in the order they run: once, at the first start of a new
	// data directory, as the official image runs /docker-entrypoint-initdb.d
	// (SQL through psql with ON_ERROR_STOP, .sh with sh). A failure leaves
	// the data marked, and every later start fails with an *InitError
	// naming the script (see InitError). Not part of the server's desired
	// state: changing it after the first start changes nothing.
	Init []string
	// Settings are server settings (GUC name -> value) applied on every
	// start as `postgres -c name=value`; a change applies at the next
	// start. Names are checked by ValidateSetting.
	Settings map[string]string
}

// Init script kinds, by how a file's name ends (InitKind).
const (
	InitSQL   = ".sql"
	InitSQLGz = ".sql.gz"
	InitShell = ".sh"
)

// InitKind returns the kind of an init script by its name's ending, or ""
// for a name the official image would ignore (pgwake refuses those rather
// than skip them silently).
func InitKind(name string) string {
	switch {
	case strings.HasSuffix(name, InitSQLGz):
		return InitSQLGz
	case strings.HasSuffix(name, InitSQL):
		return InitSQL
	case strings.HasSuffix(name, InitShell):
		return InitShell
	}
	return ""
}

// InitError is a project whose init scripts did not complete at its first
// start: one failed (Script is its name, Message what the server or the
// script said), or the start was interrupted while they ran. Its data is
// half-initialised: it is never served, and the scripts never run again.
type InitError struct {
	Project string
	Script  string // the script's own name, "" when unknown
	Message string
}

func (e *InitError) Error() string {
	what := "init scripts did not complete"
	if e.Script != "" {
		what = fmt.Sprintf("init script %s failed", e.Script)
	}
	msg := e.Message
	if msg == "" {
		msg = "(no output recorded)"
	}
	return fmt.Sprintf("%s at the first start: %s; the half-initialised data is not served and init does not run again: "+
		"`pgwake rm --volumes %s`, then create it again", what, msg, e.Project)
}

// Is makes errors.Is(err, ErrInitFailed) match any InitError.
func (e *InitError) Is(target error) bool { return target == ErrInitFailed }

// ErrInitFailed matches every *InitError.
var ErrInitFailed = errors.New("init scripts failed")

// InitChecker is implemented by backends that run init scripts: it reports
// a project's recorded init failure (an *InitError), or nil when its init
// completed, has not run yet, or the project has none. It does not start
// anything.
type InitChecker interface {
	InitFailure(ctx context.Context, spec Spec) error
}

// settingName is a GUC name as postgres -c accepts it: an identifier, or a
// custom class's dotted name (pg_stat_statements.max).
var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)*$`)

// managedSettings are settings pgwake itself sets for the server to be
// reachable where it dials and stores it: overriding them would lose it.
var managedSettings = map[string]bool{
	"port": true, "listen_addresses": true, "unix_socket_directories": true,
	"data_directory": true, "config_file": true, "hba_file": true, "ident_file": true,
}

// ValidateSetting checks a server setting's name (postgres checks its
// value when the server starts). Names are case-insensitive in Postgres;
// callers store them lower-cased.
func ValidateSetting(name string) error {
	if !settingName.MatchString(name) {
		return fmt.Errorf("setting %q is not a Postgres setting name (letters, digits, _ and $, a dot for an extension's, like work_mem or pg_stat_statements.max)", name)
	}
	if managedSettings[strings.ToLower(name)] {
		return fmt.Errorf("setting %s is managed by pgwake (the server must be reachable where pgwake dials it) and cannot be set", name)
	}
	return nil
}

// SettingArgs returns settings as postgres command-line options, sorted
// by name: -c name=value ...
func SettingArgs(settings map[string]string) []string {
	names := make([]string, 0, len(settings))
	for k := range settings {
		names = append(names, k)
	}
	sort.Strings(names)
	var out []string
	for _, k := range names {
		out = append(out, "-c", k+"="+settings[k])
	}
	return out
}

// State is a server's observed state.
type State string

const (
	StateMissing State = "missing" // nothing exists; Ensure creates it
	StateStopped State = "stopped"
	StatePaused  State = "paused"
	StateRunning State = "running"
)

// Endpoint is where a started server is dialled.
type Endpoint struct {
	Addr string // host:port
	// ID identifies this run of the server (see Status.ID). The proxy
	// relays only to the run it started: an address can be handed to
	// another server once this one is gone.
	ID string
	// First is set when this start initialises the server's data (the
	// image's initdb on an empty volume): it is slower than any wake, and
	// callers keep it out of their cold-start statistics.
	First bool
	// Serving is set when the runtime knows Postgres already serves: it
	// resumed a server that was serving when it was paused. The proxy then
	// skips its readiness probe (clients still peek at the first reply).
	Serving bool
}

// Status is a server's observed state and, when running, where to dial it.
type Status struct {
	State State
	Addr  string // host:port; set when State is StateRunning
	// ID identifies this run of the server: it is set while the server
	// runs (or is paused) and differs for every start (a container's ID
	// and start time; a postmaster's pid and start time). Two Status calls
	// with the same ID bracket a time in which Addr belonged to this
	// server and no other. A backend that leaves it empty gets only the
	// weaker check that the address is unchanged.
	ID string
	// Exit says why a server that is not running stopped, when the runtime
	// knows ("exited with code 1", "killed: out of memory"); for errors.
	// For a running server that its runtime restarted in place (a
	// Kubernetes container after a crash), why the run before ended.
	Exit string
	// Log is the end of what that stopped server wrote, when the runtime
	// has it at hand; otherwise callers ask a Logger.
	Log string
}

// Backend hosts per-project Postgres servers. All methods are safe for
// concurrent use. For one project the proxy never overlaps Start, Sleep and
// Remove with each other, but Status may run at any time, concurrently with
// any of them (every client connection is checked with it).
type Backend interface {
	// Name is a short name for logs and status ("docker").
	Name() string
	// Ensure makes the project's server exist as spec says, without
	// starting it. It is idempotent.
	Ensure(ctx context.Context, spec Spec) error
	// Start wakes the server (start or unpause), first creating it from
	// spec when missing or drifted (as Ensure), and returns the address to
	// dial. It returns once the runtime reports the server running; the
	// proxy then waits until Postgres itself serves.
	Start(ctx context.Context, spec Spec) (Endpoint, error)
	// Sleep stops or pauses the server (mode SleepStop or SleepPause;
	// the proxy translates SleepTiered into those). Stop uses Postgres
	// fast shutdown, also for a paused server.
	Sleep(ctx context.Context, spec Spec, mode SleepMode) error
	// Status reports the server's current state.
	Status(ctx context.Context, spec Spec) (Status, error)
	// Remove deletes the server; with volumes it deletes its data too.
	Remove(ctx context.Context, spec Spec, volumes bool) error
	// Close releases the backend's resources.
	Close() error
}

// Logger is implemented by backends that can show a server's log.
type Logger interface {
	// Logs streams the server's log. With follow it streams until ctx ends.
	Logs(ctx context.Context, spec Spec, follow bool, tail int) (io.ReadCloser, error)
}

// Event is a change to a server made outside the proxy's own calls, for
// example a container stopped or removed by hand.
type Event struct {
	Project string
	State   State
}

// Watcher is implemented by backends that report outside changes.
type Watcher interface {
	// Watch sends events until ctx ends, then closes the channel. A broken
	// event stream is retried internally.
	Watch(ctx context.Context) <-chan Event
}

// ErrNotFound is returned for a project the backend has no server for.
var ErrNotFound = errors.New("server not found")

// ErrNotOwned is returned when something pgwake would create already
// exists but does not carry pgwake's labels (or another instance's): it is
// somebody else's, and pgwake neither replaces nor removes it.
var ErrNotOwned = errors.New("not created by this pgwake")

// ErrUnavailable is returned for every call on a runtime that cannot be
// reached (a Docker engine that does not answer): the project's data lives
// there, so pgwake reports the error rather than serve it from elsewhere.
var ErrUnavailable = errors.New("backend unavailable")

// Sweeper is implemented by backends that can find everything they made
// for this pgwake instance by its labels, including leftovers of failed
// operations and of a crashed pgwake, not only the projects in the state
// file.
type Sweeper interface {
	// RemoveAll stops and removes every server of this instance and, with
	// volumes, its data. It touches nothing without this instance's labels.
	RemoveAll(ctx context.Context, volumes bool) error
}

// PauseSupporter is implemented by backends that may be unable to pause a
// server; a backend without it pauses.
type PauseSupporter interface {
	SupportsPause() bool
}

// CanPause reports whether b can put servers to sleep with SleepPause.
func CanPause(b Backend) bool {
	if ps, ok := b.(PauseSupporter); ok {
		return ps.SupportsPause()
	}
	return true
}

// Killer is implemented by backends that can stop a server at once
// (Postgres's immediate shutdown: no final checkpoint), for a server whose
// data is about to be replaced, where a clean shutdown's checkpoint writes
// what is thrown away next. Committed data stays safe either way: the
// next start recovers from the WAL.
type Killer interface {
	Kill(ctx context.Context, spec Spec) error
}

// Kill stops spec's server at once where b can, else cleanly
// (Sleep with SleepStop).
func Kill(ctx context.Context, b Backend, spec Spec) error {
	if k, ok := b.(Killer); ok {
		return k.Kill(ctx, spec)
	}
	return b.Sleep(ctx, spec, SleepStop)
}

// Initializer is implemented by backends that can tell, before a start,
// whether it will initialise the server's data (run initdb): a first
// start takes seconds to minutes where a wake takes a fraction of a
// second, and is given a longer deadline.
type Initializer interface {
	WillInitialize(ctx context.Context, spec Spec) bool
}

// WillInitialize reports whether b says the next start of spec's server
// runs initdb; false for a backend that cannot tell.
func WillInitialize(ctx context.Context, b Backend, spec Spec) bool {
	if in, ok := b.(Initializer); ok {
		return in.WillInitialize(ctx, spec)
	}
	return false
}

// Checker is implemented by backends that can tell whether they can serve
// right now (the engine answers, the binaries exist), without touching any
// project.
type Checker interface {
	Check(ctx context.Context) error
}

// Record is a project as a runtime that keeps projects itself holds it:
// its spec (credentials included) and the settings pgwake runs it with.
type Record struct {
	Spec       Spec
	SleepAfter time.Duration
	SleepMode  SleepMode
	Pinned     bool
	// Ephemeral is set for a project this pgwake instance created as
	// ephemeral: its `down` removes it.
	Ephemeral bool
	CreatedAt time.Time
	// Saved is set once the settings were saved (Save): a project seen
	// before that is still being created.
	Saved bool
	// Parent is the project a branch was copied from, at BranchedAt.
	Parent     string
	BranchedAt time.Time
	// Adopted names the object a project was adopted from
	// ("statefulset/db"): the runtime's owner made it and pgwake only
	// sleeps and wakes it. Removing the project forgets it and never
	// deletes it or its data.
	Adopted string
}

// Catalog is implemented by backends whose runtime is the project store
// (a Kubernetes namespace): every pgwake pointed at it sees the same
// projects, passwords and settings, and adopts what it finds.
type Catalog interface {
	// Projects lists every project the runtime holds.
	Projects(ctx context.Context) ([]Record, error)
	// Save stores a project's settings with its server (after Ensure).
	Save(ctx context.Context, rec Record) error
	// Kept returns the credentials of data that Remove without volumes
	// kept for a project of this name, if any.
	Kept(ctx context.Context, project string) (Spec, bool, error)
}

// Snapshot is a kept copy of a project's data, taken at one consistent
// point (see Brancher).
type Snapshot struct {
	Label string
	Taken time.Time
	Bytes int64 // its size on disk; 0 when the runtime cannot tell
}

// ErrNotStopped is returned by a file copy of a server's data when the
// server is not stopped (running or paused): its files are not a
// consistent copy then. Callers copy from the running server instead.
var ErrNotStopped = errors.New("server is not stopped")

// ErrDataExists is returned by Branch when the new project already has
// data (a leftover): it is never overwritten, nor removed by the failed
// branch.
var ErrDataExists = errors.New("data exists already")

// Brancher is implemented by backends that can copy a project's data:
// into a new project (a branch) or a snapshot, and back from a snapshot.
//
// Every copy is of one consistent point. With live, the source's server
// runs (the caller keeps it running and it serves its clients meanwhile)
// and the copy is a base backup streamed from it (pg_basebackup), whose
// point is the backup's end. Without live, the caller keeps the source's
// server stopped and its files are copied, copy-on-write where the
// filesystem can; a server found running or paused is ErrNotStopped.
//
// A copy interrupted at any point (a failed call, a crash) never leaves
// data a server would start from as if it were whole: until it completes,
// the target has no PG_VERSION and a start fails.
type Brancher interface {
	// Branch makes dst's data (which must not exist yet) a copy of src's.
	// dst's server is created by Ensure afterwards, on that data. Where
	// the runtime lets it, the copy's superuser (dst.User) gets
	// dst.Password in the copy itself, and passwordSet says so; else the
	// copy knows src's password only, and the caller changes it.
	Branch(ctx context.Context, src, dst Spec, live bool) (passwordSet bool, err error)
	// Snapshot keeps a copy of spec's data under label, which must be
	// new for the project.
	Snapshot(ctx context.Context, spec Spec, label string, live bool) (Snapshot, error)
	// Snapshots lists spec's snapshots, oldest first; with sizes their
	// Bytes too, which a runtime may take a while to measure.
	Snapshots(ctx context.Context, spec Spec, sizes bool) ([]Snapshot, error)
	// Restore replaces spec's data with the snapshot's. The caller keeps
	// the server stopped; the snapshot stays.
	Restore(ctx context.Context, spec Spec, label string) error
	// DeleteSnapshot removes one snapshot. Remove with volumes removes
	// them all.
	DeleteSnapshot(ctx context.Context, spec Spec, label string) error
}

// Describer is implemented by backends that can say in one line where
// they work and how they reach servers ("namespace dev on https://...;
// dials port-forward through the API server"), for logs and the API.
type Describer interface {
	Describe() string
}

// Phaser is implemented by backends whose servers pass through phases
// worth showing while a project wakes (a Pod's "Pending:
// ContainerCreating").
type Phaser interface {
	Phase(ctx context.Context, spec Spec) string
}

// Use is how one pgwake process uses a project's server right now.
type Use struct {
	Conns      int       // client connections it holds, parked or relaying
	Waking     bool      // it is waking the server
	LastActive time.Time // when one of its clients last came or went
}

// PeerUse is how the other live pgwake processes that share a runtime use
// one project: their connections summed, Waking if any of them wakes it,
// LastActive the latest of theirs, and the processes that hold
// connections or wake it, for messages.
type PeerUse struct {
	Use
	Peers []string
}

// ErrPeerInDoubt is returned by PeerUse when a peer's record cannot be
// trusted either way (it expired only just: the peer may be alive and
// serving clients it could not publish). Callers keep the server awake.
var ErrPeerInDoubt = errors.New("a peer's use of the project is in doubt")

// Shared is implemented by backends whose servers other pgwake processes
// may serve at the same time (several replicas in front of one Kubernetes
// namespace). Each process publishes its use of every project, and puts a
// server to sleep only when no live peer uses it.
type Shared interface {
	// Use records this process's use of a project. It does not block: the
	// backend publishes it soon, and at once when the project goes from
	// unused to used or a wake begins.
	Use(project string, u Use)
	// PeerUse reads the other live processes' use of project from the
	// runtime now. An error means it cannot tell (a failed read,
	// ErrPeerInDoubt); the caller then keeps the server awake.
	PeerUse(ctx context.Context, project string) (PeerUse, error)
}
