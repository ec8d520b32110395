package main

// Adopted workloads whose password pgwake does not hold (no
// pgwake.dev/secret annotation): the server authenticates every client,
// md5 and trust included, against the test control plane (simulated: the
// node; see kube_integration_test.go).

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pgwake/pgwake/internal/testenv"
	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

// TestIntegrationKubernetesAdoptedPassThrough: an md5-only server and a
// trust server, each adopted without its Secret: `ls` and the API say
// authentication passes through, a client with the server's own md5
// password (and one with none, for trust) logs in through pgwake, and a
// wrong md5 password gets the server's 28P01.
func TestIntegrationKubernetesAdoptedPassThrough(t *testing.T) {
	t.Parallel()
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	ctx := t.Context()
	image := testenv.PostgresImage(t)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "legacy-db"}, StringData: map[string]string{"password": "md5-secret"}}
	if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	legacy := kubeenv.PostgresStatefulSet(image, "legacy-db", 1, map[string]string{"pgwake.dev/project": "legacy"}, "legacy-db")
	c := &legacy.Spec.Template.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "POSTGRES_HOST_AUTH_METHOD", Value: "md5"})
	open := kubeenv.PostgresStatefulSet(image, "open-db", 1, map[string]string{"pgwake.dev/project": "open"}, "")
	c = &open.Spec.Template.Spec.Containers[0]
	c.Env = []corev1.EnvVar{{Name: "POSTGRES_HOST_AUTH_METHOD", Value: "trust"}, {Name: "PGDATA", Value: "/var/lib/postgresql/data/pgdata"}}
	if _, err := env.Client.AppsV1().StatefulSets(ns).Create(ctx, legacy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.AppsV1().StatefulSets(ns).Create(ctx, open, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	h := kubeHarness(t, ns)
	h.up(t)
	for _, name := range []string{"legacy", "open"} {
		eventually(t, name+" is adopted with pass-through auth", func() string {
			p, ok := h.project(t, name)
			if !ok || p.Auth != "pass-through" {
				return fmt.Sprintf("%+v", p)
			}
			return ""
		})
	}
	if out := h.ok(t, "ls"); strings.Count(out, "(auth passed through)") != 2 {
		t.Errorf("ls does not say both pass authentication through:\n%s", out)
	}
	withPassword := func(name, pw string) string {
		u, err := url.Parse(strings.TrimSpace(h.ok(t, "url", name)))
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(u.User.Username(), pw)
		return u.String()
	}
	query := func(u, sql string) (string, error) {
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			return "", err
		}
		defer conn.Close(context.Background())
		var s string
		err = conn.QueryRow(ctx, sql).Scan(&s)
		return s, err
	}

	// Make the first server md5-only: its pg_hba says md5 (the image's
	// POSTGRES_HOST_AUTH_METHOD); store the password as md5 too.
	conn, err := pgx.Connect(ctx, withPassword("legacy", "md5-secret"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "set password_encryption = 'md5'; alter role postgres password 'md5-secret'"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	got, err := query(withPassword("legacy", "md5-secret"),
		"select (select left(rolpassword, 3) from pg_authid where rolname = 'postgres') || ' ' || string_agg(distinct auth_method, ',') from pg_hba_file_rules where type = 'host'")
	// The image's own initdb rules (scram-sha-256 for some hosts) stay
	// beside the md5 one: what matters is that md5 is among them and the
	// role's password is an md5 hash, which SCRAM cannot check.
	if err != nil || !strings.HasPrefix(got, "md5 ") || !strings.Contains(got, "md5,") && !strings.HasSuffix(got, "md5") {
		t.Fatalf("md5 login through pgwake: %q, %v; want an md5 password under md5 rules", got, err)
	}
	var pe *pgconn.PgError
	if _, err := query(withPassword("legacy", "wrong"), "select 'x'"); !errors.As(err, &pe) || pe.Code != "28P01" {
		t.Fatalf("wrong md5 password: %v, want the server's 28P01", err)
	}
	if p := h.mustProject(t, "legacy"); p.AuthFailures != 1 {
		t.Errorf("auth failures %d, want the server's one 28P01 counted", p.AuthFailures)
	}

	got, err = query(strings.TrimSpace(h.ok(t, "url", "open")), "select string_agg(distinct auth_method, ',') from pg_hba_file_rules where type = 'host'")
	if err != nil || !strings.Contains(got, "trust") {
		t.Fatalf("trust login through pgwake without a password: %q, %v", got, err)
	}
}
