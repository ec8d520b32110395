package kubeenv

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/moby/moby/api/types/mount"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// resolveEnv builds a container's environment as the kubelet does:
// envFrom sources first, then env in order, each value with $(VAR)
// references to variables defined before it expanded. Secrets and
// ConfigMaps are read through the API. It returns the "NAME=value" list
// and the map $(VAR) in command and args expand against.
func (r *podRun) resolveEnv(ctx context.Context, c corev1.Container) ([]string, map[string]string, error) {
	vars := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	ns := r.ns
	core := r.p.kube.CoreV1()
	for _, from := range c.EnvFrom {
		var data map[string]string
		switch {
		case from.ConfigMapRef != nil:
			cm, err := core.ConfigMaps(ns).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
			if err != nil {
				if isOptional(from.ConfigMapRef.Optional) {
					continue
				}
				return nil, nil, fmt.Errorf("configmap %q: %w", from.ConfigMapRef.Name, err)
			}
			data = cm.Data
		case from.SecretRef != nil:
			s, err := core.Secrets(ns).Get(ctx, from.SecretRef.Name, metav1.GetOptions{})
			if err != nil {
				if isOptional(from.SecretRef.Optional) {
					continue
				}
				return nil, nil, fmt.Errorf("secret %q: %w", from.SecretRef.Name, err)
			}
			data = make(map[string]string, len(s.Data))
			for k, v := range s.Data {
				data[k] = string(v)
			}
		}
		for k, v := range data {
			set(from.Prefix+k, v)
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expand(e.Value, vars))
			continue
		}
		v, ok, err := r.envValueFrom(ctx, e.ValueFrom)
		if err != nil {
			return nil, nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if ok {
			set(e.Name, v)
		}
	}
	env := make([]string, 0, len(order))
	for _, k := range order {
		env = append(env, k+"="+vars[k])
	}
	return env, vars, nil
}

// envValueFrom resolves one valueFrom; ok is false for an optional
// reference to something missing (the variable is then left out).
func (r *podRun) envValueFrom(ctx context.Context, from *corev1.EnvVarSource) (value string, ok bool, err error) {
	ns := r.ns
	core := r.p.kube.CoreV1()
	switch {
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, err := core.Secrets(ns).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if isOptional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("secret %q: %w", ref.Name, err)
		}
		v, found := s.Data[ref.Key]
		if !found {
			if isOptional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("couldn't find key %s in Secret %s/%s", ref.Key, ns, ref.Name)
		}
		return string(v), true, nil
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := core.ConfigMaps(ns).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if isOptional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("configmap %q: %w", ref.Name, err)
		}
		v, found := cm.Data[ref.Key]
		if !found {
			if isOptional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", ref.Key, ns, ref.Name)
		}
		return v, true, nil
	case from.FieldRef != nil:
		v, err := r.fieldValue(from.FieldRef.FieldPath)
		return v, err == nil, err
	case from.ResourceFieldRef != nil:
		return "", false, fmt.Errorf("resourceFieldRef %q is not supported by the kubeenv node", from.ResourceFieldRef.Resource)
	}
	return "", false, nil
}

// fieldValue is the downward API's value of a Pod field.
func (r *podRun) fieldValue(fieldPath string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pod := r.pod
	if k, ok := subscript(fieldPath, "metadata.labels"); ok {
		return pod.Labels[k], nil
	}
	if k, ok := subscript(fieldPath, "metadata.annotations"); ok {
		return pod.Annotations[k], nil
	}
	switch fieldPath {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return r.p.nodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return nodeIP, nil
	case "status.podIP", "status.podIPs":
		return r.podIP().String(), nil
	}
	return "", fmt.Errorf("fieldRef %q is not supported by the kubeenv node", fieldPath)
}

// subscript parses "prefix['key']".
func subscript(fieldPath, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(fieldPath, prefix+"['")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, "']")
}

func isOptional(b *bool) bool { return b != nil && *b }

