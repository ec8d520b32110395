// Package config resolves pgwake's one effective configuration from, in
// order of precedence, command-line flags, PGWAKE_* environment variables,
// a pgwake.yaml file and built-in defaults. Every key has exactly one
// environment variable (PGWAKE_ + upper-cased key) and one flag (the key
// with dashes); unknown keys and variables are errors, so configuration
// cannot silently drift.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/adrg/xdg"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/proxy"
	"github.com/pgwake/pgwake/internal/state"
)

// EnvPrefix starts every environment variable pgwake reads.
const EnvPrefix = "PGWAKE_"

// EnvConfigFile names the config file; it is the one PGWAKE_ variable that
// is not a key.
const EnvConfigFile = EnvPrefix + "CONFIG"

// DefaultFile is looked for in the working directory.
const DefaultFile = "pgwake.yaml"

// Config is pgwake's effective configuration. The yaml tag is the key; the
// usage tag documents it for flags and the README.
type Config struct {
	Listen                string        `yaml:"listen" usage:"address the Postgres proxy listens on"`
	StateDir              string        `yaml:"state_dir" usage:"directory for projects, passwords, the admin socket and logs"`
	AdminSocket           string        `yaml:"admin_socket" usage:"admin API unix socket (default <state_dir>/pgwake.sock)"`
	AdminListen           string        `yaml:"admin_listen" usage:"also serve the admin API and /metrics on this TCP address (empty: socket only)"`
	AdminToken            string        `yaml:"admin_token" secret:"true" usage:"bearer token the TCP admin API requires; mandatory beyond loopback"`
	Backend               string        `yaml:"backend" usage:"where project servers run: auto, docker, local or kubernetes (auto never picks kubernetes)"`
	DockerHost            string        `yaml:"docker_host" usage:"Docker engine address (default DOCKER_HOST or the platform socket)"`
	PGBin                 string        `yaml:"pg_bin" usage:"local backend: directory with postgres, initdb and pg_ctl (default: found on PATH, pg_config, /usr/lib/postgresql/N/bin)"`
	Image                 string        `yaml:"image" usage:"default Postgres image for new projects"`
	SleepAfter            time.Duration `yaml:"sleep_after" usage:"default idle time before a project sleeps (0 = never)"`
	SleepMode             string        `yaml:"sleep_mode" usage:"default sleep mode for new projects: stop, pause, or tiered (pause after sleep_after, stop after stop_after more)"`
	StopAfter             time.Duration `yaml:"stop_after" usage:"sleep mode tiered: default time a project stays paused before it is stopped"`
	GracePeriod           time.Duration `yaml:"grace_period" usage:"minimum time a project stays awake after a wake"`
	WakeTimeout           time.Duration `yaml:"wake_timeout" usage:"how long a client waits for a project to wake"`
	FirstStartTimeout     time.Duration `yaml:"first_start_timeout" usage:"how long a new project's first start (initdb) may take; at least wake_timeout"`
	StartupTimeout        time.Duration `yaml:"startup_timeout" usage:"how long a client may take to send its startup packet"`
	ShutdownTimeout       time.Duration `yaml:"shutdown_timeout" usage:"how long open connections may drain on down"`
	MaxConnections        int           `yaml:"max_connections" usage:"connection cap across all projects"`
	MaxProjectConnections int           `yaml:"max_project_connections" usage:"connection cap per project"`
	MaxStartupConnections int           `yaml:"max_startup_connections" usage:"connections still sending their startup packet; past it the oldest is closed"`
	PortRange             string        `yaml:"port_range" usage:"ports create --port may use without --port-outside-range: LOW-HIGH, LOW at least 1024"`
	LogLevel              string        `yaml:"log_level" usage:"debug, info, warn or error"`
	LogFormat             string        `yaml:"log_format" usage:"text or json"`
	Ephemeral             bool          `yaml:"ephemeral" usage:"new projects are ephemeral: removed with their data on down"`
	TLS                   TLSConfig     `yaml:"tls"`
	Kubernetes            KubeConfig    `yaml:"kubernetes"`

	// Projects declares projects that `pgwake up` creates when missing. It
	// is a list, so it lives in pgwake.yaml only (no variable or flag).
	Projects []ProjectConfig `yaml:"projects" key:"-"`

	// sources says where Load found each key that is not at its default:
	// "--flag", "PGWAKE_KEY" or "FILE line N"; "projects" too.
	sources map[string]string `key:"-"`
}

