package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/proxy"
)

// fixture returns the path of a file in testdata.
func fixture(name string) string { return filepath.Join("testdata", name) }

// flagSet returns a flag set with every key bound, parsed from args.
func flagSet(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	config.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return fs
}

// envName is a key's environment variable.
func envName(t *testing.T, key string) string {
	t.Helper()
	for _, k := range config.Keys() {
		if k.Name == key {
			return k.Env
		}
	}
	t.Fatalf("no config key %q", key)
	return ""
}

// flagName is a key's flag.
func flagName(t *testing.T, key string) string {
	t.Helper()
	for _, k := range config.Keys() {
		if k.Name == key {
			return k.Flag
		}
	}
	t.Fatalf("no config key %q", key)
	return ""
}

func TestKeys(t *testing.T) {
	t.Parallel()
	keys := config.Keys()
	if len(keys) == 0 {
		t.Fatal("Keys() is empty")
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k.Name] {
			t.Errorf("key %q listed twice", k.Name)
		}
		seen[k.Name] = true
		// Nested keys ("tls.mode") use underscores in variables and dashes
		// in flags; tls.mode's flag is plain --tls, and the kubernetes
		// section's connection keys take kubectl's flag names.
		if want := "PGWAKE_" + strings.ToUpper(strings.ReplaceAll(k.Name, ".", "_")); k.Env != want {
			t.Errorf("key %q: env %q, want %q", k.Name, k.Env, want)
		}
		want := strings.NewReplacer("_", "-", ".", "-").Replace(k.Name)
		kubectlFlags := map[string]string{
			"tls.mode": "tls", "kubernetes.kubeconfig": "kubeconfig", "kubernetes.context": "context",
			"kubernetes.namespace": "namespace", "kubernetes.storage_class": "storage-class",
			"kubernetes.storage_size": "storage-size",
		}
		if f, ok := kubectlFlags[k.Name]; ok {
			want = f
		}
		if k.Flag != want {
			t.Errorf("key %q: flag %q, want %q", k.Name, k.Flag, want)
		}
		if k.Usage == "" {
			t.Errorf("key %q has no usage text", k.Name)
		}
		if k.Env == config.EnvConfigFile {
			t.Errorf("key %q collides with %s", k.Name, config.EnvConfigFile)
		}
	}
	for _, want := range []string{"listen", "state_dir", "sleep_after", "max_connections", "log_level"} {
		if !seen[want] {
			t.Errorf("Keys() lacks %q", want)
		}
	}
}

// TestSetGetRoundTrip checks that every key's formatted default parses back
// to itself: BindFlags shows defaults as Get strings, and Load feeds a flag's
// string back through Set.
func TestSetGetRoundTrip(t *testing.T) {
	t.Parallel()
	def := config.Default()
	for _, k := range config.Keys() {
		t.Run(k.Name, func(t *testing.T) {
			t.Parallel()
			c := config.Default()
			if err := c.Set(k.Name, def.Get(k.Name)); err != nil {
				t.Fatalf("Set(%q, %q): %v", k.Name, def.Get(k.Name), err)
			}
			if !reflect.DeepEqual(c, def) {
				t.Errorf("Set(%q, Get(%q)) changed the config: %+v, want %+v", k.Name, k.Name, c, def)
			}
		})
	}
}

func TestSet(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key, value string
		want       string // Get after Set; "" when wantErr
		wantErr    []string
	}{
		{key: "listen", value: "0.0.0.0:5432", want: "0.0.0.0:5432"},
		{key: "sleep_after", value: "90s", want: "1m30s"},
		{key: "sleep_after", value: "0", want: "0s"},
		{key: "max_connections", value: "12", want: "12"},
		{key: "sleep_after", value: "10", wantErr: []string{"sleep_after", `"10" is not a duration`}},
		{key: "wake_timeout", value: "soon", wantErr: []string{"wake_timeout", `"soon" is not a duration`}},
		{key: "max_connections", value: "1.5", wantErr: []string{"max_connections", `"1.5" is not a whole number`}},
		{key: "max_project_connections", value: "", wantErr: []string{"max_project_connections", "not a whole number"}},
		{key: "no_such_key", value: "x", wantErr: []string{`unknown config key "no_such_key"`}},
	}
	for _, tt := range tests {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			c := config.Default()
			err := c.Set(tt.key, tt.value)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("Set(%q, %q) = nil, want an error", tt.key, tt.value)
				}
				for _, s := range tt.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("Set(%q, %q) = %q, want it to contain %q", tt.key, tt.value, err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Set(%q, %q): %v", tt.key, tt.value, err)
			}
			if got := c.Get(tt.key); got != tt.want {
				t.Errorf("Get(%q) = %q, want %q", tt.key, got, tt.want)
			}
		})
	}
}

