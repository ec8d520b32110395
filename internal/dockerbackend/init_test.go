package dockerbackend

import (
	"slices"
	"testing"
)

func TestErrorLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		in, want []string
	}{
		{"psql error", []string{
			"CREATE TABLE",
			`2026-12-02 13:45:56.033 UTC [46] ERROR:  relation "nope" does not exist at character 13`,
			"2026-12-02 13:45:56.033 UTC [46] STATEMENT:  INSERT INTO nope VALUES (1);",
			`psql:bad.sql:2: ERROR:  relation "nope" does not exist`,
			"LINE 1: INSERT INTO nope VALUES (1);",
			"^",
		}, []string{`psql:bad.sql:2: ERROR:  relation "nope" does not exist`, "LINE 1: INSERT INTO nope VALUES (1);", "^"}},
		{"a script's own output", []string{"seeding", "curl: (6) Could not resolve host: nowhere"},
			[]string{"seeding", "curl: (6) Could not resolve host: nowhere"}},
		{"only the server's log", []string{"x", "2026-12-02 13:45:56.033 UTC [46] FATAL:  terminating"},
			[]string{"2026-12-02 13:45:56.033 UTC [46] FATAL:  terminating"}},
	} {
		if got := errorLines(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("%s: errorLines = %q, want %q", tc.name, got, tc.want)
		}
	}
}
