package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgwake/pgwake/internal/admin"
)

func newEnvCommand(d *deps) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "env NAME",
		Short: "Print DATABASE_URL and PG* variables for a project",
		Long: `Print DATABASE_URL, PGHOST, PGPORT, PGUSER, PGPASSWORD and PGDATABASE for a
project, through the proxy, in a form your shell or CI takes directly:

  eval "$(pgwake env app)"                      # shell (default)
  pgwake env app --format github >> "$GITHUB_ENV" # GitHub Actions
  pgwake env app --format dotenv > .env          # dotenv files
  pgwake env app --format json`,
		Args: exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			vars, err := envFor(cmd, d, args[0])
			if err != nil {
				return err
			}
			return writeEnv(d.stdout, format, vars)
		},
	}
	cmd.Flags().StringVar(&format, "format", "shell", "shell, github, dotenv or json")
	return cmd
}

type envVar struct{ name, value string }

func envFor(cmd *cobra.Command, d *deps, name string) ([]envVar, error) {
	p, err := d.client().Project(cmd.Context(), name)
	if err != nil {
		return nil, err
	}
	return projectEnv(p)
}

func projectEnv(p admin.Project) ([]envVar, error) {
	u, err := url.Parse(p.URL)
	if err != nil {
		return nil, fmt.Errorf("project URL: %w", err)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return nil, fmt.Errorf("project URL: %w", err)
	}
	pw, _ := u.User.Password()
	return []envVar{
		{"DATABASE_URL", p.URL},
		{"PGHOST", host},
		{"PGPORT", port},
		{"PGUSER", u.User.Username()},
		{"PGPASSWORD", pw},
		{"PGDATABASE", strings.TrimPrefix(u.Path, "/")},
	}, nil
}

func writeEnv(w io.Writer, format string, vars []envVar) error {
	var b strings.Builder
	switch format {
	case "shell":
		for _, v := range vars {
			fmt.Fprintf(&b, "export %s=%s\n", v.name, shellQuote(v.value))
		}
	case "github":
		// $GITHUB_ENV takes NAME=value lines; a value with a newline
		// would need the heredoc form, and none of these can have one.
		for _, v := range vars {
			if strings.ContainsAny(v.value, "\r\n") {
				return fmt.Errorf("%s contains a newline", v.name)
			}
			fmt.Fprintf(&b, "%s=%s\n", v.name, v.value)
		}
	case "dotenv":
		for _, v := range vars {
			fmt.Fprintf(&b, "%s=\"%s\"\n", v.name, strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "$", `\$`).Replace(v.value))
		}
	case "json":
		m := make(map[string]string, len(vars))
		for _, v := range vars {
			m[v.name] = v.value
		}
		data, err := json.MarshalIndent(m, "", "  ")
		if err != nil {
			return err
		}
		b.Write(append(data, '\n'))
	default:
		return usageError(fmt.Errorf("--format %q: use shell, github, dotenv or json", format))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// shellQuote single-quotes s for POSIX shells.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