// Source is where key's value came from ("--listen", "PGWAKE_LISTEN",
// "pgwake.yaml line 3"), or "" for a built-in default.
func (c *Config) Source(key string) string { return c.sources[key] }

// TLSConfig is the tls section: client-side TLS of the proxy.
type TLSConfig struct {
	Mode string `yaml:"mode" flag:"tls" usage:"client TLS: on, off, or auto (on when listening beyond loopback)"`
	Cert string `yaml:"cert" usage:"server certificate (PEM); default: a generated local CA's certificate in <state_dir>/tls"`
	Key  string `yaml:"key" usage:"server private key (PEM) for tls.cert"`
	// Upstream TLS: to project servers reached over a network.
	Upstream   string `yaml:"upstream" usage:"TLS to project servers: off (default; loopback containers) or require"`
	UpstreamCA string `yaml:"upstream_ca" usage:"with tls.upstream require: verify servers against this CA (PEM) instead of accepting any certificate"`
}

// KubeConfig is the kubernetes section: where the kubernetes backend keeps
// projects. The connection follows kubectl's loading rules (KUBECONFIG,
// ~/.kube/config, in-cluster config inside a pod); these keys override.
type KubeConfig struct {
	Kubeconfig   string `yaml:"kubeconfig" flag:"kubeconfig" usage:"kubernetes backend: kubeconfig file (default KUBECONFIG, ~/.kube/config, or in-cluster config)"`
	Context      string `yaml:"context" flag:"context" usage:"kubernetes backend: kubeconfig context (default its current context)"`
	Namespace    string `yaml:"namespace" flag:"namespace" usage:"kubernetes backend: namespace of the projects (default the context's, else default)"`
	StorageClass string `yaml:"storage_class" flag:"storage-class" usage:"kubernetes backend: StorageClass of new projects' volumes (default the cluster's default class)"`
	StorageSize  string `yaml:"storage_size" flag:"storage-size" usage:"kubernetes backend: size of new projects' volumes"`
	Dial         string `yaml:"dial" usage:"kubernetes backend: how pgwake reaches servers: auto (Pod IP inside the cluster, else port-forward), pod-ip or port-forward"`
	Peer         string `yaml:"peer" usage:"kubernetes backend: this pgwake's name among those serving the namespace (default the Pod's name inside the cluster, else hostname-instance)"`
	PeerAddress  string `yaml:"peer_address" usage:"kubernetes backend: where this pgwake's peers send it cancel requests (default POD_IP with the proxy's port in a pod, else the proxy's address)"`
	// LeaseDuration: how long this pgwake's published use of the projects
	// counts for its peers after each renewal.
	LeaseDuration time.Duration `yaml:"lease_duration" usage:"kubernetes backend: how long this pgwake's published connection counts stay valid for its peers (renewed every third of it)"`
	// Adopt: StatefulSets, Deployments and CloudNativePG Clusters
	// annotated pgwake.dev/project become projects.
	Adopt bool `yaml:"adopt" usage:"kubernetes backend: serve StatefulSets, Deployments and CloudNativePG Clusters annotated pgwake.dev/project (sleep and wake them; never delete them)"`
}

// TLSOn resolves tls.mode: auto turns TLS on whenever the proxy listens
// beyond loopback.
func (c *Config) TLSOn() bool {
	switch c.TLS.Mode {
	case "on":
		return true
	case "off":
		return false
	}
	host, _, _ := net.SplitHostPort(c.Listen)
	ip := net.ParseIP(host)
	return !(host == "localhost" || (ip != nil && ip.IsLoopback()))
}

// ProjectConfig declares one project in pgwake.yaml. Empty fields take the
// top-level defaults.
type ProjectConfig struct {
	Name       string         `yaml:"name"`
	Image      string         `yaml:"image"`
	SleepAfter *time.Duration `yaml:"sleep_after"` // nil: the default; 0: never
	SleepMode  string         `yaml:"sleep_mode"`
	StopAfter  *time.Duration `yaml:"stop_after"` // nil: the default
	Ephemeral  bool           `yaml:"ephemeral"`
	// Init are the project's init scripts: `init` names files or folders
	// (one, or a list), relative to the config file; here each folder is
	// expanded to its scripts in lexical order (see ExpandInit), absolute.
	Init []string `yaml:"init"`
	// Settings are server settings (GUC name -> value) for every start.
	Settings map[string]string `yaml:"settings"`
}

