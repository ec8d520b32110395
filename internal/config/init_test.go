package config_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pgwake/pgwake/internal/config"
)

// writeTree writes files (path -> content) below dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLoadProjectInitAndSettings: init paths are relative to the config
// file, a folder gives its scripts in lexical order, a single path or a
// list works, and settings are a mapping with names in lower case.
func TestLoadProjectInitAndSettings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"db/init/10-b.sql":    "select 1;",
		"db/init/02-a.sql.gz": "",
		"db/init/03-c.sh":     "",
		"db/init/README.md":   "ignored",
		"db/init/sub/x.sql":   "ignored: a subfolder",
		"seed.sql":            "",
		"pgwake.yaml": `projects:
  - name: app
    init: [db/init, seed.sql]
    settings:
      shared_buffers: 256MB
      Work_Mem: 64MB
      pg_stat_statements.max: 1000
  - name: one
    init: seed.sql
`,
	})
	cfg, err := config.Load(config.Sources{File: filepath.Join(dir, "pgwake.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	app, one := cfg.Projects[0], cfg.Projects[1]
	want := []string{
		filepath.Join(dir, "db/init/02-a.sql.gz"), filepath.Join(dir, "db/init/03-c.sh"),
		filepath.Join(dir, "db/init/10-b.sql"), filepath.Join(dir, "seed.sql"),
	}
	if !slices.Equal(app.Init, want) {
		t.Errorf("init = %q, want %q", app.Init, want)
	}
	if w := []string{filepath.Join(dir, "seed.sql")}; !slices.Equal(one.Init, w) {
		t.Errorf("init of a single path = %q, want %q", one.Init, w)
	}
	if got := app.Settings; len(got) != 3 || got["shared_buffers"] != "256MB" || got["work_mem"] != "64MB" || got["pg_stat_statements.max"] != "1000" {
		t.Errorf("settings = %v", got)
	}
}

// TestLoadProjectInitErrors: each mistake is one line naming the file's
// line and what is wrong.
func TestLoadProjectInitErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yaml string
		files      map[string]string
		want       []string
	}{
		{"missing file", "projects:\n  - name: app\n    init: nope.sql\n", nil, []string{"line 3", "nope.sql", "no such file or folder"}},
		{"unknown extension", "projects:\n  - name: app\n    init: x.txt\n", map[string]string{"x.txt": ""}, []string{"line 3", "x.txt", "not a .sql, .sql.gz or .sh file"}},
		{"empty folder", "projects:\n  - name: app\n    init: d\n", map[string]string{"d/README": ""}, []string{"line 3", "holds no .sql"}},
		{"bad setting name", "projects:\n  - name: app\n    settings:\n      work-mem: 4MB\n", nil, []string{"line 4", "work-mem", "not a Postgres setting name"}},
		{"managed setting", "projects:\n  - name: app\n    settings:\n      port: 5433\n", nil, []string{"line 4", "managed by pgwake"}},
		{"settings not a mapping", "projects:\n  - name: app\n    settings: [a]\n", nil, []string{"line 3", "settings must be a mapping"}},
		{"setting value a list", "projects:\n  - name: app\n    settings:\n      work_mem: [1]\n", nil, []string{"line 4", "single value"}},
		{"init a mapping", "projects:\n  - name: app\n    init: {a: b}\n", nil, []string{"line 3", "a path or a list of paths"}},
		{"setting twice", "projects:\n  - name: app\n    settings:\n      work_mem: 1MB\n      WORK_MEM: 2MB\n", nil, []string{"line 5", "set twice"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			files := map[string]string{"pgwake.yaml": tc.yaml}
			for k, v := range tc.files {
				files[k] = v
			}
			writeTree(t, dir, files)
			_, err := config.Load(config.Sources{File: filepath.Join(dir, "pgwake.yaml")})
			if err == nil {
				t.Fatal("Load succeeded")
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("error is not one line: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
		})
	}
}
