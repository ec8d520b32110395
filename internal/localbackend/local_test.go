package localbackend

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestIsPostmasterCmdline(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	cmdline := func(args ...string) []byte { return []byte(strings.Join(args, "\x00") + "\x00") }
	tests := []struct {
		name string
		raw  []byte
		want bool
	}{
		{"pgwake's own", cmdline("/usr/lib/postgresql/15/bin/postgres", "-D", data, "-p", "5432", "-k", "/run"), true},
		{"joined -D", cmdline("postgres", "-D"+data), true},
		{"postmaster name", cmdline("/usr/bin/postmaster", "-D", data), true},
		{"same dir, unclean path", cmdline("postgres", "-D", data+"/"), true},
		{"no -D (a container's, PGDATA)", cmdline("postgres", "-p", "5432"), false},
		{"relative -D", cmdline("postgres", "-D", "data"), false},
		{"another cluster", cmdline("/usr/lib/postgresql/15/bin/postgres", "-D", "/var/lib/postgresql/15/main"), false},
		{"last -D wins", cmdline("postgres", "-D", data, "-D", "/elsewhere"), false},
		{"a backend's title", []byte("postgres: 15/main: checkpointer   "), false},
		{"an unrelated process", cmdline("sleep", "3600"), false},
		{"a zombie", nil, false},
		{"a suffix is not a name", cmdline("/usr/bin/notpostgres", "-D", data), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := isPostmasterCmdline(tt.raw, data); got != tt.want {
				t.Errorf("isPostmasterCmdline(%q) = %v, want %v", tt.raw, got, tt.want)
			}
		})
	}
}

func TestReadPidFile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		content string
		want    pidFile
		ok      bool
	}{
		{"running", "4242\n/srv/data\n1796113659\n5999\n/srv/run\n127.0.0.1\n  9978018     65561\nready   \n",
			pidFile{pid: 4242, dataDir: "/srv/data", start: "1796113659", port: 5999, listen: "127.0.0.1", status: "ready"}, true},
		{"socket only", "4242\n/srv/data\n1796113659\n5999\n/srv/run\n\n  9978018     65561\nready   \n",
			pidFile{pid: 4242, dataDir: "/srv/data", start: "1796113659", port: 5999, status: "ready"}, true},
		{"socket dir, not yet listening", "4242\n/srv/data\n1796113659\n5999\n/srv/run\n",
			pidFile{pid: 4242, dataDir: "/srv/data", start: "1796113659", port: 5999}, true},
		{"first lines only", "4242\n/srv/data\n1796113659\n5999\n",
			pidFile{pid: 4242, dataDir: "/srv/data", start: "1796113659", port: 5999}, true},
		{"being written", "4242\n/srv/data\n17961", pidFile{}, false},
		{"empty", "", pidFile{}, false},
		{"single-user backend", "-4242\n/srv/data\n1796113659\n0\n", pidFile{}, false},
		{"garbage", "x\ny\nz\nw\n", pidFile{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := readPidFile(dir)
			if (err == nil) != tt.ok || got != tt.want {
				t.Fatalf("readPidFile = %+v, %v; want %+v, ok %v", got, err, tt.want, tt.ok)
			}
			if tt.ok && got.id() != "4242@1796113659" {
				t.Errorf("id = %q", got.id())
			}
			if want := tt.want.listen != ""; got.listening() != want {
				t.Errorf("listening = %v, want %v", got.listening(), want)
			}
			if want := tt.name == "socket only"; got.socketOnly() != want {
				t.Errorf("socketOnly = %v, want %v", got.socketOnly(), want)
			}
		})
	}
}

func TestLogTail(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", logTailBytes)
	tests := []struct {
		name    string
		content string
		from    int64
		want    string
	}{
		{"last lines", "a\nb\n\nc\nd\ne\nf\n", 0, "b; c; d; e; f"},
		{"no final newline", "a\nb", 0, "a; b"},
		{"from an offset", "old FATAL\nnew 1\nnew 2\n", int64(len("old FATAL\n")), "new 1; new 2"},
		{"nothing new", "old\n", 4, ""},
		{"truncated since", "x\n", 100, "x"},
		{"only the end of a long log", long + "\nend 1\nend 2\n", 0, "end 1; end 2"},
		{"a cut line is dropped", "cut" + long + "\nend\n", 0, "end"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "postgres.log")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if got := logTail(path, tt.from, exitLogLines); got != tt.want {
				t.Errorf("logTail = %q, want %q", got, tt.want)
			}
		})
	}
	if got := logTail(filepath.Join(t.TempDir(), "missing"), 0, 5); got != "" {
		t.Errorf("logTail of a missing file = %q", got)
	}
}