// Default returns the built-in defaults.
func Default() Config {
	return Config{
		Listen:                "127.0.0.1:6432",
		Backend:               "auto",
		TLS:                   TLSConfig{Mode: "auto", Upstream: "off"},
		Kubernetes:            KubeConfig{StorageSize: "1Gi", Dial: "auto", LeaseDuration: 15 * time.Second, Adopt: true},
		StateDir:              filepath.Join(xdg.StateHome, "pgwake"),
		Image:                 "postgres:17",
		SleepAfter:            10 * time.Minute,
		SleepMode:             string(backend.SleepStop),
		StopAfter:             30 * time.Minute,
		GracePeriod:           30 * time.Second,
		WakeTimeout:           60 * time.Second,
		FirstStartTimeout:     5 * time.Minute,
		StartupTimeout:        10 * time.Second,
		ShutdownTimeout:       10 * time.Second,
		MaxConnections:        1000,
		MaxProjectConnections: 100,
		MaxStartupConnections: proxy.DefaultMaxStartupConns,
		PortRange:             "6500-6999",
		LogLevel:              "info",
		LogFormat:             "text",
	}
}

// Key describes one configuration key.
type Key struct {
	Name   string // yaml key
	Env    string // environment variable
	Flag   string // flag name
	Usage  string
	Secret bool // never logged
	path   []int
}

// Keys lists every key in declaration order. A nested section (tls) gives
// dotted keys ("tls.mode"), variables with underscores (PGWAKE_TLS_MODE)
// and dashed flags (--tls-mode), unless a flag tag names the flag.
func Keys() []Key {
	return keysOf(reflect.TypeFor[Config](), "", nil)
}

func keysOf(t reflect.Type, prefix string, path []int) []Key {
	var keys []Key
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Tag.Get("key") == "-" {
			continue
		}
		name := prefix + f.Tag.Get("yaml")
		p := append(append([]int(nil), path...), i)
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]() {
			keys = append(keys, keysOf(f.Type, name+".", p)...)
			continue
		}
		flag := f.Tag.Get("flag")
		if flag == "" {
			flag = strings.NewReplacer("_", "-", ".", "-").Replace(name)
		}
		keys = append(keys, Key{
			Name:   name,
			Env:    EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, ".", "_")),
			Flag:   flag,
			Usage:  f.Tag.Get("usage"),
			Secret: f.Tag.Get("secret") == "true",
			path:   p,
		})
	}
	return keys
}

func keyByName(name string) (Key, bool) {
	for _, k := range Keys() {
		if k.Name == name {
			return k, true
		}
	}
	return Key{}, false
}

// Set parses value into the key's field.
func (c *Config) Set(key, value string) error {
	k, ok := keyByName(key)
	if !ok {
		return fmt.Errorf("unknown config key %q", key)
	}
	f := reflect.ValueOf(c).Elem().FieldByIndex(k.path)
	switch f.Interface().(type) {
	case string:
		f.SetString(value)
	case int:
		n, err := strconv.Atoi(value)
		if err != nil {
			return fmt.Errorf("%s: %q is not a whole number", key, value)
		}
		f.SetInt(int64(n))
	case bool:
		b, err := strconv.ParseBool(value)
		if err != nil {
			return fmt.Errorf("%s: %q is not true or false", key, value)
		}
		f.SetBool(b)
	case time.Duration:
		d, err := time.ParseDuration(value)
		if err != nil {
			return fmt.Errorf("%s: %q is not a duration (like 90s or 10m)", key, value)
		}
		f.SetInt(int64(d))
	default:
		return fmt.Errorf("%s: unsupported type %s", key, f.Type())
	}
	return nil
}

// Get formats a key's value.
func (c *Config) Get(key string) string {
	k, _ := keyByName(key)
	return fmt.Sprint(reflect.ValueOf(c).Elem().FieldByIndex(k.path).Interface())
}

// flagAnnotation marks the flags BindFlags made.
const flagAnnotation = "pgwake-config-key"

