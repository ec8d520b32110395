package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/backend"
	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/state"
)

// initRoot holds pgwake's copies of every project's init scripts, taken at
// create: <state_dir>/init/PROJECT/NN/NAME.
func (d *Daemon) initRoot(project string) string {
	return filepath.Join(d.cfg.StateDir, "init", project)
}

// initSupported names the backends that run init scripts, and
// settingsSupported those that apply settings.
var (
	initSupported     = map[string]bool{"docker": true, "local": true}
	settingsSupported = map[string]bool{"docker": true, "local": true, "kubernetes": true}
)

// unsafeName is what an init script's name may not hold: it goes into
// file names and shell scripts of the server's runtime.
var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// checkInitRequest validates a create request's settings and init scripts
// before anything exists, and returns the settings with their names as
// Postgres knows them.
func checkInitRequest(req admin.CreateRequest, backendName string) (map[string]string, error) {
	if len(req.Init) > 0 && !initSupported[backendName] {
		return nil, fmt.Errorf("the %s backend does not run init scripts (the docker and local backends do)", backendName)
	}
	if len(req.Settings) > 0 && !settingsSupported[backendName] {
		return nil, fmt.Errorf("the %s backend does not apply settings", backendName)
	}
	var settings map[string]string
	for k, v := range req.Settings {
		name, err := config.SettingName(k)
		if err != nil {
			return nil, err
		}
		if _, dup := settings[name]; dup {
			return nil, fmt.Errorf("setting %s is given twice", name)
		}
		if settings == nil {
			settings = map[string]string{}
		}
		settings[name] = v
	}
	total := 0
	for _, f := range req.Init {
		if f.Name == "" || f.Name != filepath.Base(f.Name) || f.Name == "." || f.Name == ".." {
			return nil, fmt.Errorf("init script name %q: a file name, without folders", f.Name)
		}
		if backend.InitKind(f.Name) == "" {
			return nil, fmt.Errorf("init script %s: not a .sql, .sql.gz or .sh file", f.Name)
		}
		total += len(f.Data)
	}
	if total > admin.MaxInitBytes {
		return nil, fmt.Errorf("init scripts: more than %d MiB in all", admin.MaxInitBytes>>20)
	}
	return settings, nil
}

// writeInit stores pgwake's own copies of a project's init scripts and
// returns their paths, in order.
func (d *Daemon) writeInit(project string, files []admin.InitFile) ([]string, error) {
	if len(files) == 0 {
		return nil, nil
	}
	root := d.initRoot(project)
	// A leftover of a project of this name (a crash between its removal
	// and this): the name is claimed, nothing else uses it.
	if err := os.RemoveAll(root); err != nil {
		return nil, fmt.Errorf("init scripts: %w", err)
	}
	var out []string
	for i, f := range files {
		dir := filepath.Join(root, fmt.Sprintf("%02d", i+1))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("init scripts: %w", err)
		}
		mode := os.FileMode(0o600)
		if f.Executable {
			mode = 0o700
		}
		path := filepath.Join(dir, unsafeName.ReplaceAllString(f.Name, "_"))
		if err := os.WriteFile(path, f.Data, mode); err != nil {
			os.RemoveAll(root)
			return nil, fmt.Errorf("init scripts: %w", err)
		}
		out = append(out, path)
	}
	return out, nil
}

// removeInit removes pgwake's copies of a project's init scripts.
func (d *Daemon) removeInit(project string) {
	if err := os.RemoveAll(d.initRoot(project)); err != nil {
		d.log.Warn("remove the copies of its init scripts", "project", project, "err", err)
	}
}

// onWake is the proxy's hook after every wake.
func (d *Daemon) onWake(project string, took time.Duration, err error) {
	d.metrics.ObserveWake(project, took, err)
	d.noteWake(project, err)
}

// noteWake records a failed wake's init failure with the project, so that
// `ls`, the API and a restarted pgwake show it: the backend's own error
// when it refused to start half-initialised data, or, when the server
// died during its first start, what the backend finds in its data.
func (d *Daemon) noteWake(project string, err error) {
	if err == nil {
		return
	}
	p, gerr := d.store.Get(project)
	if gerr != nil || p.InitError != "" {
		return
	}
	var ie *backend.InitError
	if !errors.As(err, &ie) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if !errors.As(d.backendOf(p).InitFailure(ctx, spec(p)), &ie) {
			return
		}
	}
	msg := ie.Error()
	if uerr := d.store.Update(project, func(p *state.Project) { p.InitError = msg }); uerr != nil {
		d.log.Warn("record the init failure", "project", project, "err", uerr)
		return
	}
	d.log.Error("init scripts failed: the project is not served until it is removed with its data", "project", project, "err", msg)
}

// syncDeclaredSettings gives projects pgwake.yaml declares the settings it
// declares now: they apply at each one's next start (a server that runs
// keeps its own until it sleeps). Init scripts are not synced: they ran
// once, at the first start.
func (d *Daemon) syncDeclaredSettings() error {
	for _, pc := range d.cfg.Projects {
		p, err := d.store.Get(pc.Name)
		if err != nil || p.Adopted != "" || maps.Equal(p.Settings, pc.Settings) {
			continue
		}
		if len(pc.Settings) > 0 && !settingsSupported[p.Backend] {
			d.log.Warn("settings in pgwake.yaml not applied: the backend does not apply settings", "project", p.Name, "backend", p.Backend)
			continue
		}
		settings := maps.Clone(pc.Settings)
		if err := d.store.Update(pc.Name, func(p *state.Project) { p.Settings = settings }); err != nil {
			return err
		}
		d.saveToCatalog(p.Name)
		d.log.Info("settings from pgwake.yaml: they apply at the project's next start", "project", pc.Name, "settings", fmtSettings(settings))
	}
	return nil
}

// saveToCatalog stores a project's settings where every pgwake of its
// backend reads them, when that backend keeps projects (Kubernetes). A
// backend out of reach is told at its next save; meanwhile, the project's
// next start here applies the settings all the same.
func (d *Daemon) saveToCatalog(project string) {
	p, err := d.store.Get(project)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if cat := d.backendOf(p).catalog(ctx); cat != nil {
		if err := cat.Save(ctx, record(p)); err != nil {
			d.log.Warn("saving the project's settings with its backend", "project", project, "err", err)
		}
	}
}

func fmtSettings(s map[string]string) string {
	var b strings.Builder
	for i, a := range backend.SettingArgs(s) {
		if i%2 == 1 {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(a)
		}
	}
	return b.String()
}

// initNames are the scripts' own names, for the API.
func initNames(paths []string) []string {
	var out []string
	for _, p := range paths {
		out = append(out, filepath.Base(p))
	}
	return out
}

// declaredInit reads the init scripts a declared project names.
func declaredInit(pc config.ProjectConfig) ([]admin.InitFile, error) {
	return admin.ReadInitFiles(pc.Init)
}
