package daemon

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pgwake/pgwake/internal/admin"
	"github.com/pgwake/pgwake/internal/config"
	"github.com/pgwake/pgwake/internal/k8sbackend"
	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

// TestIntegrationSettingsKubernetes: a project's settings reach its server
// on Kubernetes (a real control plane; simulated: the node, see kubeenv)
// as the Pod's args; they are kept on the StatefulSet, where every pgwake
// of the namespace reads them; a change made there (as another pgwake's
// save makes it) applies at the next start; a value Postgres rejects is
// the server's own error for the client.
func TestIntegrationSettingsKubernetes(t *testing.T) {
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	cl, _, _ := runDaemon(t, func(c *config.Config) {
		c.Backend = "kubernetes"
		c.Kubernetes.Kubeconfig, c.Kubernetes.Namespace = env.Kubeconfig, ns
	})
	ctx := t.Context()
	p, err := cl.Create(ctx, admin.CreateRequest{Name: "tuned", Settings: map[string]string{"work_mem": "7MB"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := showSetting(t, p.URL, "work_mem"); got != "7MB" {
		t.Fatalf("work_mem is %s, want 7MB", got)
	}
	sets := env.Client.AppsV1().StatefulSets(ns)
	set, err := sets.Get(ctx, "pgwake-tuned", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if args := set.Spec.Template.Spec.Containers[0].Args; !slices.Equal(args, []string{"postgres", "-c", "work_mem=7MB"}) {
		t.Errorf("container args %q", args)
	}
	var saved map[string]string
	if err := json.Unmarshal([]byte(set.Annotations[k8sbackend.AnnotationSettings]), &saved); err != nil || saved["work_mem"] != "7MB" {
		t.Errorf("settings annotation %q (%v)", set.Annotations[k8sbackend.AnnotationSettings], err)
	}

	// Another pgwake of the namespace changes them.
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	events, err := cl.Events(wait)
	if err != nil {
		t.Fatal(err)
	}
	set.Annotations[k8sbackend.AnnotationSettings] = `{"work_mem":"9MB"}`
	if _, err := sets.Update(ctx, set, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for ev := range events {
		if ev.Project.Name == "tuned" && ev.Project.Settings["work_mem"] == "9MB" {
			break
		}
	}
	if wait.Err() != nil {
		t.Fatal("the daemon did not take the settings changed on the StatefulSet")
	}
	cancel()
	if got := showSetting(t, p.URL, "work_mem"); got != "7MB" {
		t.Errorf("a running server changed work_mem to %s: it keeps its settings until it sleeps", got)
	}
	sleepWhenIdle(t, cl, "tuned")
	if got := showSetting(t, p.URL, "work_mem"); got != "9MB" {
		t.Errorf("after a sleep work_mem is %s, want 9MB", got)
	}

	bad, err := cl.Create(ctx, admin.CreateRequest{Name: "badset", Settings: map[string]string{"work_mem": "banana"}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, bad.URL)
	if err == nil {
		c.Close(ctx)
		t.Fatal("a server with work_mem=banana served")
	}
	if !strings.Contains(err.Error(), `invalid value for parameter "work_mem"`) {
		t.Errorf("connect: %v; want the server's own error", err)
	}
}

// showSetting connects, reads a setting and disconnects.
func showSetting(t *testing.T, url, name string) string {
	t.Helper()
	c, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var v string
	if err := c.QueryRow(t.Context(), "select current_setting($1)", name).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}