// BindFlags registers one flag per key on fs. Only flags the user sets
// override the other sources; defaults shown in help are the built-in ones.
func BindFlags(fs *pflag.FlagSet, only ...string) {
	def := Default()
	for _, k := range Keys() {
		if len(only) > 0 && !contains(only, k.Name) {
			continue
		}
		if fs.Lookup(k.Flag) != nil {
			continue
		}
		usage := k.Usage + " (env " + k.Env + ")"
		if v, ok := reflect.ValueOf(def).FieldByIndex(k.path).Interface().(bool); ok {
			fs.Bool(k.Flag, v, usage)
		} else {
			fs.String(k.Flag, def.Get(k.Name), usage)
		}
		_ = fs.SetAnnotation(k.Flag, flagAnnotation, []string{k.Name})
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// FileError is a config file that exists but is broken: bad YAML, an
// unknown key, a value that does not parse, or values that make no sense
// (the error names each with its line).
type FileError struct {
	Path string
	Err  error
}

func (e *FileError) Error() string { return "config file " + e.Path + ": " + e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }

// Sources are the inputs to Load.
type Sources struct {
	File    string         // explicit config file; "" looks for ./pgwake.yaml
	Environ []string       // os.Environ()
	Flags   *pflag.FlagSet // may be nil
	// NoFile ignores every config file: the environment, flags and
	// defaults only.
	NoFile bool
}

// Load resolves the effective configuration: flags > env > file > defaults.
func Load(src Sources) (Config, error) {
	cfg := Default()
	cfg.sources = map[string]string{}
	env := map[string]string{}
	for _, kv := range src.Environ {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, EnvPrefix) {
			env[k] = v
		}
	}

	file := src.File
	if file == "" {
		file = env[EnvConfigFile]
	}
	explicit := file != ""
	if !explicit {
		file = DefaultFile
	}
	data, err := os.ReadFile(file)
	switch {
	case src.NoFile:
	case err == nil:
		if err := decodeYAML(data, &cfg, file); err != nil {
			return Config{}, &FileError{Path: file, Err: err}
		}
	case explicit || !errors.Is(err, os.ErrNotExist):
		return Config{}, fmt.Errorf("config file: %w", err)
	}

	byEnv := map[string]Key{}
	for _, k := range Keys() {
		byEnv[k.Env] = k
	}
	names := make([]string, 0, len(env))
	for name := range env {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if name == EnvConfigFile {
			continue
		}
		k, ok := byEnv[name]
		if !ok {
			return Config{}, fmt.Errorf("unknown environment variable %s (known: %s)", name, knownEnv())
		}
		if err := cfg.Set(k.Name, env[name]); err != nil {
			return Config{}, fmt.Errorf("%s: %w", name, err)
		}
		cfg.sources[k.Name] = name
	}

	if src.Flags != nil {
		for _, k := range Keys() {
			f := src.Flags.Lookup(k.Flag)
			// Only flags BindFlags made are config: a subcommand's own flag
			// of the same name (create --image) means something else.
			if f == nil || !f.Changed || f.Annotations[flagAnnotation] == nil {
				continue
			}
			if err := cfg.Set(k.Name, f.Value.String()); err != nil {
				return Config{}, fmt.Errorf("--%s: %w", k.Flag, err)
			}
			cfg.sources[k.Name] = "--" + k.Flag
		}
	}
	if err := cfg.Validate(); err != nil {
		named := cfg.named(err)
		if cfg.fromFileOnly(err, file) {
			// Only the file's values are wrong: a FileError, so that
			// commands that do not use them can do without the file.
			return Config{}, &FileError{Path: file, Err: named}
		}
		return Config{}, named
	}
	return cfg, nil
}

// fieldError is a Validate error about some keys, so that Load can say
// where their values came from.
type fieldError struct {
	keys []string
	err  error
}

func (e *fieldError) Error() string { return e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

func field(err error, keys ...string) error { return &fieldError{keys: keys, err: err} }

// fromFileOnly reports whether every one of Validate's errors is about
// keys that file set.
func (c *Config) fromFileOnly(err error, file string) bool {
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	for _, e := range list {
		var fe *fieldError
		if !errors.As(e, &fe) {
			return false
		}
		for _, k := range fe.keys {
			if src := c.sources[k]; src != "" && !strings.HasPrefix(src, file+" line ") {
				return false
			}
		}
	}
	return true
}

// named adds to each of Validate's errors where its keys were set.
func (c *Config) named(err error) error {
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	out := make([]error, 0, len(list))
	for _, e := range list {
		var fe *fieldError
		if errors.As(e, &fe) {
			var from []string
			for _, k := range fe.keys {
				if src := c.sources[k]; src != "" {
					from = append(from, src)
				}
			}
			if len(from) > 0 {
				e = fmt.Errorf("%s: %w", strings.Join(from, ", "), e)
			}
		}
		out = append(out, e)
	}
	return errors.Join(out...)
}

func knownEnv() string {
	var names []string
	for _, k := range Keys() {
		names = append(names, k.Env)
	}
	return strings.Join(append(names, EnvConfigFile), ", ")
}

// decodeYAML decodes strictly: an unknown key is an error. Scalars go
// through Config.Set, so a value means the same in pgwake.yaml as in its
// variable or flag ("0" is a duration everywhere).
func decodeYAML(data []byte, cfg *Config, file string) error {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return err
	}
	if len(root.Content) == 0 {
		return nil // an empty file
	}
	doc := root.Content[0]
	if doc.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: expected key: value pairs", doc.Line)
	}
	return decodeMapping(doc, "", cfg, file)
}

