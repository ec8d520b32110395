package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"syscall"

	"github.com/pgwake/pgwake/internal/certs"
	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/state"
)

// Every project has a port of its own (port routing) unless it asked for
// none: on it every database of the project's server is reachable and the
// database name passes through, which is what frameworks' test runners,
// createdb and Prisma's shadow database need. The port is chosen from
// port_range at create and stored with the project, so it stays the same
// across restarts. A port that another program holds when pgwake starts
// costs that project its own port (it stays reachable on the shared port
// as USER.PROJECT), never the daemon.

// listenPort opens a project's own port on the proxy's listen host.
func (d *Daemon) listenPort(name string, port int) (net.Listener, error) {
	host, _, _ := net.SplitHostPort(d.cfg.Listen)
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("listen on port %d for project %q: %w", port, name, err)
	}
	return ln, nil
}

// claimPort opens the port a new project p asked for, or, when it asked
// for none in particular, the first free one in port_range (free: not
// stored with another project and not held by another program), and sets
// p.Port to it. It returns nil for a project without a port of its own.
func (d *Daemon) claimPort(p *state.Project) (net.Listener, error) {
	if p.NoPort {
		return nil, nil
	}
	if p.Port != 0 {
		// Its owner may not hold it right now (busy at start-up, or being
		// removed): it is still that project's.
		for _, q := range d.store.Projects() {
			if q.Port == p.Port {
				return nil, fmt.Errorf("port %d belongs to project %q", p.Port, q.Name)
			}
		}
		return d.listenPort(p.Name, p.Port)
	}
	low, high, err := d.cfg.Ports()
	if err != nil {
		return nil, err
	}
	stored := map[int]bool{}
	for _, q := range d.store.Projects() {
		stored[q.Port] = true
	}
	busy := 0
	for port := low; port <= high; port++ {
		if stored[port] {
			continue
		}
		// A port another create is claiming right now is open already,
		// so the two never get the same one.
		ln, err := d.listenPort(p.Name, port)
		if err != nil {
			busy++
			continue
		}
		p.Port = port
		return ln, nil
	}
	return nil, fmt.Errorf("no free port in port_range %d-%d for project %q (%d held by projects, %d by other programs): widen port_range, pass --port, or --no-port for the shared port only",
		low, high, p.Name, len(stored), busy)
}

// openProjectPorts opens every stored project's port at start-up, first
// giving one to projects from state files that predate ports.
func (d *Daemon) openProjectPorts() {
	for _, p := range d.store.Projects() {
		if p.Port == 0 && !p.NoPort {
			ln, err := d.claimPort(&p)
			if err == nil {
				err = d.store.Update(p.Name, func(q *state.Project) { q.Port = p.Port })
			}
			if err != nil {
				if ln != nil {
					ln.Close()
				}
				d.log.Warn("project has no port of its own; it is reachable on the shared port", "project", p.Name, "err", err)
				continue
			}
			d.addProjectPort(p.Name, ln)
			continue
		}
		d.openProjectPort(p)
	}
}

// openProjectPort opens p's stored port, recording why it cannot be
// opened: the project is then reached on the shared port.
func (d *Daemon) openProjectPort(p state.Project) {
	if p.Port == 0 {
		return
	}
	ln, err := d.listenPort(p.Name, p.Port)
	if err != nil {
		msg := err.Error()
		if errors.Is(err, syscall.EADDRINUSE) {
			msg = fmt.Sprintf("port %d is in use by another program; project %q is reachable on the shared port as user %s.%s until pgwake restarts with the port free",
				p.Port, p.Name, p.User, p.Name)
		}
		d.log.Error("project port", "project", p.Name, "port", p.Port, "err", msg)
		d.portMu.Lock()
		if d.portErrs == nil {
			d.portErrs = map[string]string{}
		}
		d.portErrs[p.Name] = msg
		d.portMu.Unlock()
		return
	}
	d.addProjectPort(p.Name, ln)
}

// addProjectPort records a project's listener and, once Serve runs,
// accepts on it.
func (d *Daemon) addProjectPort(name string, ln net.Listener) {
	d.portMu.Lock()
	if d.portLns == nil {
		d.portLns = map[string]net.Listener{}
	}
	d.portLns[name] = ln
	delete(d.portErrs, name)
	accepting := d.accepting
	d.portMu.Unlock()
	if accepting {
		go d.srv.ServeProject(d.serveCtx, ln, name)
	}
	d.log.Info("project port", "project", name, "listen", ln.Addr().String())
}

func (d *Daemon) closeProjectPort(name string) {
	d.portMu.Lock()
	ln := d.portLns[name]
	delete(d.portLns, name)
	delete(d.portErrs, name)
	d.portMu.Unlock()
	if ln != nil {
		ln.Close()
	}
}

func (d *Daemon) closeProjectPorts() {
	d.portMu.Lock()
	lns := d.portLns
	d.portLns = nil
	d.portMu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
}

// portOf is p's own port and, if it is not open, why.
func (d *Daemon) portOf(p state.Project) (port int, why string) {
	d.portMu.Lock()
	defer d.portMu.Unlock()
	return p.Port, d.portErrs[p.Name]
}

// portOpen reports whether p's own port is being served.
func (d *Daemon) portOpen(p state.Project) bool {
	d.portMu.Lock()
	defer d.portMu.Unlock()
	return p.Port != 0 && d.portLns[p.Name] != nil
}

// checkPort refuses a project port below 1024 or outside port_range,
// unless the request asks for it.
func (d *Daemon) checkPort(port int, outsideRange bool) error {
	if port < 0 || port > 65535 {
		return fmt.Errorf("port %d is out of range", port)
	}
	if port == 0 || outsideRange {
		return nil
	}
	if port < config.MinPortRange {
		return fmt.Errorf("port %d is a system port (below %d); pass --port-outside-range to use it anyway", port, config.MinPortRange)
	}
	if low, high, err := d.cfg.Ports(); err == nil && (port < low || port > high) {
		return fmt.Errorf("port %d is outside port_range %d-%d; pass --port-outside-range to use it anyway, or change port_range", port, low, high)
	}
	return nil
}

// URL is the connection string `pgwake url` and `pgwake env` print: the
// project's own port, where every database passes through, or, while it
// has none open, the shared port as USER.PROJECT, where the database
// passes through too.
func (d *Daemon) URL(p state.Project) string {
	if !d.portOpen(p) {
		return d.sharedURL(p)
	}
	return d.url(p.User, p.Port, p)
}

// sharedURL is p's connection string on the shared port.
func (d *Daemon) sharedURL(p state.Project) string {
	return d.url(p.User+"."+p.Name, 0, p)
}

func (d *Daemon) url(user string, port int, p state.Project) string {
	host, shared, _ := net.SplitHostPort(d.ln.Addr().String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	if port == 0 {
		port, _ = strconv.Atoi(shared)
	}
	q := url.Values{"sslmode": {"disable"}}
	switch {
	case d.tls != nil && d.cfg.TLS.Cert == "":
		q = url.Values{"sslmode": {"verify-full"}, "sslrootcert": {certs.CAPath(d.cfg.StateDir)}}
	case d.tls != nil:
		q = url.Values{"sslmode": {"require"}}
	}
	creds := url.UserPassword(user, p.Password)
	if p.Password == "" {
		// Pass-through auth (an adopted server): clients bring their own.
		creds = url.User(user)
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     creds,
		Host:     net.JoinHostPort(host, strconv.Itoa(port)),
		Path:     "/" + p.Database,
		RawQuery: q.Encode(),
	}
	return u.String()
}
