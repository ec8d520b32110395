// Package admin is pgwake's local admin API: versioned JSON over HTTP on a
// unix socket (mode 0600), used by the CLI to talk to a running daemon.
package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// APIPrefix versions every route.
const APIPrefix = "/v1"

// Info describes the running daemon.
type Info struct {
	Version string `json:"version"`
	PID     int    `json:"pid"`
	Listen  string `json:"listen"`
	// Backend is where new projects are created; each project shows its
	// own in Project.Backend.
	Backend  string        `json:"backend"`
	Backends []BackendInfo `json:"backends"`
	StateDir string        `json:"state_dir"`
	// Starting is set until start-up has finished (the projects
	// pgwake.yaml declares are created); `up --wait` waits for it.
	Starting bool `json:"starting,omitempty"`
	// Config is the daemon's effective configuration, key by key (secrets
	// as digests), so `up -d` can tell a running pgwake with the same
	// configuration (nothing to do) from one with another.
	Config map[string]string `json:"config,omitempty"`
}

// BackendInfo is one backend the daemon uses.
type BackendInfo struct {
	Name string `json:"name"`
	// Error is set while the backend cannot be reached: its projects'
	// clients get this error until it can.
	Error    string `json:"error,omitempty"`
	Projects int    `json:"projects"`
	// Detail says where the backend works and how pgwake reaches its
	// servers (Kubernetes: namespace, API server, Pod IP or port-forward).
	Detail string `json:"detail,omitempty"`
}

// Project is one project as the API shows it. Durations are milliseconds.
type Project struct {
	Name         string `json:"name"`
	State        string `json:"state"`
	Active       int    `json:"active"` // open connections, queued ones included
	Queued       int    `json:"queued"` // parked, waiting for a wake
	Pinned       bool   `json:"pinned"`
	Image        string `json:"image"`
	SleepAfterMS int64  `json:"sleep_after_ms"`
	SleepMode    string `json:"sleep_mode"`
	// StopAfterMS is, for sleep mode tiered, how long the server stays
	// paused before it is stopped.
	StopAfterMS  int64   `json:"stop_after_ms,omitempty"`
	Wakes        int     `json:"wakes"`
	WakeFailures int     `json:"wake_failures"`
	LastWakeMS   float64 `json:"last_wake_ms"`
	P50WakeMS    float64 `json:"p50_wake_ms"`
	P95WakeMS    float64 `json:"p95_wake_ms"`
	MaxWakeMS    float64 `json:"max_wake_ms"`
	LastError    string  `json:"last_error,omitempty"`
	// LastWakePhases is where the last wake's time went; nil before the
	// first wake.
	LastWakePhases *WakePhases `json:"last_wake_phases,omitempty"`
	// Phase is what the server passes through while the project wakes,
	// where the backend has phases (a Kubernetes Pod's "Pending:
	// ContainerCreating").
	Phase string `json:"phase,omitempty"`
	// PeersBusy says why other pgwake processes serving the same server
	// (replicas in front of one Kubernetes namespace) keep it awake: their
	// connections, a wake of theirs, or doubt.
	PeersBusy    string    `json:"peers_busy,omitempty"`
	LastErrorAt  time.Time `json:"last_error_at,omitzero"`
	RetryAt      time.Time `json:"retry_at,omitzero"`
	IdleMS       int64     `json:"idle_ms"`
	LastActiveAt time.Time `json:"last_active_at"` // last connect, disconnect or wake
	SleepsInMS   int64     `json:"sleeps_in_ms"`
	// Asleep is what a sleeping project's server is in: "pause" or "stop"
	// (empty while awake, or when pgwake cannot tell). NextSleepMS is the
	// time until its next idle step: the sleep while it runs idle (as
	// SleepsInMS), the stop while a tiered project is paused; zero when
	// none is counting down.
	Asleep      string `json:"asleep,omitempty"`
	NextSleepMS int64  `json:"next_sleep_ms"`
	// URL is the project's own port when it has one open (every database
	// reachable, the name passed through), else the shared port with the
	// user name USER.PROJECT. SharedURL is always the shared port's.
	URL       string `json:"url"`
	SharedURL string `json:"shared_url"`
	// Port is the project's own port; PortError says why it is not open
	// (taken by another program), in which case URL is the shared one.
	Port      int       `json:"port,omitempty"`
	PortError string    `json:"port_error,omitempty"`
	User      string    `json:"user"`
	Database  string    `json:"database"`
	CreatedAt time.Time `json:"created_at"`
	Ephemeral bool      `json:"ephemeral"`
	Backend   string    `json:"backend"`
	// Adopted names the object pgwake adopted the project from
	// ("statefulset/db"); empty for a project pgwake created.
	Adopted string `json:"adopted,omitempty"`
	// Auth is who authenticates the project's user: "scram" (pgwake, before
	// any wake, with the password it holds) or "pass-through" (the server:
	// pgwake does not hold the password). Other roles always pass through.
	// AuthFailures counts failed logins (at pgwake, or the server's 28P01
	// when passed through), AuthThrottled attempts the failed-login limit
	// delayed or refused.
	Auth          string `json:"auth"`
	AuthFailures  int    `json:"auth_failures"`
	AuthThrottled int    `json:"auth_throttled"`
	// Parent is the project this one was branched from, BranchedAt when.
	Parent        string    `json:"parent,omitempty"`
	BranchedAt    time.Time `json:"branched_at,omitzero"`
	RecentWakesMS []float64 `json:"recent_wakes_ms"` // oldest first
	// FirstStartMS is the project's first start (initdb), which is not a
	// wake and stays out of the wake figures; zero if pgwake did not see it.
	FirstStartMS float64 `json:"first_start_ms,omitempty"`
	Events       []Event `json:"events"` // recent history, oldest first
	// Settings are the server settings applied at every start.
	Settings map[string]string `json:"settings,omitempty"`
	// Init names the init scripts that run once, at the first start.
	Init []string `json:"init,omitempty"`
	// InitError is set when they failed: the project is not served
	// (State is "error") until it is removed with its data.
	InitError string `json:"init_error,omitempty"`
}