func decodeMapping(n *yaml.Node, prefix string, cfg *Config, file string) error {
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := prefix + k.Value
		switch {
		case name == "projects":
			ps, err := decodeProjects(v, file)
			if err != nil {
				return err
			}
			cfg.Projects = ps
			cfg.setSource(name, file, k.Line)
		case v.Kind == yaml.MappingNode && isSection(name):
			if err := decodeMapping(v, name+".", cfg, file); err != nil {
				return err
			}
		case v.Kind == yaml.ScalarNode:
			if err := cfg.Set(name, v.Value); err != nil {
				return fmt.Errorf("line %d: %w", k.Line, err)
			}
			cfg.setSource(name, file, k.Line)
		default:
			return fmt.Errorf("line %d: unknown config key %q", k.Line, name)
		}
	}
	return nil
}

func (c *Config) setSource(key, file string, line int) {
	if c.sources != nil {
		c.sources[key] = fmt.Sprintf("%s line %d", file, line)
	}
}

// isSection reports whether name is a nested section (tls).
func isSection(name string) bool {
	for _, k := range Keys() {
		if strings.HasPrefix(k.Name, name+".") {
			return true
		}
	}
	return false
}

func decodeProjects(n *yaml.Node, file string) ([]ProjectConfig, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("line %d: projects must be a list", n.Line)
	}
	var out []ProjectConfig
	for _, item := range n.Content {
		if item.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("line %d: a project must be a mapping (name: ...)", item.Line)
		}
		var pc ProjectConfig
		for i := 0; i+1 < len(item.Content); i += 2 {
			k, v := item.Content[i], item.Content[i+1]
			switch k.Value {
			case "init":
				init, err := decodeInit(k, v, file)
				if err != nil {
					return nil, err
				}
				pc.Init = init
				continue
			case "settings":
				settings, err := decodeSettings(k, v)
				if err != nil {
					return nil, err
				}
				pc.Settings = settings
				continue
			}
			if v.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: projects: %s must be a single value", k.Line, k.Value)
			}
			switch k.Value {
			case "name":
				pc.Name = v.Value
			case "image":
				pc.Image = v.Value
			case "sleep_mode":
				pc.SleepMode = v.Value
			case "sleep_after":
				d, err := time.ParseDuration(v.Value)
				if err != nil {
					return nil, fmt.Errorf("line %d: projects: sleep_after %q is not a duration (like 90s or 10m)", k.Line, v.Value)
				}
				pc.SleepAfter = &d
			case "stop_after":
				d, err := time.ParseDuration(v.Value)
				if err != nil {
					return nil, fmt.Errorf("line %d: projects: stop_after %q is not a duration (like 30m or 2h)", k.Line, v.Value)
				}
				pc.StopAfter = &d
			case "ephemeral":
				b, err := strconv.ParseBool(v.Value)
				if err != nil {
					return nil, fmt.Errorf("line %d: projects: ephemeral %q is not true or false", k.Line, v.Value)
				}
				pc.Ephemeral = b
			default:
				return nil, fmt.Errorf("line %d: unknown project key %q", k.Line, k.Value)
			}
		}
		out = append(out, pc)
	}
	return out, nil
}

// decodeInit reads a project's `init`: a path or a list of paths, relative
// to the config file's folder, each expanded by ExpandInit.
func decodeInit(k, v *yaml.Node, file string) ([]string, error) {
	var paths []string
	switch v.Kind {
	case yaml.ScalarNode:
		paths = []string{v.Value}
	case yaml.SequenceNode:
		for _, e := range v.Content {
			if e.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: projects: init must be a path or a list of paths", e.Line)
			}
			paths = append(paths, e.Value)
		}
	default:
		return nil, fmt.Errorf("line %d: projects: init must be a path or a list of paths", k.Line)
	}
	base := filepath.Dir(file)
	for i, p := range paths {
		if p == "" {
			return nil, fmt.Errorf("line %d: projects: init: an empty path", k.Line)
		}
		if !filepath.IsAbs(p) {
			paths[i] = filepath.Join(base, p)
		}
	}
	out, err := ExpandInit(paths)
	if err != nil {
		return nil, fmt.Errorf("line %d: projects: %w", k.Line, err)
	}
	return out, nil
}