// expand replaces $(VAR) in s with the value of VAR from vars, as
// Kubernetes expands env values, command and args: a reference to an
// undefined variable stays as written, "$$" is a literal "$" (so
// "$$(VAR)" gives "$(VAR)"), and any other "$" is kept.
func expand(s string, vars map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString("$(")
				i++
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// expandAll expands each element; an empty list is nil (unset: the
// image's entrypoint or command applies).
func expandAll(list []string, vars map[string]string) []string {
	if len(list) == 0 {
		return nil
	}
	out := make([]string, len(list))
	for i, s := range list {
		out[i] = expand(s, vars)
	}
	return out
}

// mounts turns a container's volumeMounts into Docker mounts:
//   - persistentVolumeClaim: the bound PV's hostPath (or local) directory,
//     bind-mounted, so the data outlives the Pod as on real storage, and
//     opened to mode 0777 first (see openClaimDir);
//   - hostPath: that path (DirectoryOrCreate and FileOrCreate create it);
//   - emptyDir: a directory of the Pod's (mode 0777, as the kubelet makes
//     it), or a tmpfs for medium Memory;
//   - secret and configMap: their keys written as files, mounted read-only.
//
// Other volumes (the service-account token's projected volume, downward
// API) are not mounted.
func (r *podRun) mounts(ctx context.Context, c corev1.Container) ([]mount.Mount, error) {
	vols := map[string]corev1.Volume{}
	for _, v := range r.pod.Spec.Volumes {
		vols[v.Name] = v
	}
	var out []mount.Mount
	for _, vm := range c.VolumeMounts {
		v, ok := vols[vm.Name]
		if !ok {
			return nil, fmt.Errorf("volumeMount %q names no volume of the pod", vm.Name)
		}
		src, readOnly := "", vm.ReadOnly
		switch {
		case v.PersistentVolumeClaim != nil:
			p, err := r.claimPath(ctx, v.PersistentVolumeClaim.ClaimName)
			if err != nil {
				return nil, err
			}
			src, readOnly = p, readOnly || v.PersistentVolumeClaim.ReadOnly
		case v.HostPath != nil:
			src = v.HostPath.Path
			if err := ensureHostPath(src, v.HostPath.Type); err != nil {
				return nil, err
			}
		case v.EmptyDir != nil:
			if v.EmptyDir.Medium == corev1.StorageMediumMemory {
				out = append(out, mount.Mount{Type: mount.TypeTmpfs, Target: vm.MountPath})
				continue
			}
			src = filepath.Join(r.dir, "volumes", v.Name)
			if err := os.MkdirAll(src, 0o777); err != nil {
				return nil, err
			}
			if err := os.Chmod(src, 0o777); err != nil {
				return nil, err
			}
		case v.Secret != nil || v.ConfigMap != nil:
			p, err := r.writeKeyVolume(ctx, v)
			if err != nil {
				return nil, err
			}
			if p == "" {
				continue // optional and missing
			}
			src, readOnly = p, true
		default:
			r.log.Debug("volume not mounted", "volume", v.Name, "mountPath", vm.MountPath)
			continue
		}
		if vm.SubPath != "" {
			src = filepath.Join(src, filepath.Clean("/"+vm.SubPath))
			if _, err := os.Stat(src); os.IsNotExist(err) {
				if err := os.MkdirAll(src, 0o755); err != nil {
					return nil, err
				}
			}
		}
		out = append(out, mount.Mount{Type: mount.TypeBind, Source: src, Target: vm.MountPath, ReadOnly: readOnly})
	}
	return out, nil
}

// volumeNotReady is a volume the kubelet cannot mount yet and waits for.
type volumeNotReady struct{ error }

func (e volumeNotReady) Unwrap() error { return e.error }

// claimPath is the directory of the PV bound to claim.
func (r *podRun) claimPath(ctx context.Context, claim string) (string, error) {
	core := r.p.kube.CoreV1()
	pvc, err := core.PersistentVolumeClaims(r.ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("persistentvolumeclaim %q: %w", claim, err)
	}
	if pvc.Spec.VolumeName == "" || pvc.Status.Phase != corev1.ClaimBound {
		// The scheduler takes a claim with a volume name as bound; its
		// Bound phase is a second write of the PV controller's. A real
		// kubelet's volume manager waits for both, the Pod meanwhile
		// ContainerCreating.
		return "", volumeNotReady{fmt.Errorf("persistentvolumeclaim %q is not bound (%s)", claim, pvc.Status.Phase)}
	}
	pv, err := core.PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("persistentvolume %q of claim %q: %w", pvc.Spec.VolumeName, claim, err)
	}
	var dir string
	switch {
	case pv.Spec.HostPath != nil:
		dir = pv.Spec.HostPath.Path
		if err := ensureHostPath(dir, pv.Spec.HostPath.Type); err != nil {
			return "", err
		}
		if strings.HasPrefix(dir, hostPathPVDir) {
			r.p.recordClaimDir(dir)
			return dir, openClaimDir(dir)
		}
		return dir, nil
	case pv.Spec.Local != nil:
		return pv.Spec.Local.Path, nil
	}
	return "", fmt.Errorf("persistentvolume %q of claim %q is neither hostPath nor local; the kubeenv node cannot mount it", pv.Name, claim)
}

