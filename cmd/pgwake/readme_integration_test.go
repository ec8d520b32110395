package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/config"
)

// The README's shell blocks, run as written in a fresh clone of this
// repository with the pgwake this test built on PATH as `pgwake`: the
// 60-second tour right after the set-up's main job, and the CI block twice
// in a row with examples/pgwake.yaml as ./pgwake.yaml. Only the environment
// differs from a user's machine: the harness's private state dir, port
// block and proxy port (PGWAKE_STATE_DIR, PGWAKE_PORT_RANGE,
// PGWAKE_LISTEN=127.0.0.1:0, so parallel tests and a pgwake of the machine
// on 6432 do not meet), and PGWAKE_IMAGE, the offline image testenv builds,
// because no registry can be reached here to pull the default postgres:17.
// The README asks the user for none of these.

// readmeBlockTimeout bounds one block; it creates projects, whose first
// start runs initdb (78-81 s seen on a loaded runner).
const readmeBlockTimeout = 12 * time.Minute

// readmeTestCommand is the README's test command, which .ci/run runs too.
const readmeTestCommand = "./scripts/setup && go test -race -count=1 -timeout 40m ./..."

// repoRoot is the repository this test is in: the package directory under
// go test is cmd/pgwake.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s: %v", root, err)
	}
	return root
}

// freshClone makes a fresh checkout of the repository this test is in, as
// a user or a CI runner has it: a git clone, with the uncommitted changes
// to tracked files applied (so an edit of README.md is tested before it is
// committed; untracked and ignored files are not part of it). Outside a git
// checkout it copies the tree without what .gitignore lists.
func freshClone(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	dst := filepath.Join(t.TempDir(), "pgwake")
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Logf("no .git in %s (%v): copying the tree without what .gitignore lists", root, err)
		if err := copyTree(root, dst); err != nil {
			t.Fatalf("copy %s: %v", root, err)
		}
		return dst
	}
	git := func(dir string, stdin []byte, args ...string) []byte {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), "git", append([]string{"-C", dir}, args...)...)
		cmd.Stdin = bytes.NewReader(stdin)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git -C %s %s: %v\n%s", dir, strings.Join(args, " "), err, stderr.Bytes())
		}
		return out
	}
	git(root, nil, "clone", "--quiet", root, dst)
	if diff := git(root, nil, "diff", "HEAD", "--binary"); len(diff) > 0 {
		git(dst, diff, "apply", "--whitespace=nowarn", "-")
	}
	t.Logf("fresh clone of %s at %s in %s", root, strings.TrimSpace(string(git(dst, nil, "rev-parse", "--short", "HEAD"))), dst)
	return dst
}

// copyTree copies the regular files and directories below src to dst,
// leaving out .git and what src/.gitignore lists (its simple patterns:
// names, globs, a leading / anchoring to the root, a trailing / for
// directories only).
func copyTree(src, dst string) error {
	var ignores []string
	if data, err := os.ReadFile(filepath.Join(src, ".gitignore")); err == nil {
		for line := range strings.Lines(string(data)) {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, "!") {
				ignores = append(ignores, line)
			}
		}
	}
	ignored := func(rel string, dir bool) bool {
		for _, p := range ignores {
			p, dirOnly := strings.CutSuffix(p, "/")
			if dirOnly && !dir {
				continue
			}
			name := filepath.Base(rel)
			if strings.Contains(p, "/") {
				name = rel
			}
			if ok, _ := filepath.Match(strings.TrimPrefix(p, "/"), name); ok {
				return true
			}
		}
		return false
	}
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if rel != "." && (d.Name() == ".git" || ignored(filepath.ToSlash(rel), d.IsDir())) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		case info.Mode().IsRegular():
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dst, rel), data, info.Mode().Perm())
		}
		return nil // sockets, symlinks: not part of a checkout here
	})
}