// decodeSettings reads a project's `settings`: a mapping of setting names
// to scalar values, taken as Postgres reads them (256MB, on, 4).
func decodeSettings(k, v *yaml.Node) (map[string]string, error) {
	if v.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: projects: settings must be a mapping (name: value)", k.Line)
	}
	out := map[string]string{}
	for i := 0; i+1 < len(v.Content); i += 2 {
		sk, sv := v.Content[i], v.Content[i+1]
		if sv.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("line %d: projects: settings: %s must be a single value", sk.Line, sk.Value)
		}
		name, err := SettingName(sk.Value)
		if err != nil {
			return nil, fmt.Errorf("line %d: projects: settings: %w", sk.Line, err)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("line %d: projects: settings: %s is set twice", sk.Line, name)
		}
		out[name] = sv.Value
	}
	return out, nil
}

// SettingName checks a server setting's name and returns it as Postgres
// knows it (names are case-insensitive: lower case).
func SettingName(name string) (string, error) {
	if err := backend.ValidateSetting(name); err != nil {
		return "", err
	}
	return strings.ToLower(name), nil
}

// ExpandInit turns init paths (files or folders, absolute or relative to
// the working directory) into the scripts they name, in order, absolute: a
// folder gives its .sql, .sql.gz and .sh files in lexical order (other
// files and subfolders are ignored, as the official image ignores them);
// a file must be one of those kinds. Each error is one line naming the
// path.
func ExpandInit(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, fmt.Errorf("init %s: %w", p, err)
		}
		fi, err := os.Stat(abs)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("init %s: no such file or folder", p)
			}
			return nil, fmt.Errorf("init %s: %w", p, err)
		}
		if !fi.IsDir() {
			if backend.InitKind(abs) == "" {
				return nil, fmt.Errorf("init %s: not a .sql, .sql.gz or .sh file", p)
			}
			if !fi.Mode().IsRegular() {
				return nil, fmt.Errorf("init %s: not a regular file", p)
			}
			out = append(out, abs)
			continue
		}
		entries, err := os.ReadDir(abs) // sorted by name
		if err != nil {
			return nil, fmt.Errorf("init %s: %w", p, err)
		}
		n := 0
		for _, e := range entries {
			if backend.InitKind(e.Name()) == "" {
				continue
			}
			full := filepath.Join(abs, e.Name())
			if fi, err := os.Stat(full); err != nil || !fi.Mode().IsRegular() {
				continue
			}
			out = append(out, full)
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("init %s: the folder holds no .sql, .sql.gz or .sh file", p)
		}
	}
	return out, nil
}