// hostPathPVDir is where the in-tree host-path provisioner makes PVs
// (k8s.io/kubernetes pkg/volume/hostpath: /tmp/hostpath_pv/<uuid>).
const hostPathPVDir = "/tmp/hostpath_pv/"

// openClaimDir makes a provisioned volume's root directory mode 0777. The
// in-tree host-path provisioner makes it 0750 root, which a server running
// as another user cannot enter: the official postgres image's entrypoint
// creates and chowns PGDATA as root, but postgres itself then needs to
// pass through the mount's root when PGDATA is below it (the usual advice,
// as a real volume's root holds lost+found). Real volumes are usable there:
// a fresh filesystem's root is 0755, and kind's local-path provisioner
// makes 0777 directories, which this follows.
func openClaimDir(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("volume directory: %w", err)
	}
	if st.Mode().Perm() == 0o777 {
		return nil
	}
	return os.Chmod(dir, 0o777)
}

func ensureHostPath(p string, t *corev1.HostPathType) error {
	if t == nil {
		return nil
	}
	switch *t {
	case corev1.HostPathDirectoryOrCreate:
		return os.MkdirAll(p, 0o755)
	case corev1.HostPathFileOrCreate:
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	}
	return nil
}

// writeKeyVolume writes a secret or configMap volume's files into the
// Pod's directory and returns it, or "" for an optional one that is
// missing.
func (r *podRun) writeKeyVolume(ctx context.Context, v corev1.Volume) (string, error) {
	core := r.p.kube.CoreV1()
	var (
		data     = map[string][]byte{}
		items    []corev1.KeyToPath
		mode     *int32
		optional *bool
	)
	switch {
	case v.Secret != nil:
		items, mode, optional = v.Secret.Items, v.Secret.DefaultMode, v.Secret.Optional
		s, err := core.Secrets(r.ns).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
		if err != nil {
			if isOptional(optional) {
				return "", nil
			}
			return "", fmt.Errorf("secret %q of volume %q: %w", v.Secret.SecretName, v.Name, err)
		}
		data = s.Data
	case v.ConfigMap != nil:
		items, mode, optional = v.ConfigMap.Items, v.ConfigMap.DefaultMode, v.ConfigMap.Optional
		cm, err := core.ConfigMaps(r.ns).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
		if err != nil {
			if isOptional(optional) {
				return "", nil
			}
			return "", fmt.Errorf("configmap %q of volume %q: %w", v.ConfigMap.Name, v.Name, err)
		}
		for k, s := range cm.Data {
			data[k] = []byte(s)
		}
		for k, b := range cm.BinaryData {
			data[k] = b
		}
	}
	dir := filepath.Join(r.dir, "volumes", v.Name)
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	fileMode := os.FileMode(0o644)
	if mode != nil {
		fileMode = os.FileMode(*mode) & 0o777
	}
	if len(items) == 0 {
		for k := range data {
			items = append(items, corev1.KeyToPath{Key: k, Path: k})
		}
	}
	for _, it := range items {
		b, ok := data[it.Key]
		if !ok {
			if isOptional(optional) {
				continue
			}
			return "", fmt.Errorf("volume %q: key %q not found", v.Name, it.Key)
		}
		m := fileMode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode) & 0o777
		}
		p := filepath.Join(dir, filepath.FromSlash(path.Clean("/"+it.Path)))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, b, m); err != nil {
			return "", err
		}
		if err := os.Chmod(p, m); err != nil {
			return "", err
		}
	}
	return dir, nil
}
