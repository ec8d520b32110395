package main

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgwake/pgwake/internal/admin"
)

// TestIntegrationProjectPorts: every project gets a port of its own from
// port_range, kept across restarts, on which every database of its
// server is reachable; a port another program holds at start costs only
// that project its own port (it is served on the shared port as
// USER.PROJECT, and says so), never the daemon.
func TestIntegrationProjectPorts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	info, _ := h.up(t)
	h.ok(t, "create", "alpha")
	h.ok(t, "create", "beta")
	alpha, beta := h.mustProject(t, "alpha"), h.mustProject(t, "beta")
	low, high, err := h.portRange()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []admin.Project{alpha, beta} {
		if p.Port < low || p.Port > high || p.PortError != "" {
			t.Fatalf("%s: port %d (%q), want one in %d-%d", p.Name, p.Port, p.PortError, low, high)
		}
	}
	if alpha.Port == beta.Port {
		t.Fatalf("both projects got port %d", alpha.Port)
	}
	url := strings.TrimSpace(h.ok(t, "url", "alpha"))
	if !strings.Contains(url, "@127.0.0.1:"+strconv.Itoa(alpha.Port)+"/alpha?") {
		t.Fatalf("url %q is not on alpha's port %d", url, alpha.Port)
	}
	_, shared, _ := net.SplitHostPort(info.Listen)
	if !strings.Contains(alpha.SharedURL, "//postgres.alpha:") || !strings.Contains(alpha.SharedURL, ":"+shared+"/alpha?") {
		t.Errorf("shared url %q, want user postgres.alpha on port %s", alpha.SharedURL, shared)
	}

	// On the project's port the database name is the client's: a database
	// the client creates is reachable by its own name.
	conn := h.connectURL(t, url)
	if _, err := conn.Exec(t.Context(), "create database scratch"); err != nil {
		t.Fatal(err)
	}
	conn.Close(t.Context())
	other := h.connectURL(t, withDatabase(t, url, "scratch"))
	wantDatabase(t, other, "scratch")
	other.Close(t.Context())

	// Restart with beta's port held by another program.
	h.ok(t, "down")
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(beta.Port))
	if err != nil {
		t.Fatalf("hold beta's port: %v", err)
	}
	defer ln.Close()
	h.up(t)
	if got := h.mustProject(t, "alpha"); got.Port != alpha.Port || got.PortError != "" {
		t.Errorf("after a restart alpha has port %d (%q), want %d again", got.Port, got.PortError, alpha.Port)
	}
	got := h.mustProject(t, "beta")
	if got.Port != beta.Port || !strings.Contains(got.PortError, "in use by another program") {
		t.Errorf("beta: port %d, error %q; want %d named as in use", got.Port, got.PortError, beta.Port)
	}
	if !strings.Contains(h.ok(t, "ls"), strconv.Itoa(beta.Port)+" (busy)") {
		t.Errorf("ls does not show beta's port as busy")
	}
	burl := strings.TrimSpace(h.ok(t, "url", "beta"))
	if burl != got.SharedURL {
		t.Errorf("url beta %q, want the shared port's %q while its own is taken", burl, got.SharedURL)
	}
	c := h.connectURL(t, burl)
	wantDatabase(t, c, "beta")
	c.Close(t.Context())

	// A project asked to have no port of its own is on the shared port.
	h.ok(t, "create", "gamma", "--no-port")
	np := h.mustProject(t, "gamma")
	if np.Port != 0 || np.URL != np.SharedURL || strings.TrimSpace(h.ok(t, "url", "gamma")) != np.SharedURL {
		t.Errorf("gamma: port %d url %q, want none and the shared url", np.Port, np.URL)
	}
	if r := h.fail(t, "create", "eps", "--no-port", "--port", "20001"); r.code != 2 {
		t.Errorf("--port with --no-port: exit %d, want 2", r.code)
	}
	// An explicit port another project holds is refused, naming it.
	r := h.fail(t, "create", "delta", "--port", strconv.Itoa(alpha.Port))
	if !strings.Contains(r.stderr, strconv.Itoa(alpha.Port)) {
		t.Errorf("create on a taken port: %q, want the port named", r.stderr)
	}
}

// TestIntegrationPortRangeExhausted: a create that finds no free port in
// port_range fails with what to do, and leaves nothing behind.
func TestIntegrationPortRangeExhausted(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	low, _, err := h.portRange()
	if err != nil {
		t.Fatal(err)
	}
	one := strconv.Itoa(low)
	h.env = append(h.env, "PGWAKE_PORT_RANGE="+one+"-"+one) // the last value wins
	h.up(t)
	h.ok(t, "create", "first")
	r := h.fail(t, "create", "second")
	if !strings.Contains(r.stderr, "no free port in port_range "+one+"-"+one) || !strings.Contains(r.stderr, "--no-port") {
		t.Errorf("stderr %q, want the exhausted range and the ways out", r.stderr)
	}
	if _, ok := h.project(t, "second"); ok {
		t.Errorf("a failed create left its project")
	}
	if containers, volumes := h.instanceObjects(t); containers != 1 || volumes != 1 {
		t.Errorf("%d containers and %d volumes, want only the first project's", containers, volumes)
	}
}

func (h *cliHarness) connectURL(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), u)
	if err != nil {
		t.Fatalf("connect %s: %v", u, err)
	}
	return conn
}

func passwordOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	return pw
}

func withDatabase(t *testing.T, raw, db string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	return u.String()
}

func wantDatabase(t *testing.T, conn *pgx.Conn, want string) {
	t.Helper()
	var db string
	if err := conn.QueryRow(t.Context(), "select current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	if db != want {
		t.Fatalf("current_database %q, want %q", db, want)
	}
}
