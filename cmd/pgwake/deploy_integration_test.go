package main

// The in-cluster deployment: the container image (Dockerfile, as
// goreleaser builds it) and the kustomize base in deploy/kubernetes,
// against the test control plane. Simulated: the node (virtual-kubelet on
// the local Docker engine, internal/testenv/kubeenv); the manifests are
// applied to a real kube-apiserver, which validates them, and the image
// runs on the real Docker engine as pgwake in its own container.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/pgwake/pgwake/internal/testenv/kubeenv"
)

// command runs name with args and returns its output, failing the test on
// an error.
func command(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestIntegrationContainerImage builds the image from the Dockerfile and a
// static build, as goreleaser does, and runs it: as an unprivileged user
// it prints its version, and `up` against the test control plane serves
// (its peer Lease appears) and stops cleanly on SIGTERM (the Lease goes).
func TestIntegrationContainerImage(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs Docker")
	}
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	dir := t.TempDir()
	command(t, ".", []string{"CGO_ENABLED=0"}, "go", "build", "-trimpath", "-o", filepath.Join(dir, "linux/amd64/pgwake"), ".")
	df, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), df, 0o644); err != nil {
		t.Fatal(err)
	}
	tag := fmt.Sprintf("pgwake-test/pgwake:%d", time.Now().UnixNano())
	command(t, dir, nil, "docker", "build", "-q", "--build-arg", "TARGETPLATFORM=linux/amd64", "-t", tag, ".")
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", tag).Run() })

	if out := command(t, dir, nil, "docker", "run", "--rm", tag, "version"); !strings.Contains(out, "pgwake") {
		t.Errorf("version: %q", out)
	}
	if out := command(t, dir, nil, "docker", "image", "inspect", "-f", "{{.Config.User}}", tag); strings.TrimSpace(out) != "65532:65532" {
		t.Errorf("image user %q, want 65532:65532 (non-root)", out)
	}

	// The image's own CMD (up --backend=kubernetes), pointed at the test
	// API server: a read-only root and a tmpfs state dir, as in the
	// Deployment.
	name := "pgwake-test-image-" + ns
	// Readable by the image's user (the admin kubeconfig is root's, 0600).
	admin, err := os.ReadFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, admin, 0o644); err != nil {
		t.Fatal(err)
	}
	command(t, dir, nil, "docker", "run", "-d", "--name", name, "--network", "host", "--read-only",
		"--tmpfs", "/run/pgwake:uid=65532,gid=65532", "-v", kc+":/kubeconfig:ro",
		"-e", "KUBECONFIG=/kubeconfig", "-e", "PGWAKE_KUBERNETES_NAMESPACE="+ns, "-e", "PGWAKE_KUBERNETES_PEER=image-test",
		"--label", "dev.pgwake.test=image",
		tag, "up", "--backend=kubernetes", "--listen=127.0.0.1:0", "--kubernetes-dial=port-forward")
	t.Cleanup(func() { exec.Command("docker", "rm", "-f", name).Run() })
	logs := func() string { out, _ := exec.Command("docker", "logs", name).CombinedOutput(); return string(out) }
	eventually(t, "the container's pgwake publishes its peer lease", func() string {
		if _, err := env.Client.CoordinationV1().Leases(ns).Get(t.Context(), "pgwake-peer-image-test", metav1.GetOptions{}); err != nil {
			if st, _ := exec.Command("docker", "inspect", "-f", "{{.State.Running}}", name).Output(); strings.TrimSpace(string(st)) != "true" {
				t.Fatalf("the container's pgwake exited:\n%s", logs())
			}
			return err.Error()
		}
		return ""
	})
	command(t, dir, nil, "docker", "stop", "-t", "60", name)
	if code := strings.TrimSpace(command(t, dir, nil, "docker", "inspect", "-f", "{{.State.ExitCode}}", name)); code != "0" && code != "143" {
		t.Errorf("pgwake exited %s on SIGTERM\n%s", code, logs())
	}
	if _, err := env.Client.CoordinationV1().Leases(ns).Get(t.Context(), "pgwake-peer-image-test", metav1.GetOptions{}); err == nil {
		t.Errorf("the lease outlived a clean stop\n%s", logs())
	}
}

// TestIntegrationKustomizeDeploy renders the example overlay with kubectl
// (what a user runs), checks what it sets, and applies the base, in an
// overlay of the test's namespace, to the test API server.
func TestIntegrationKustomizeDeploy(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs the test control plane")
	}
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatal("kubectl is not on PATH (it renders the kustomize base, as users do)")
	}
	env := kubeenv.Shared(t)
	ns := env.NewNamespace(t)
	root, err := filepath.Abs("../../deploy/kubernetes")
	if err != nil {
		t.Fatal(err)
	}

	out := command(t, ".", nil, kubectl, "kustomize", filepath.Join(root, "overlays/example"))
	for _, want := range []string{"namespace: dev-databases", "image: ghcr.io/pgwake/pgwake:v0.1.0", "replicas: 3",
		"kind: PodDisruptionBudget", "path: /readyz", "name: pgwake-metrics", "secretName: pgwake-tls", "runAsNonRoot: true"} {
		if !strings.Contains(out, want) {
			t.Errorf("the example overlay lacks %q", want)
		}
	}
	if strings.Contains(out, "kind: Namespace") {
		t.Error("the example overlay creates a namespace; it should use the existing one")
	}

	overlay := t.TempDir()
	base, err := filepath.Rel(overlay, filepath.Join(root, "base"))
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("namespace: %s\nresources:\n- %s\npatches:\n- patch: |\n    $patch: delete\n    apiVersion: v1\n    kind: Namespace\n    metadata:\n      name: pgwake\n", ns, base)
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	rendered := command(t, ".", nil, kubectl, "kustomize", overlay)
	manifest := filepath.Join(overlay, "rendered.yaml")
	if err := os.WriteFile(manifest, []byte(rendered), 0o644); err != nil {
		t.Fatal(err)
	}
	command(t, ".", nil, kubectl, "--kubeconfig", env.Kubeconfig, "apply", "-f", manifest)

	ctx := t.Context()
	c := env.Client
	dep, err := c.AppsV1().Deployments(ns).Get(ctx, "pgwake", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *dep.Spec.Replicas != 2 || dep.Spec.Template.Spec.ServiceAccountName != "pgwake" {
		t.Errorf("deployment: %d replicas, service account %q", *dep.Spec.Replicas, dep.Spec.Template.Spec.ServiceAccountName)
	}
	for _, get := range []func() error{
		func() error {
			_, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, "pgwake", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := c.RbacV1().RoleBindings(ns).Get(ctx, "pgwake", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := c.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "pgwake", metav1.GetOptions{})
			return err
		},
		func() error { _, err := c.CoreV1().Services(ns).Get(ctx, "pgwake", metav1.GetOptions{}); return err },
		func() error {
			_, err := c.CoreV1().Services(ns).Get(ctx, "pgwake-metrics", metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); err != nil {
			t.Error(err)
		}
	}
	// The Role applied is the one the RBAC test proves sufficient.
	data, err := os.ReadFile(filepath.Join(root, "base/role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want rbacv1.Role
	if err := yaml.UnmarshalStrict(data, &want); err != nil {
		t.Fatal(err)
	}
	got, err := c.RbacV1().Roles(ns).Get(ctx, "pgwake", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Rules, want.Rules) {
		t.Errorf("applied role rules %v, want %v", got.Rules, want.Rules)
	}
}