// TestLoadPrecedence sets each key in every combination of sources and
// checks that the highest one wins (flags > env > file > defaults), and that
// every other key keeps the value of the file or the defaults.
func TestLoadPrecedence(t *testing.T) {
	t.Parallel()
	// file values are what testdata/full.yaml holds, in Get's format.
	keys := []struct{ key, file, env, flag string }{
		{"listen", "127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"},
		{"image", "file/postgres:1", "env/postgres:2", "flag/postgres:3"},
		{"sleep_after", "5m0s", "6m0s", "7m0s"},
		{"sleep_mode", "pause", "stop", "tiered"},
		{"stop_after", "45m0s", "1h0m0s", "2h0m0s"},
		{"max_connections", "50", "60", "70"},
		{"log_level", "warn", "error", "debug"},
		{"grace_period", "1m0s", "2m0s", "3m0s"},
		{"state_dir", "/tmp/pgwake-file", "/tmp/pgwake-env", "/tmp/pgwake-flag"},
	}
	fileVals := map[string]string{}
	for _, k := range keys {
		fileVals[k.key] = k.file
	}
	layers := []struct {
		name            string
		file, env, flag bool
	}{
		{name: "defaults"},
		{name: "file", file: true},
		{name: "env", env: true},
		{name: "flag", flag: true},
		{name: "file+env", file: true, env: true},
		{name: "file+flag", file: true, flag: true},
		{name: "env+flag", env: true, flag: true},
		{name: "file+env+flag", file: true, env: true, flag: true},
	}
	def := config.Default()
	for _, k := range keys {
		for _, l := range layers {
			t.Run(k.key+"/"+l.name, func(t *testing.T) {
				t.Parallel()
				file, want := fixture("empty.yaml"), def.Get(k.key)
				if l.file {
					file, want = fixture("full.yaml"), k.file
				}
				// Unrelated variables are ignored; PGWAKE_CONFIG is not a key.
				env := []string{"HOME=/nonexistent", "PGHOST=elsewhere", config.EnvConfigFile + "=" + file}
				if l.env {
					env, want = append(env, envName(t, k.key)+"="+k.env), k.env
				}
				var args []string
				if l.flag {
					args, want = []string{"--" + flagName(t, k.key) + "=" + k.flag}, k.flag
				}
				cfg, err := config.Load(config.Sources{Environ: env, Flags: flagSet(t, args...)})
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				if got := cfg.Get(k.key); got != want {
					t.Errorf("%s = %q, want %q", k.key, got, want)
				}
				for _, other := range config.Keys() {
					if other.Name == k.key {
						continue
					}
					want := def.Get(other.Name)
					if v, ok := fileVals[other.Name]; ok && l.file {
						want = v
					}
					if got := cfg.Get(other.Name); got != want {
						t.Errorf("unrelated key %s = %q, want %q", other.Name, got, want)
					}
				}
			})
		}
	}
}