// TestCopyTree: the copy made outside a git checkout leaves out what
// .gitignore lists, and keeps the rest with its modes.
func TestCopyTree(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "copy")
	for name, mode := range map[string]os.FileMode{
		".gitignore":          0o644,
		"README.md":           0o644,
		"scripts/setup":       0o755,
		"pgwake":              0o755, // the binary at the root: ignored
		"cmd/pgwake/main.go":  0o644, // a directory of that name: kept
		"bin/pgwake":          0o755,
		"internal/x/x.test":   0o755,
		".git/HEAD":           0o644,
		"examples/pgwake.yml": 0o644,
	} {
		path := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		body := name
		if name == ".gitignore" {
			body = "# build output\n/bin/\n*.test\n/pgwake\n"
		}
		if err := os.WriteFile(path, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := copyTree(src, dst); err != nil {
		t.Fatal(err)
	}
	var got []string
	err := filepath.WalkDir(dst, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dst, path)
			got = append(got, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	want := []string{".gitignore", "README.md", "cmd/pgwake/main.go", "examples/pgwake.yml", "scripts/setup"}
	if !slices.Equal(got, want) {
		t.Errorf("copied %q, want %q", got, want)
	}
	if info, err := os.Stat(filepath.Join(dst, "scripts/setup")); err != nil || info.Mode().Perm() != 0o755 {
		t.Errorf("scripts/setup in the copy: %v, %v; want mode 0755", info, err)
	}
}

// shBlocks returns the ```sh blocks of the README section under the
// level-two heading "## "+heading, up to the next heading, each as its
// lines. It fails the test if the section is missing or holds none.
func shBlocks(t *testing.T, readme []byte, heading string) [][]string {
	t.Helper()
	var (
		blocks         [][]string
		block          []string
		fence, info    string
		inFence        bool
		inSection, has bool
	)
	fenceRE := regexp.MustCompile("^ {0,3}(`{3,}|~{3,})[ \t]*([^ \t`]*)")
	headingRE := regexp.MustCompile(`^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$`)
	sc := bufio.NewScanner(bytes.NewReader(readme))
	for sc.Scan() {
		line := sc.Text()
		if inFence {
			// A closing fence: the opening one's character, at least as
			// many, nothing else.
			if trimmed := strings.TrimSpace(line); strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
				inFence = false
				if inSection && info == "sh" {
					blocks = append(blocks, block)
				}
			} else {
				block = append(block, line)
			}
			continue
		}
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			inFence, fence, info, block = true, m[1], m[2], nil
			continue
		}
		if m := headingRE.FindStringSubmatch(line); m != nil {
			if inSection {
				break // the section ends at the next heading
			}
			inSection = len(m[1]) == 2 && m[2] == heading
			has = has || inSection
		}
	}
	if !has {
		t.Fatalf("README.md has no section %q", "## "+heading)
	}
	if len(blocks) == 0 {
		t.Fatalf("README.md's section %q has no ```sh block", "## "+heading)
	}
	return blocks
}