// WakePhases is one wake's time, phase by phase, in milliseconds: the
// runtime's start or unpause call; the server process's start until it
// accepted a TCP connection; Postgres's start-up until it answered (with
// Retries, the probes it refused meanwhile with 57P03); the check that
// the server which answered is the one started.
type WakePhases struct {
	EngineMS  float64 `json:"engine_ms"`
	AcceptMS  float64 `json:"accept_ms"`
	ReadyMS   float64 `json:"ready_ms"`
	ConfirmMS float64 `json:"confirm_ms"`
	Retries   int     `json:"retries"`
}

// Event is one entry of a project's recent history.
type Event struct {
	At  time.Time `json:"at"`
	Msg string    `json:"msg"`
}

// StreamEvent is one message of the /v1/events stream: a project's new
// snapshot, or its removal.
type StreamEvent struct {
	Type    string  `json:"type"` // "project" or "removed"
	Project Project `json:"project"`
}

// CreateRequest creates a project. Empty fields take the daemon's defaults.
type CreateRequest struct {
	Name       string `json:"name"`
	Image      string `json:"image,omitempty"`
	SleepAfter string `json:"sleep_after,omitempty"` // a Go duration, "0" never sleeps
	SleepMode  string `json:"sleep_mode,omitempty"`
	// StopAfter is, for sleep mode tiered, how long the server stays
	// paused before it is stopped: a positive Go duration.
	StopAfter string `json:"stop_after,omitempty"`
	Ephemeral *bool  `json:"ephemeral,omitempty"` // nil: the daemon's default
	Port      int    `json:"port,omitempty"`      // its own listen port; 0 picks one from port_range
	NoPort    bool   `json:"no_port,omitempty"`   // no port of its own: the shared port only
	// PortOutsideRange allows a Port below 1024 or outside the daemon's
	// port_range.
	PortOutsideRange bool `json:"port_outside_range,omitempty"`
	// From makes the project a branch of the project it names: its data
	// is a copy of that project's, taken now (its image, user and
	// database come with it; its password and port are its own).
	From string `json:"from,omitempty"`
	// Init are init scripts, in the order they run once at the first
	// start; Settings are server settings (name -> value) for every start.
	Init     []InitFile        `json:"init,omitempty"`
	Settings map[string]string `json:"settings,omitempty"`
}

