package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
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
  pgwake env app --format json

Under GitHub Actions (GITHUB_ACTIONS=true), --format github first writes
::add-mask:: commands for the password to stderr, so the runner hides it in
the job's log while the variables go to $GITHUB_ENV.`,
		Args: exactArgs(1, "a project name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			vars, err := envFor(cmd, d, args[0])
			if err != nil {
				return err
			}
			if format == "github" {
				for _, v := range vars {
					if v.name == "DATABASE_URL" {
						writeMasks(d.stderr, d.environ, urlSecrets(v.value)...)
					}
				}
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

// writeMasks tells a GitHub Actions runner to mask each secret in the
// job's log: one ::add-mask:: workflow command per value, written to w
// (stderr) before anything else prints them. Outside GitHub Actions it
// writes nothing: another CI would just log the secret.
//
// Why stderr: `pgwake env app --format github >> "$GITHUB_ENV"` sends
// stdout into the env file, where the runner rejects any line that is not
// NAME=value or NAME<<DELIMITER ("Invalid format") and fails the step.
// GitHub's docs say commands go "over stdout", but the runner
// (actions/runner, Runner.Worker/Handlers/ScriptHandler.cs) feeds the step
// process's stderr lines through the same OutputManager and command parser
// as its stdout lines, so the mask takes effect from stderr and the runner
// consumes the line instead of logging it. When stdout reaches the log too
// (no redirect), the two pipes are read separately; the runner dispatches
// the stderr lines it holds before the stdout ones (Runner.Sdk's
// ProcessInvoker.ProcessOutput), which covers the usual case, but only the
// redirect keeps the values out of the log for certain.
func writeMasks(w io.Writer, environ []string, secrets ...string) {
	if !slices.Contains(environ, "GITHUB_ACTIONS=true") {
		return
	}
	var b strings.Builder
	for _, s := range secrets {
		if s != "" {
			b.WriteString("::add-mask::" + escapeCommandData(s) + "\n")
		}
	}
	io.WriteString(w, b.String())
}

// escapeCommandData escapes a workflow command's value as the runner
// unescapes it (ActionCommand's data mappings): %, CR and LF.
func escapeCommandData(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A").Replace(s)
}

// urlSecrets returns the password of a postgres:// URL, and again as the
// URL spells it when that differs (percent-encoded), for writeMasks.
func urlSecrets(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return nil
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" {
		return nil
	}
	out := []string{pw}
	user := url.User(u.User.Username()).String()
	if enc := strings.TrimPrefix(u.User.String(), user+":"); enc != pw {
		out = append(out, enc)
	}
	return out
}

// shellQuote single-quotes s for POSIX shells.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