// Validate checks values that parse but make no sense.
func (c *Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, field(fmt.Errorf("listen: %q is not host:port", c.Listen), "listen"))
	}
	switch c.TLS.Mode {
	case "on", "off", "auto":
	default:
		errs = append(errs, field(fmt.Errorf("tls.mode: %q is not on, off or auto", c.TLS.Mode), "tls.mode"))
	}
	switch c.TLS.Upstream {
	case "off", "require":
	default:
		errs = append(errs, field(fmt.Errorf("tls.upstream: %q is not off or require", c.TLS.Upstream), "tls.upstream"))
	}
	if c.TLS.UpstreamCA != "" && c.TLS.Upstream != "require" {
		errs = append(errs, field(errors.New("tls.upstream_ca goes with tls.upstream: require"), "tls.upstream_ca", "tls.upstream"))
	}
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		errs = append(errs, field(errors.New("tls.cert and tls.key go together: set both or neither"), "tls.cert", "tls.key"))
	}
	if c.AdminListen != "" {
		host, _, err := net.SplitHostPort(c.AdminListen)
		ip := net.ParseIP(host)
		switch {
		case err != nil:
			errs = append(errs, field(fmt.Errorf("admin_listen: %q is not host:port", c.AdminListen), "admin_listen"))
		case c.AdminToken == "" && !(host == "localhost" || (ip != nil && ip.IsLoopback())):
			errs = append(errs, field(fmt.Errorf("admin_listen %s is reachable from other machines: set admin_token", c.AdminListen), "admin_listen"))
		}
	}
	if c.StateDir == "" {
		errs = append(errs, field(errors.New("state_dir must be set"), "state_dir"))
	}
	switch c.Backend {
	case "auto", "docker", "local", "kubernetes":
	default:
		errs = append(errs, field(fmt.Errorf("backend: %q is not auto, docker, local or kubernetes", c.Backend), "backend"))
	}
	switch c.Kubernetes.Dial {
	case "auto", "pod-ip", "port-forward":
	default:
		errs = append(errs, field(fmt.Errorf("kubernetes.dial: %q is not auto, pod-ip or port-forward", c.Kubernetes.Dial), "kubernetes.dial"))
	}
	if d := c.Kubernetes.LeaseDuration; d < 3*time.Second {
		errs = append(errs, field(fmt.Errorf("kubernetes.lease_duration: %s is shorter than 3s (it is renewed every third of it)", d), "kubernetes.lease_duration"))
	}
	if _, err := resource.ParseQuantity(c.Kubernetes.StorageSize); err != nil || c.Kubernetes.StorageSize == "" {
		errs = append(errs, field(fmt.Errorf("kubernetes.storage_size: %q is not a size like 1Gi", c.Kubernetes.StorageSize), "kubernetes.storage_size"))
	}
	if c.Image == "" {
		errs = append(errs, field(errors.New("image must be set"), "image"))
	}
	if _, err := backend.ParseSleepMode(c.SleepMode); err != nil {
		errs = append(errs, field(fmt.Errorf("sleep_mode: %w", err), "sleep_mode"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"sleep_after", c.SleepAfter}, {"grace_period", c.GracePeriod}, {"wake_timeout", c.WakeTimeout},
		{"startup_timeout", c.StartupTimeout}, {"shutdown_timeout", c.ShutdownTimeout},
		{"first_start_timeout", c.FirstStartTimeout},
	} {
		if d.v < 0 {
			errs = append(errs, field(fmt.Errorf("%s must not be negative", d.name), d.name))
		}
	}
	if c.StopAfter <= 0 {
		errs = append(errs, field(fmt.Errorf("stop_after must be positive (it is %s)", c.StopAfter), "stop_after"))
	}
	if c.WakeTimeout == 0 || c.StartupTimeout == 0 {
		errs = append(errs, field(errors.New("wake_timeout and startup_timeout must be positive"), "wake_timeout", "startup_timeout"))
	}
	if c.MaxConnections < 1 || c.MaxProjectConnections < 1 {
		errs = append(errs, field(errors.New("max_connections and max_project_connections must be at least 1"), "max_connections", "max_project_connections"))
	}
	if c.MaxStartupConnections < 1 {
		errs = append(errs, field(errors.New("max_startup_connections must be at least 1"), "max_startup_connections"))
	}
	if _, _, err := c.Ports(); err != nil {
		errs = append(errs, field(err, "port_range"))
	}
	seen := map[string]bool{}
	for i, p := range c.Projects {
		switch {
		case p.Name == "":
			errs = append(errs, field(fmt.Errorf("projects[%d]: name is required", i), "projects"))
		case seen[p.Name]:
			errs = append(errs, field(fmt.Errorf("projects: %q is declared twice", p.Name), "projects"))
		}
		seen[p.Name] = true
		if p.Name != "" {
			if err := state.ValidateName(p.Name); err != nil {
				errs = append(errs, field(fmt.Errorf("projects[%d]: %w", i, err), "projects"))
			}
		}
		if p.SleepMode != "" {
			if _, err := backend.ParseSleepMode(p.SleepMode); err != nil {
				errs = append(errs, field(fmt.Errorf("projects[%d] (%s): sleep_mode: %w", i, p.Name, err), "projects"))
			}
		}
		if p.SleepAfter != nil && *p.SleepAfter < 0 {
			errs = append(errs, field(fmt.Errorf("projects[%d] (%s): sleep_after must not be negative", i, p.Name), "projects"))
		}
		if p.StopAfter != nil && *p.StopAfter <= 0 {
			errs = append(errs, field(fmt.Errorf("projects[%d] (%s): stop_after must be positive", i, p.Name), "projects"))
		}
	}
	if _, err := c.SlogLevel(); err != nil {
		errs = append(errs, field(err, "log_level"))
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, field(fmt.Errorf("log_format: %q is not text or json", c.LogFormat), "log_format"))
	}
	return errors.Join(errs...)
}