// TestLoadNilFlags checks that Load works without a flag set, as for
// commands that bind none.
func TestLoadNilFlags(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(config.Sources{
		File:    fixture("full.yaml"),
		Environ: []string{"PGWAKE_LISTEN=127.0.0.1:0"},
	})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if cfg.Listen != "127.0.0.1:0" || cfg.Image != "file/postgres:1" || cfg.SleepAfter != 5*time.Minute {
		t.Errorf("Load = %+v, want listen from env, image and sleep_after from the file", cfg)
	}
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		file    string // in testdata; "" is empty.yaml
		env     []string
		args    []string
		wantErr []string // substrings of the error
	}{
		{
			name:    "unknown yaml key",
			file:    "unknown_key.yaml",
			wantErr: []string{"unknown_key.yaml", "sleep_afterr"},
		},
		{
			name:    "bad duration in file",
			file:    "bad_duration.yaml",
			wantErr: []string{"bad_duration.yaml", "soon"},
		},
		{
			name:    "bad int in file",
			file:    "bad_int.yaml",
			wantErr: []string{"bad_int.yaml", "lots"},
		},
		{
			name:    "invalid value in file",
			file:    "invalid.yaml",
			wantErr: []string{"sleep_mode", "stop", "pause"},
		},
		{
			name:    "unknown PGWAKE_ variable",
			env:     []string{"PGWAKE_LISTN=127.0.0.1:1"},
			wantErr: []string{"unknown environment variable PGWAKE_LISTN", "PGWAKE_LISTEN"},
		},
		{
			name:    "unknown PGWAKE_ variable without a value",
			env:     []string{"PGWAKE_DEBUG"},
			wantErr: []string{"PGWAKE_DEBUG"},
		},
		{
			name:    "bad duration in env",
			env:     []string{"PGWAKE_SLEEP_AFTER=10"},
			wantErr: []string{"PGWAKE_SLEEP_AFTER", `"10" is not a duration`},
		},
		{
			name:    "bad int in env",
			env:     []string{"PGWAKE_MAX_CONNECTIONS=many"},
			wantErr: []string{"PGWAKE_MAX_CONNECTIONS", `"many" is not a whole number`},
		},
		{
			name:    "bad duration flag",
			args:    []string{"--wake-timeout=soon"},
			wantErr: []string{"--wake-timeout", `"soon" is not a duration`},
		},
		{
			name:    "bad int flag",
			args:    []string{"--max-project-connections=1e3"},
			wantErr: []string{"--max-project-connections", "not a whole number"},
		},
		{
			name:    "bad env is reported even when a flag sets the key",
			env:     []string{"PGWAKE_SLEEP_AFTER=forever"},
			args:    []string{"--sleep-after=1m"},
			wantErr: []string{"PGWAKE_SLEEP_AFTER"},
		},
		{
			name:    "bad kubernetes dial",
			args:    []string{"--kubernetes-dial=ssh"},
			wantErr: []string{"--kubernetes-dial", `kubernetes.dial: "ssh" is not auto, pod-ip or port-forward`},
		},
		{
			name:    "bad kubernetes storage size",
			env:     []string{"PGWAKE_KUBERNETES_STORAGE_SIZE=big"},
			wantErr: []string{"PGWAKE_KUBERNETES_STORAGE_SIZE", `"big" is not a size like 1Gi`},
		},
		{
			name:    "bad backend names kubernetes among the choices",
			env:     []string{"PGWAKE_BACKEND=k8s"},
			wantErr: []string{"PGWAKE_BACKEND", "auto, docker, local or kubernetes"},
		},
		{
			name:    "listen without port",
			env:     []string{"PGWAKE_LISTEN=localhost"},
			wantErr: []string{`listen: "localhost" is not host:port`},
		},
		{
			name:    "listen flag without port",
			args:    []string{"--listen=6432"},
			wantErr: []string{"listen", "not host:port"},
		},
		{
			name:    "bad sleep_mode",
			args:    []string{"--sleep-mode=hibernate"},
			wantErr: []string{"sleep_mode", `"stop", "pause" or "tiered"`},
		},
		{
			name:    "negative sleep_after",
			env:     []string{"PGWAKE_SLEEP_AFTER=-1m"},
			wantErr: []string{"sleep_after must not be negative"},
		},
		{
			name:    "negative grace_period",
			args:    []string{"--grace-period=-5s"},
			wantErr: []string{"grace_period must not be negative"},
		},
		{
			name:    "negative shutdown_timeout",
			env:     []string{"PGWAKE_SHUTDOWN_TIMEOUT=-1s"},
			wantErr: []string{"shutdown_timeout must not be negative"},
		},
		{
			name:    "zero wake_timeout",
			env:     []string{"PGWAKE_WAKE_TIMEOUT=0s"},
			wantErr: []string{"wake_timeout and startup_timeout must be positive"},
		},
		{
			name:    "zero max_connections",
			args:    []string{"--max-connections=0"},
			wantErr: []string{"max_connections and max_project_connections must be at least 1"},
		},
		{
			name:    "bad log_level",
			env:     []string{"PGWAKE_LOG_LEVEL=loud"},
			wantErr: []string{`log_level: "loud"`},
		},
		{
			name:    "bad log_format",
			args:    []string{"--log-format=xml"},
			wantErr: []string{`log_format: "xml" is not text or json`},
		},
		{
			name:    "empty image",
			env:     []string{"PGWAKE_IMAGE="},
			wantErr: []string{"image must be set"},
		},
		{
			name:    "empty state_dir",
			args:    []string{"--state-dir="},
			wantErr: []string{"state_dir must be set"},
		},
		{
			name:    "every invalid value is reported at once",
			env:     []string{"PGWAKE_LISTEN=nohostport", "PGWAKE_LOG_FORMAT=xml"},
			args:    []string{"--grace-period=-1s"},
			wantErr: []string{"listen", "log_format", "grace_period must not be negative"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			file := tt.file
			if file == "" {
				file = "empty.yaml"
			}
			cfg, err := config.Load(config.Sources{File: fixture(file), Environ: tt.env, Flags: flagSet(t, tt.args...)})
			if err == nil {
				t.Fatalf("Load = %+v, nil; want an error containing %q", cfg, tt.wantErr)
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Load error %q does not contain %q", err, s)
				}
			}
			if !reflect.DeepEqual(cfg, config.Config{}) {
				t.Errorf("Load returned a config with its error: %+v", cfg)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		mod     func(*config.Config)
		wantErr string // "" means valid
	}{
		{name: "defaults", mod: func(*config.Config) {}},
		{name: "port 0", mod: func(c *config.Config) { c.Listen = "127.0.0.1:0" }},
		{name: "ipv6 listen", mod: func(c *config.Config) { c.Listen = "[::1]:6432" }},
		{name: "never sleep", mod: func(c *config.Config) { c.SleepAfter = 0 }},
		{name: "no grace", mod: func(c *config.Config) { c.GracePeriod = 0 }},
		{name: "pause", mod: func(c *config.Config) { c.SleepMode = "pause" }},
		{name: "tiered", mod: func(c *config.Config) { c.SleepMode = "tiered"; c.StopAfter = time.Hour }},
		{name: "zero stop_after", mod: func(c *config.Config) { c.StopAfter = 0 }, wantErr: "stop_after must be positive"},
		{name: "negative stop_after", mod: func(c *config.Config) { c.StopAfter = -time.Minute }, wantErr: "stop_after must be positive"},
		{name: "project stop_after", mod: func(c *config.Config) {
			d := time.Hour
			c.Projects = []config.ProjectConfig{{Name: "app", SleepMode: "tiered", StopAfter: &d}}
		}},
		{name: "zero project stop_after", mod: func(c *config.Config) {
			var d time.Duration
			c.Projects = []config.ProjectConfig{{Name: "app", StopAfter: &d}}
		}, wantErr: "projects[0] (app): stop_after must be positive"},
		{name: "json logs", mod: func(c *config.Config) { c.LogFormat = "json"; c.LogLevel = "debug" }},
		{name: "listen without port", mod: func(c *config.Config) { c.Listen = "127.0.0.1" }, wantErr: "listen"},
		{name: "ipv6 without brackets", mod: func(c *config.Config) { c.Listen = "::1:6432" }, wantErr: "listen"},
		{name: "empty sleep_mode", mod: func(c *config.Config) { c.SleepMode = "" }, wantErr: "sleep_mode"},
		{name: "bad sleep_mode", mod: func(c *config.Config) { c.SleepMode = "Stop" }, wantErr: "sleep_mode"},
		{name: "negative sleep_after", mod: func(c *config.Config) { c.SleepAfter = -time.Second }, wantErr: "sleep_after must not be negative"},
		{name: "negative wake_timeout", mod: func(c *config.Config) { c.WakeTimeout = -time.Second }, wantErr: "wake_timeout must not be negative"},
		{name: "negative startup_timeout", mod: func(c *config.Config) { c.StartupTimeout = -time.Second }, wantErr: "startup_timeout must not be negative"},
		{name: "zero startup_timeout", mod: func(c *config.Config) { c.StartupTimeout = 0 }, wantErr: "must be positive"},
		{name: "negative max_project_connections", mod: func(c *config.Config) { c.MaxProjectConnections = -1 }, wantErr: "at least 1"},
		{name: "empty log_level", mod: func(c *config.Config) { c.LogLevel = "" }, wantErr: "log_level"},
		{name: "empty state_dir", mod: func(c *config.Config) { c.StateDir = "" }, wantErr: "state_dir must be set"},
		{name: "zero max_startup_connections", mod: func(c *config.Config) { c.MaxStartupConnections = 0 }, wantErr: "max_startup_connections must be at least 1"},
		{name: "one port", mod: func(c *config.Config) { c.PortRange = "7000-7000" }},
		{name: "port range with spaces", mod: func(c *config.Config) { c.PortRange = "1024 - 65535" }},
		{name: "port range not a range", mod: func(c *config.Config) { c.PortRange = "6500" }, wantErr: `port_range: "6500" is not LOW-HIGH`},
		{name: "port range not numbers", mod: func(c *config.Config) { c.PortRange = "a-b" }, wantErr: "is not LOW-HIGH"},
		{name: "port range below 1024", mod: func(c *config.Config) { c.PortRange = "80-8080" }, wantErr: "1024 <= LOW <= HIGH <= 65535"},
		{name: "port range reversed", mod: func(c *config.Config) { c.PortRange = "7000-6000" }, wantErr: "1024 <= LOW <= HIGH"},
		{name: "port range past 65535", mod: func(c *config.Config) { c.PortRange = "6000-70000" }, wantErr: "HIGH <= 65535"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := config.Default()
			tt.mod(&c)
			err := c.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tt.wantErr != "" && err == nil:
				t.Errorf("Validate = nil, want an error containing %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Errorf("Validate = %q, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

// TestLoadFileSelection covers which file Load reads: --config, then
// PGWAKE_CONFIG, then ./pgwake.yaml if it exists. It changes the working
// directory, so it does not run in parallel.
func TestLoadFileSelection(t *testing.T) {
	abs := func(name string) string {
		t.Helper()
		p, err := filepath.Abs(fixture(name))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	full, empty := abs("full.yaml"), abs("empty.yaml")
	def := config.Default()

	// dir with a pgwake.yaml setting only the image.
	withDefault := t.TempDir()
	if err := os.WriteFile(filepath.Join(withDefault, config.DefaultFile), []byte("image: cwd/postgres:9\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// dir whose pgwake.yaml cannot be read as a file.
	unreadable := t.TempDir()
	if err := os.Mkdir(filepath.Join(unreadable, config.DefaultFile), 0o700); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.yaml")

	tests := []struct {
		name      string
		dir       string // working directory; "" is an empty one
		file      string // Sources.File (--config)
		env       []string
		wantImage string
		wantErr   []string
	}{
		{name: "no file anywhere", wantImage: def.Image},
		{name: "default file in working directory", dir: withDefault, wantImage: "cwd/postgres:9"},
		{name: "PGWAKE_CONFIG picks the file", env: []string{"PGWAKE_CONFIG=" + full}, wantImage: "file/postgres:1"},
		{name: "PGWAKE_CONFIG beats ./pgwake.yaml", dir: withDefault, env: []string{"PGWAKE_CONFIG=" + empty}, wantImage: def.Image},
		{name: "--config beats PGWAKE_CONFIG", file: full, env: []string{"PGWAKE_CONFIG=" + empty}, wantImage: "file/postgres:1"},
		{name: "--config beats ./pgwake.yaml", dir: withDefault, file: full, wantImage: "file/postgres:1"},
		{name: "empty PGWAKE_CONFIG falls back to ./pgwake.yaml", dir: withDefault, env: []string{"PGWAKE_CONFIG="}, wantImage: "cwd/postgres:9"},
		{name: "explicit missing --config", file: missing, wantErr: []string{"config file", "missing.yaml"}},
		{name: "explicit missing PGWAKE_CONFIG", env: []string{"PGWAKE_CONFIG=" + missing}, wantErr: []string{"config file", "missing.yaml"}},
		{name: "explicit missing file although ./pgwake.yaml exists", dir: withDefault, file: missing, wantErr: []string{"missing.yaml"}},
		{name: "unreadable ./pgwake.yaml", dir: unreadable, wantErr: []string{"config file", config.DefaultFile}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir
			if dir == "" {
				dir = t.TempDir()
			}
			t.Chdir(dir)
			cfg, err := config.Load(config.Sources{File: tt.file, Environ: tt.env})
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("Load = %+v, nil; want an error", cfg)
				}
				for _, s := range tt.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("Load error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if cfg.Image != tt.wantImage {
				t.Errorf("image = %q, want %q", cfg.Image, tt.wantImage)
			}
		})
	}
}

// TestLoadFileZeroDuration: "0" means never for sleep_after, and
// PGWAKE_SLEEP_AFTER=0 and --sleep-after=0 accept it, so the file must too.
func TestLoadFileZeroDuration(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load(config.Sources{File: fixture("zero_duration.yaml")})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if cfg.SleepAfter != 0 {
		t.Errorf("sleep_after = %v, want 0", cfg.SleepAfter)
	}
}

func TestBindFlags(t *testing.T) {
	t.Parallel()
	def := config.Default()

	t.Run("all keys with built-in defaults", func(t *testing.T) {
		t.Parallel()
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		config.BindFlags(fs)
		for _, k := range config.Keys() {
			f := fs.Lookup(k.Flag)
			if f == nil {
				t.Errorf("no flag --%s", k.Flag)
				continue
			}
			if f.DefValue != def.Get(k.Name) {
				t.Errorf("--%s default %q, want %q", k.Flag, f.DefValue, def.Get(k.Name))
			}
			if !strings.Contains(f.Usage, k.Env) {
				t.Errorf("--%s usage %q does not name %s", k.Flag, f.Usage, k.Env)
			}
		}
	})

	t.Run("only the named keys", func(t *testing.T) {
		t.Parallel()
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		config.BindFlags(fs, "state_dir", "log_level")
		var got []string
		fs.VisitAll(func(f *pflag.Flag) { got = append(got, f.Name) })
		slices.Sort(got)
		if want := []string{"log-level", "state-dir"}; !slices.Equal(got, want) {
			t.Errorf("flags %q, want %q", got, want)
		}
	})

	t.Run("binding twice keeps the first flags", func(t *testing.T) {
		t.Parallel()
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		config.BindFlags(fs, "listen")
		config.BindFlags(fs) // would panic on a redefined flag
		if err := fs.Parse([]string{"--listen=127.0.0.1:1", "--image=x"}); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(config.Sources{File: fixture("empty.yaml"), Flags: fs})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Listen != "127.0.0.1:1" || cfg.Image != "x" {
			t.Errorf("listen %q image %q, want 127.0.0.1:1 and x", cfg.Listen, cfg.Image)
		}
	})

	t.Run("flags not given leave env alone", func(t *testing.T) {
		t.Parallel()
		cfg, err := config.Load(config.Sources{
			File:    fixture("empty.yaml"),
			Environ: []string{"PGWAKE_LISTEN=127.0.0.1:2"},
			Flags:   flagSet(t, "--image=y"),
		})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Listen != "127.0.0.1:2" {
			t.Errorf("listen %q: an unset --listen overrode PGWAKE_LISTEN", cfg.Listen)
		}
	})
}

func TestPortsAndStartupDefaults(t *testing.T) {
	t.Parallel()
	c := config.Default()
	low, high, err := c.Ports()
	if err != nil || low != 6500 || high != 6999 {
		t.Errorf("default port_range: %d-%d, %v; want 6500-6999", low, high, err)
	}
	if c.MaxStartupConnections != proxy.DefaultMaxStartupConns {
		t.Errorf("default max_startup_connections %d, want the proxy's %d", c.MaxStartupConnections, proxy.DefaultMaxStartupConns)
	}
	cfg, err := config.Load(config.Sources{File: fixture("empty.yaml"),
		Environ: []string{"PGWAKE_PORT_RANGE=7000-7100", "PGWAKE_MAX_STARTUP_CONNECTIONS=50"}})
	if err != nil {
		t.Fatal(err)
	}
	if low, high, _ := cfg.Ports(); low != 7000 || high != 7100 || cfg.MaxStartupConnections != 50 {
		t.Errorf("from the environment: port_range %d-%d, max_startup_connections %d", low, high, cfg.MaxStartupConnections)
	}
}

func TestSocketPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		stateDir, adminSocket, want string
	}{
		{stateDir: "/var/lib/pgwake", want: "/var/lib/pgwake/pgwake.sock"},
		{stateDir: "/var/lib/pgwake", adminSocket: "/run/pgwake.sock", want: "/run/pgwake.sock"},
	}
	for _, tt := range tests {
		c := config.Default()
		c.StateDir, c.AdminSocket = tt.stateDir, tt.adminSocket
		if got := c.SocketPath(); got != tt.want {
			t.Errorf("SocketPath(state_dir %q, admin_socket %q) = %q, want %q", tt.stateDir, tt.adminSocket, got, tt.want)
		}
	}
}

func TestSlogLevel(t *testing.T) {
	t.Parallel()
	for _, lvl := range []string{"debug", "info", "warn", "error", "INFO"} {
		c := config.Default()
		c.LogLevel = lvl
		if _, err := c.SlogLevel(); err != nil {
			t.Errorf("SlogLevel(%q): %v", lvl, err)
		}
	}
	c := config.Default()
	c.LogLevel = "verbose"
	if _, err := c.SlogLevel(); err == nil {
		t.Error(`SlogLevel("verbose") = nil error`)
	}
}

func TestLogAttrs(t *testing.T) {
	t.Parallel()
	c := config.Default()
	attrs := c.LogAttrs()
	if len(attrs) != 2*len(config.Keys()) {
		t.Fatalf("LogAttrs has %d values, want a key and a value for each of %d keys", len(attrs), len(config.Keys()))
	}
	for i, k := range config.Keys() {
		if attrs[2*i] != k.Name || attrs[2*i+1] != c.Get(k.Name) {
			t.Errorf("LogAttrs[%d:%d] = %v, %v; want %s, %s", 2*i, 2*i+2, attrs[2*i], attrs[2*i+1], k.Name, c.Get(k.Name))
		}
	}
}

func TestLogAttrsHideTheAdminToken(t *testing.T) {
	t.Parallel()
	cfg := config.Default()
	cfg.AdminToken = "s3cret-token"
	for _, a := range cfg.LogAttrs() {
		if s, ok := a.(string); ok && strings.Contains(s, "s3cret-token") {
			t.Fatal("the effective-config log line carries the admin token")
		}
	}
}

// TestErrorsNameTheirSource: a value that parses but makes no sense is
// reported with where it was set: the file and line, the variable or the
// flag, so the user knows what to change.
func TestErrorsNameTheirSource(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pgwake.yaml")
	if err := os.WriteFile(file, []byte("image: x\nport_range: 10-20\nprojects:\n  - name: Bad_Name\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{name: "file", want: []string{file + " line 2: port_range:", file + " line 3: projects[0]: invalid project name"}},
		{name: "variable over the file", env: []string{"PGWAKE_PORT_RANGE=30-40"}, want: []string{"PGWAKE_PORT_RANGE: port_range: \"30-40\""}},
		{name: "flag over both", env: []string{"PGWAKE_PORT_RANGE=30-40"}, args: []string{"--port-range=50-60"}, want: []string{"--port-range: port_range: \"50-60\""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Load(config.Sources{File: file, Environ: tt.env, Flags: flagSet(t, tt.args...)})
			if err == nil {
				t.Fatal("loaded a bad config")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	// A default never gets a source.
	cfg, err := config.Load(config.Sources{Environ: []string{"PGWAKE_IMAGE=x"}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Source("image") != "PGWAKE_IMAGE" || cfg.Source("listen") != "" {
		t.Errorf("sources image %q listen %q", cfg.Source("image"), cfg.Source("listen"))
	}
}

func TestProjectStopAfter(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("projects:\n  - name: app\n    sleep_mode: tiered\n    stop_after: 2h\n  - name: other\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("projects:\n  - name: app\n    stop_after: later\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(config.Sources{File: good})
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Projects[0]; p.SleepMode != "tiered" || p.StopAfter == nil || *p.StopAfter != 2*time.Hour {
		t.Fatalf("projects[0] = %+v; want tiered, stop_after 2h", p)
	}
	if p := cfg.Projects[1]; p.StopAfter != nil {
		t.Fatalf("projects[1] stop_after = %v; want unset (the default applies)", *p.StopAfter)
	}
	if _, err := config.Load(config.Sources{File: bad}); err == nil || !strings.Contains(err.Error(), `stop_after "later" is not a duration`) {
		t.Fatalf("Load of a bad stop_after: %v", err)
	}
}

// TestREADMEDocumentsEveryKey: every key has its row in the README's
// configuration table, with its flag and variable.
func TestREADMEDocumentsEveryKey(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	for _, k := range config.Keys() {
		row := fmt.Sprintf("| `%s` | `--%s` | `%s` |", k.Name, k.Flag, k.Env)
		if !strings.Contains(readme, row) {
			t.Errorf("README.md's configuration table has no row starting %q", row)
		}
	}
}