// Snapshot is a kept copy of a project's data.
type Snapshot struct {
	Label   string    `json:"label"`
	TakenAt time.Time `json:"taken_at"`
	Bytes   int64     `json:"bytes"` // 0 when the runtime cannot tell
}

// SnapshotRequest takes a snapshot; an empty label is the time, UTC
// (20261202-153000).
type SnapshotRequest struct {
	Label string `json:"label,omitempty"`
}

// ResetRequest puts a project's data back to a snapshot: Label, or the
// latest when empty. With Force, open sessions are ended (FATAL 57P01);
// without, a project with open connections is refused.
type ResetRequest struct {
	Label string `json:"label,omitempty"`
	Force bool   `json:"force,omitempty"`
}

// PasswordRequest changes a project's password to Password, or to a fresh
// random one when it is empty.
type PasswordRequest struct {
	Password string `json:"password,omitempty"`
}

// InitFile is one init script as a create request carries it: its name
// (which says its kind: .sql, .sql.gz or .sh) and its content, so that a
// pgwake on another machine (admin_listen) gets it too.
type InitFile struct {
	Name       string `json:"name"`
	Executable bool   `json:"executable,omitempty"` // a .sh run, not sourced
	Data       []byte `json:"data"`
}

// MaxInitBytes bounds the init scripts of one create request; seed a large
// database from a .sh script that fetches its dump instead.
const MaxInitBytes = 48 << 20

// ReadInitFiles reads init scripts for a create request, in order.
func ReadInitFiles(paths []string) ([]InitFile, error) {
	var out []InitFile
	total := 0
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("init script: %w", err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("init script: %w", err)
		}
		if total += len(data); total > MaxInitBytes {
			return nil, fmt.Errorf("init scripts: more than %d MiB in all (at %s); fetch a large dump from a .sh script instead", MaxInitBytes>>20, p)
		}
		out = append(out, InitFile{Name: filepath.Base(p), Executable: fi.Mode()&0o100 != 0, Data: data})
	}
	return out, nil
}

// Errors a Service returns for the API to map to HTTP statuses.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("conflict")
	ErrInvalid  = errors.New("invalid request")
)

// kindError tags err with one of the kinds above without changing its
// message (errors.Join would add the kind's text on a line of its own).
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// Invalid, NotFound and Conflict tag an error for the HTTP status it maps to.
func Invalid(err error) error  { return &kindError{ErrInvalid, err} }
func NotFound(err error) error { return &kindError{ErrNotFound, err} }
func Conflict(err error) error { return &kindError{ErrConflict, err} }

// Service is what the daemon provides to the API.
type Service interface {
	Info() Info
	Projects() []Project
	Project(name string) (Project, error)
	Create(ctx context.Context, req CreateRequest) (Project, error)
	Remove(ctx context.Context, name string, volumes bool) error
	Wake(ctx context.Context, name string) error
	Sleep(ctx context.Context, name string) error
	Pin(name string, pinned bool) error
	Logs(ctx context.Context, name string, follow bool, tail int) (io.ReadCloser, error)
	// Snapshot keeps a consistent copy of a project's data; Snapshots
	// lists them, oldest first; DeleteSnapshot removes one; Reset puts
	// the project's data back to one.
	Snapshot(ctx context.Context, name string, req SnapshotRequest) (Snapshot, error)
	Snapshots(ctx context.Context, name string) ([]Snapshot, error)
	DeleteSnapshot(ctx context.Context, name, label string) error
	Reset(ctx context.Context, name string, req ResetRequest) (Snapshot, error)
	// SetPassword changes a project's password on its server and in
	// pgwake, and returns the project with its new URL.
	SetPassword(ctx context.Context, name string, req PasswordRequest) (Project, error)
	// Subscribe streams project changes until ctx ends: first the current
	// snapshot of every project, then each change. The channel closes when
	// ctx ends.
	Subscribe(ctx context.Context) <-chan StreamEvent
	// Ready reports whether the daemon can serve: listening and its
	// backend reachable. It never wakes a project.
	Ready(ctx context.Context) error
	// Shutdown asks the daemon to stop; it returns at once. With volumes
	// every project is removed with its data; otherwise only ephemeral ones.
	Shutdown(volumes bool)
}