// readmeFile is README.md of the clone.
func readmeFile(t *testing.T, clone string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(clone, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// readmeEnv is the harness's client environment (no PG* or DATABASE_URL
// of the user's) with the test-built pgwake first on PATH and the proxy
// on a port of its own.
func (h *cliHarness) readmeEnv(t *testing.T) []string {
	t.Helper()
	var env []string
	for _, kv := range h.clientEnv("PGWAKE_LISTEN=127.0.0.1:0") {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	return append(env, "PATH="+filepath.Dir(h.bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// blockStep is one command line of a block and what it did.
type blockStep struct {
	line           string
	stdout, stderr string
	took           time.Duration
	ran, ok        bool
	projects       []admin.Project // ls --json right after a `pgwake up` line
}

// blockRun is one run of a block.
type blockRun struct {
	steps []blockStep
	env   map[string]string // the shell's exported variables at its end
}

// step is the one step whose line starts with prefix.
func (r *blockRun) step(t *testing.T, prefix string) blockStep {
	t.Helper()
	var found []blockStep
	for _, s := range r.steps {
		if strings.HasPrefix(s.line, prefix) {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d lines of the block start with %q, want 1", len(found), prefix)
	}
	return found[0]
}

// runBlock runs lines in dir with `bash -euo pipefail`, as written: one
// shell for the whole block (an eval on one line is seen by the next), each
// command line in a group of its own whose output goes to files, so each
// line's output and time are known. Blank lines and comments stay as they
// are; after a line starting `pgwake up` it records `pgwake ls --json`. It
// fails the test unless every line ran and exited 0.
func (h *cliHarness) runBlock(t *testing.T, dir string, env []string, lines []string) blockRun {
	t.Helper()
	out := t.TempDir()
	var (
		script strings.Builder
		steps  []blockStep
	)
	fmt.Fprintf(&script, "__readme_out=%s\n", shellQuote(out))
	script.WriteString(`__readme_mark() { printf '%s\n' "$EPOCHREALTIME" >"$__readme_out/$1"; }` + "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if trimmed := strings.TrimSpace(line); trimmed == "" || strings.HasPrefix(trimmed, "#") {
			script.WriteString(line + "\n")
			continue
		}
		cmd := line
		for strings.HasSuffix(lines[i], `\`) && i+1 < len(lines) {
			i++
			cmd += "\n" + lines[i]
		}
		n := len(steps)
		steps = append(steps, blockStep{line: cmd})
		fmt.Fprintf(&script, "__readme_mark %d.start\n{\n%s\n} >\"$__readme_out/%d.out\" 2>\"$__readme_out/%d.err\"\n__readme_mark %d.end\n", n, cmd, n, n, n)
		if strings.HasPrefix(cmd, "pgwake up") {
			fmt.Fprintf(&script, "pgwake ls --json >\"$__readme_out/%d.ls\" 2>/dev/null || true\n", n)
		}
	}
	script.WriteString(`env -0 >"$__readme_out/env"` + "\n")
	scriptPath := filepath.Join(out, "block.sh")
	if err := os.WriteFile(scriptPath, []byte(script.String()), 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), readmeBlockTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", scriptPath)
	cmd.Dir, cmd.Env = dir, env
	var shellOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &shellOut, &shellOut
	// Whatever the block started in the foreground goes with it on a
	// timeout (pgwake's daemon detaches: the harness stops it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w after %v (timeout %v)", err, time.Since(start).Round(time.Millisecond), readmeBlockTimeout)
	}
	run := blockRun{steps: steps}

	read := func(name string) (string, bool) {
		data, err := os.ReadFile(filepath.Join(out, name))
		return string(data), err == nil
	}
	stamp := func(name string) (time.Time, bool) {
		s, ok := read(name)
		f, err := strconv.ParseFloat(strings.ReplaceAll(strings.TrimSpace(s), ",", "."), 64)
		if !ok || err != nil {
			return time.Time{}, false
		}
		return time.UnixMicro(int64(f * 1e6)), true
	}
	for n := range steps {
		s := &steps[n]
		begun, ran := stamp(fmt.Sprintf("%d.start", n))
		ended, ok := stamp(fmt.Sprintf("%d.end", n))
		s.ran, s.ok = ran, ok
		s.stdout, _ = read(fmt.Sprintf("%d.out", n))
		s.stderr, _ = read(fmt.Sprintf("%d.err", n))
		switch {
		case ok:
			s.took = ended.Sub(begun)
		case ran:
			s.took = time.Since(begun)
		}
		if ls, ok := read(fmt.Sprintf("%d.ls", n)); ok {
			if err := json.Unmarshal([]byte(ls), &s.projects); err != nil {
				t.Errorf("pgwake ls --json after %q: %v\n%s", s.line, err, ls)
			}
		}
		if ran {
			result := "exit 0"
			if !ok {
				result = "FAILED"
			}
			t.Logf("$ %s  # %s in %v\n%s%s", s.line, result, s.took.Round(time.Millisecond), s.stdout, s.stderr)
		}
	}
	if envs, ok := read("env"); ok {
		run.env = map[string]string{}
		for kv := range strings.SplitSeq(strings.TrimSuffix(envs, "\x00"), "\x00") {
			k, v, _ := strings.Cut(kv, "=")
			run.env[k] = v
		}
	}
	t.Logf("block of %d command lines in %v", len(steps), time.Since(start).Round(time.Millisecond))
	if err != nil || run.env == nil {
		for _, s := range steps {
			if !s.ok {
				t.Fatalf("README line %q did not exit 0 (bash: %v)\nstdout: %s\nstderr: %s\nshell: %s",
					s.line, err, s.stdout, s.stderr, shellOut.String())
			}
		}
		t.Fatalf("the block failed: %v\n%s", err, shellOut.String())
	}
	return run
}

// wantOneRow checks that a step's stdout is psql's table of one row.
func wantOneRow(t *testing.T, s blockStep) {
	t.Helper()
	if !strings.Contains(s.stdout, "(1 row)") {
		t.Errorf("%q printed %q, want psql's one row", s.line, s.stdout)
	}
}

// wantListed checks that a table pgwake printed has a row for project.
func wantListed(t *testing.T, s blockStep, project string) {
	t.Helper()
	for line := range strings.Lines(s.stdout) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == project {
			return
		}
	}
	t.Errorf("%q printed no row for %s:\n%s", s.line, project, s.stdout)
}

// TestIntegrationREADMETour: the set-up's main job starts pgwake in the
// background with `pgwake` on PATH, and the 60-second tour then runs as
// written, its first `pgwake up -d --wait` a no-op.
func TestIntegrationREADMETour(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	clone := freshClone(t)
	readme := readmeFile(t, clone)
	env := h.readmeEnv(t)

	setup := shBlocks(t, readme, "Set-up")
	if len(setup) != 2 || len(setup[0]) != 1 || len(setup[1]) != 1 {
		t.Fatalf("Set-up: %q; want two one-line blocks, the main job and the test command", setup)
	}
	if setup[1][0] != readmeTestCommand {
		t.Errorf("the test command is %q, want %q", setup[1][0], readmeTestCommand)
	}
	if ci, err := os.ReadFile(filepath.Join(clone, ".ci", "run")); err != nil || !slices.Contains(strings.Split(string(ci), "\n"), setup[1][0]) {
		t.Errorf(".ci/run (%v) does not run the README's test command %q", err, setup[1][0])
	}
	// The main job: scripts/setup (root, apt-get) and the build into
	// /usr/local/bin are the machine's, not this test's; its pgwake
	// commands run as written, with the test's build on PATH.
	job := strings.Split(setup[0][0], " && ")
	build := regexp.MustCompile(`^go build -o (\S+)/pgwake \./cmd/pgwake$`)
	if len(job) < 3 || job[0] != "./scripts/setup" || !build.MatchString(job[1]) {
		t.Fatalf("main job %q; want ./scripts/setup && go build -o DIR/pgwake ./cmd/pgwake && pgwake ...", setup[0][0])
	}
	// Debian's PATH for root (/etc/profile, sudo's secure_path).
	if dir := build.FindStringSubmatch(job[1])[1]; !slices.Contains([]string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin"}, dir) {
		t.Errorf("the main job builds pgwake into %s, which is not on root's PATH on Debian", dir)
	}
	for _, c := range job[2:] {
		if !strings.HasPrefix(c, "pgwake ") {
			t.Fatalf("main job command %q: want pgwake commands after the build", c)
		}
	}
	started := h.runBlock(t, clone, env, job[2:])
	if s := started.step(t, "pgwake up"); !strings.Contains(s.stderr, "pgwake started in the background") {
		t.Errorf("the main job's %q: stderr %q, want pgwake started in the background", s.line, s.stderr)
	}
	if info, err := h.admin().Info(t.Context()); err != nil {
		t.Fatalf("after the main job pgwake does not answer: %v", err)
	} else {
		h.pids = append(h.pids, info.PID)
	}

	tour := shBlocks(t, readme, "60-second tour")
	if len(tour) != 1 {
		t.Fatalf("the tour has %d sh blocks, want 1", len(tour))
	}
	run := h.runBlock(t, clone, env, tour[0])
	if s := run.step(t, "pgwake up"); !strings.Contains(s.stderr, "already running with this configuration") {
		t.Errorf("the tour's %q after the main job: stderr %q, want a no-op (already running with this configuration)", s.line, s.stderr)
	}
	wantOneRow(t, run.step(t, `psql "$(pgwake url myapp)"`))
	wantListed(t, run.step(t, "pgwake ls"), "myapp")
	wantListed(t, run.step(t, "pgwake status"), "myapp")
	if s := run.step(t, "pgwake sleep myapp"); s.stderr != "myapp is sleeping\n" {
		t.Errorf("%q: stderr %q, want myapp is sleeping", s.line, s.stderr)
	}
	wantOneRow(t, run.step(t, "pgwake psql myapp"))
	if s := run.step(t, "pgwake logs myapp"); !strings.Contains(s.stdout, "database system is ready to accept connections") {
		t.Errorf("%q printed no ready line of Postgres:\n%s", s.line, s.stdout)
	}
	if s := run.step(t, "pgwake down"); !strings.Contains(s.stderr, "pgwake stopped") {
		t.Errorf("%q: stderr %q, want pgwake stopped", s.line, s.stderr)
	}

	// What the tour says it left: myapp asleep with its data, cache
	// removed but its volume kept, pgwake stopped.
	if r := h.fail(t, "ls"); !strings.Contains(r.stderr, "pgwake is not running") {
		t.Errorf("ls after the tour: stderr %q, want not running", r.stderr)
	}
	if c := h.mustContainer(t, "myapp"); c.State.Running || c.State.ExitCode != 0 {
		t.Errorf("after the tour myapp's container is %s (exit %d), want stopped cleanly", c.State.Status, c.State.ExitCode)
	}
	if _, ok := h.container(t, "cache"); ok {
		t.Error("cache's container outlived pgwake rm cache")
	}
	if h.volume(t, "cache") == "" {
		t.Error("pgwake rm cache deleted its data volume; the tour says it is kept")
	}
}

// TestIntegrationREADMECI: the README's CI block runs as written twice in
// a row in the same fresh clone with examples/pgwake.yaml as ./pgwake.yaml:
// up -d --wait returns with the declared projects there, the exported
// DATABASE_URL reaches app, and down --volumes leaves nothing labelled with
// the instance.
func TestIntegrationREADMECI(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	clone := freshClone(t)
	blocks := shBlocks(t, readmeFile(t, clone), "CI")
	if len(blocks) != 1 {
		t.Fatalf("the CI section has %d sh blocks, want 1", len(blocks))
	}
	example, err := os.ReadFile(filepath.Join(clone, "examples", "pgwake.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(clone, "pgwake.yaml"), example, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(config.Sources{File: filepath.Join(clone, "pgwake.yaml")})
	if err != nil {
		t.Fatalf("examples/pgwake.yaml: %v", err)
	}
	if len(cfg.Projects) == 0 {
		t.Fatal("examples/pgwake.yaml declares no projects")
	}
	env := h.readmeEnv(t)
	low, high, err := h.portRange()
	if err != nil {
		t.Fatal(err)
	}

	instance := ""
	for i := 1; i <= 2; i++ {
		t.Logf("run %d of the CI block", i)
		run := h.runBlock(t, clone, env, blocks[0])
		up := run.step(t, "pgwake up")
		var names []string
		for _, p := range up.projects {
			names = append(names, p.Name)
		}
		t.Logf("run %d: projects after %q: %v", i, up.line, names)
		for _, pc := range cfg.Projects {
			j := slices.IndexFunc(up.projects, func(p admin.Project) bool { return p.Name == pc.Name })
			if j < 0 {
				t.Errorf("run %d: after %q, declared project %s does not exist: %+v", i, up.line, pc.Name, up.projects)
				continue
			}
			p := up.projects[j]
			if pc.SleepMode != "" && p.SleepMode != pc.SleepMode || pc.SleepAfter != nil && p.SleepAfterMS != pc.SleepAfter.Milliseconds() || p.Ephemeral != pc.Ephemeral {
				t.Errorf("run %d: %s is %s after %d ms, ephemeral %v; examples/pgwake.yaml declares %+v",
					i, p.Name, p.SleepMode, p.SleepAfterMS, p.Ephemeral, pc)
			}
		}

		// What the block exported reaches app on its own port.
		u, err := url.Parse(run.env["DATABASE_URL"])
		if err != nil || u.Path != "/app" {
			t.Fatalf("run %d: exported DATABASE_URL %q (%v), want app's", i, run.env["DATABASE_URL"], err)
		}
		if port, err := strconv.Atoi(u.Port()); err != nil || port < low || port > high || run.env["PGPORT"] != u.Port() {
			t.Errorf("run %d: DATABASE_URL on port %q, PGPORT %q; want app's own port in %d-%d", i, u.Port(), run.env["PGPORT"], low, high)
		}
		for _, k := range []string{"PGHOST", "PGUSER", "PGPASSWORD", "PGDATABASE"} {
			if run.env[k] == "" {
				t.Errorf("run %d: the block did not export %s", i, k)
			}
		}
		wantOneRow(t, run.step(t, `psql "$DATABASE_URL"`))
		if dotenv, err := os.ReadFile(filepath.Join(clone, ".env")); err != nil || !strings.Contains(string(dotenv), "DATABASE_URL=\""+run.env["DATABASE_URL"]+"\"\n") {
			t.Errorf("run %d: .env (%v) lacks the DATABASE_URL the block exported:\n%s", i, err, dotenv)
		}
		if s := run.step(t, "pgwake down --volumes"); !strings.Contains(s.stderr, "pgwake stopped") {
			t.Errorf("run %d: %q: stderr %q, want pgwake stopped", i, s.line, s.stderr)
		}

		// Nothing left: no daemon, no container or volume of the instance.
		if r := h.fail(t, "ls"); !strings.Contains(r.stderr, "pgwake is not running") {
			t.Errorf("run %d: ls after the block: stderr %q, want not running", i, r.stderr)
		}
		inst := h.instanceOrEmpty()
		if inst == "" {
			t.Fatalf("run %d: no instance in state.json after the block", i)
		}
		if instance != "" && inst != instance {
			t.Logf("run %d: instance %s, was %s", i, inst, instance)
		}
		instance = inst
		if containers, volumes := h.instanceObjects(t); containers != 0 || volumes != 0 {
			t.Errorf("run %d: %d containers and %d volumes of instance %s after down --volumes, want none", i, containers, volumes, inst)
		}
	}
}

// TestIntegrationREADMEBranchPerJob: the README's "seed once, branch per
// job" block runs as written in a fresh clone: the branch has seed's rows
// and its own, a reset puts back exactly the snapshot's, and down
// --volumes leaves nothing of the instance (snapshots included).
func TestIntegrationREADMEBranchPerJob(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	clone := freshClone(t)
	blocks := shBlocks(t, readmeFile(t, clone), "Seed once, branch per job")
	if len(blocks) != 1 {
		t.Fatalf("the section has %d sh blocks, want 1", len(blocks))
	}
	run := h.runBlock(t, clone, h.readmeEnv(t), blocks[0])
	if s := run.step(t, "pgwake snapshot seed"); strings.TrimSpace(s.stdout) != "seeded" {
		t.Errorf("%q printed %q, want the label", s.line, s.stdout)
	}
	if s := run.step(t, "pgwake branch"); !strings.Contains(s.stderr, "a copy of seed's") {
		t.Errorf("%q said %q, want that it is a copy of seed's", s.line, s.stderr)
	}
	if s := run.step(t, `psql "$(pgwake url job1)"`); !strings.Contains(s.stdout, "DELETE 1000") {
		t.Errorf("the branch had other rows than seed's: %q printed %q", s.line, s.stdout)
	}
	if s := run.step(t, `psql "$(pgwake url seed)" -tAc`); strings.TrimSpace(s.stdout) != "1000" {
		t.Errorf("after the reset %q printed %q, want 1000", s.line, s.stdout)
	}
	if s := run.step(t, "pgwake reset"); !strings.Contains(s.stderr, "reset to snapshot seeded") {
		t.Errorf("%q said %q", s.line, s.stderr)
	}
	s := run.step(t, "pgwake snapshots")
	wantListed(t, s, "seeded")
	if !strings.Contains(s.stdout, "MB") {
		t.Errorf("%q shows no size:\n%s", s.line, s.stdout)
	}
	if s := run.step(t, "pgwake ls"); !strings.Contains(s.stdout, "branch of seed") {
		t.Errorf("%q does not show job1's parent:\n%s", s.line, s.stdout)
	}
	if containers, volumes := h.instanceObjects(t); containers != 0 || volumes != 0 {
		t.Errorf("%d containers and %d volumes of the instance after down --volumes, want none", containers, volumes)
	}
}