// MinPortRange is the lowest port port_range may start at: lower ports are
// the system's (and need privileges).
const MinPortRange = 1024

// Ports parses port_range ("6500-6999").
func (c *Config) Ports() (low, high int, err error) {
	lo, hi, ok := strings.Cut(c.PortRange, "-")
	low, lerr := strconv.Atoi(strings.TrimSpace(lo))
	high, herr := strconv.Atoi(strings.TrimSpace(hi))
	switch {
	case !ok || lerr != nil || herr != nil:
		return 0, 0, fmt.Errorf("port_range: %q is not LOW-HIGH (like 6500-6999)", c.PortRange)
	case low < MinPortRange || high > 65535 || low > high:
		return 0, 0, fmt.Errorf("port_range: %q must be LOW-HIGH with %d <= LOW <= HIGH <= 65535", c.PortRange, MinPortRange)
	}
	return low, high, nil
}

// SlogLevel parses LogLevel.
func (c *Config) SlogLevel() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return 0, fmt.Errorf("log_level: %q is not debug, info, warn or error", c.LogLevel)
	}
	return l, nil
}

// SocketPath is the admin socket's path.
func (c *Config) SocketPath() string {
	if c.AdminSocket != "" {
		return c.AdminSocket
	}
	return filepath.Join(c.StateDir, "pgwake.sock")
}

// Effective is every key's value, for comparing two configurations (`up
// -d` against the running daemon's). A secret is shown as a digest: equal
// secrets compare equal, and the value is not revealed.
func (c *Config) Effective() map[string]string {
	out := map[string]string{}
	for _, k := range Keys() {
		v := c.Get(k.Name)
		if k.Secret && v != "" {
			sum := sha256.Sum256([]byte(v))
			v = "sha256:" + hex.EncodeToString(sum[:8])
		}
		out[k.Name] = v
	}
	return out
}

// LogAttrs renders the effective configuration for the start-up log line.
func (c *Config) LogAttrs() []any {
	var attrs []any
	for _, k := range Keys() {
		v := c.Get(k.Name)
		if k.Secret && v != "" {
			v = "(set)" // logs are shared more widely than config
		}
		attrs = append(attrs, k.Name, v)
	}
	return attrs
}

// LoadWithoutBrokenFile is Load for commands that only talk to a running
// daemon: they need nothing from the config file but where the daemon is
// (state_dir, admin_socket). If the file is broken (a FileError), it loads
// again without it, keeping those two keys from the file when they can
// be read, and returns the file's error as a warning. When the file is
// too broken to tell whether it sets them, the error stands: guessing the
// wrong state dir would act on another pgwake (rm, down --volumes).
func LoadWithoutBrokenFile(src Sources) (cfg Config, warning, err error) {
	cfg, err = Load(src)
	var ferr *FileError
	if !errors.As(err, &ferr) {
		return cfg, nil, err
	}
	data, rerr := os.ReadFile(ferr.Path)
	if rerr != nil {
		return Config{}, nil, err
	}
	where, ok := locationKeys(data)
	if !ok {
		return Config{}, nil, err
	}
	lenient := src
	lenient.NoFile = true
	cfg, lerr := Load(lenient)
	if lerr != nil {
		return Config{}, nil, err
	}
	for key, v := range where {
		if cfg.sources[key] != "" {
			continue // a variable or flag wins over the file anyway
		}
		if serr := cfg.Set(key, v.value); serr != nil {
			return Config{}, nil, err
		}
		cfg.setSource(key, ferr.Path, v.line)
	}
	if verr := cfg.Validate(); verr != nil {
		return Config{}, nil, err
	}
	return cfg, ferr, nil
}

type located struct {
	value string
	line  int
}

// locationKeys reads state_dir and admin_socket from a config file that
// may otherwise be broken. ok is false when the file is not even YAML and
// seems to set one of them.
func locationKeys(data []byte) (map[string]located, bool) {
	out := map[string]located{}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		for _, line := range strings.Split(string(data), "\n") {
			k, _, _ := strings.Cut(strings.TrimSpace(line), ":")
			if k == "state_dir" || k == "admin_socket" {
				return nil, false
			}
		}
		return out, true
	}
	if len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return out, true
	}
	m := root.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Value != "state_dir" && k.Value != "admin_socket" {
			continue
		}
		if v.Kind != yaml.ScalarNode {
			return nil, false
		}
		out[k.Value] = located{v.Value, k.Line}
	}
	return out, true
}
