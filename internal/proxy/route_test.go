package proxy

import (
	"maps"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgwake/pgwake/internal/backend"
)

// TestRoute checks which project each startup message reaches and what
// the server is then sent. Routing is pure logic over the registered
// projects; the integration suites check the same on real servers.
func TestRoute(t *testing.T) {
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"myapp", "other"} {
		s.projects[name] = newProject(Project{Spec: backend.Spec{Name: name, User: "postgres", Database: name + "_db"}}, s.env)
	}
	type params = map[string]string
	tests := []struct {
		name       string
		fixed, sni string
		in         params
		project    string // "" for none
		key        string
		out        params
	}{
		{name: "database name routes and is rewritten",
			in: params{"user": "postgres", "database": "myapp"}, project: "myapp",
			out: params{"user": "postgres", "database": "myapp_db"}},
		{name: "database defaults to the user name",
			in: params{"user": "myapp"}, project: "myapp",
			out: params{"user": "myapp", "database": "myapp_db"}},
		{name: "USER.PROJECT routes, database passes through",
			in: params{"user": "postgres.myapp", "database": "test_myapp"}, project: "myapp",
			out: params{"user": "postgres", "database": "test_myapp"}},
		{name: "USER.PROJECT with a database named like another project",
			in: params{"user": "postgres.myapp", "database": "other"}, project: "myapp",
			out: params{"user": "postgres", "database": "other"}},
		{name: "USER.PROJECT with libpq's default database (the full user name)",
			in: params{"user": "postgres.myapp", "database": "postgres.myapp"}, project: "myapp",
			out: params{"user": "postgres", "database": "postgres"}},
		{name: "USER.PROJECT without a database",
			in: params{"user": "postgres.myapp"}, project: "myapp",
			out: params{"user": "postgres", "database": "postgres"}},
		{name: "a dotted user whose suffix is no project falls back to the database",
			in: params{"user": "john.smith", "database": "other"}, project: "other",
			out: params{"user": "john.smith", "database": "other_db"}},
		{name: "a user with a dot in its own name",
			in: params{"user": "app.reader.myapp", "database": "x"}, project: "myapp",
			out: params{"user": "app.reader", "database": "x"}},
		{name: "unknown project by user",
			in: params{"user": "postgres.nope", "database": "postgres"}, key: "nope"},
		{name: "unknown project by database",
			in: params{"user": "postgres", "database": "nope"}, key: "nope"},
		{name: "trailing dot is not the user form",
			in: params{"user": "postgres.", "database": "nope"}, key: "nope"},
		{name: "project port: everything passes through",
			fixed: "myapp", in: params{"user": "postgres", "database": "other"}, project: "myapp",
			out: params{"user": "postgres", "database": "other"}},
		{name: "project port: its own name is not rewritten",
			fixed: "myapp", in: params{"user": "postgres", "database": "myapp"}, project: "myapp",
			out: params{"user": "postgres", "database": "myapp"}},
		{name: "project port: USER.PROJECT of this project is stripped",
			fixed: "myapp", in: params{"user": "postgres.myapp", "database": "test_x"}, project: "myapp",
			out: params{"user": "postgres", "database": "test_x"}},
		{name: "project port: USER.PROJECT of another project passes through",
			fixed: "myapp", in: params{"user": "postgres.other", "database": "x"}, project: "myapp",
			out: params{"user": "postgres.other", "database": "x"}},
		{name: "SNI routes, database passes through",
			sni: "myapp.localhost", in: params{"user": "postgres", "database": "postgres"}, project: "myapp",
			out: params{"user": "postgres", "database": "postgres"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clientConn{srv: s, fixed: tt.fixed, serverName: tt.sni}
			m := &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: maps.Clone(tt.in)}
			p, key := c.route(m)
			switch {
			case tt.project == "" && p != nil:
				t.Fatalf("routed to %q, want none", p.name)
			case tt.project == "":
				if key != tt.key {
					t.Fatalf("key %q, want %q", key, tt.key)
				}
				return
			case p == nil:
				t.Fatalf("not routed (key %q), want %q", key, tt.project)
			case p.name != tt.project:
				t.Fatalf("routed to %q, want %q", p.name, tt.project)
			}
			if !maps.Equal(m.Parameters, tt.out) {
				t.Fatalf("server gets %v, want %v", m.Parameters, tt.out)
			}
		})
	}
}
