package k8sbackend

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/pgwake/pgwake/internal/backend"
)

// dataMount is where the PVC is mounted, and pgdata the PGDATA below it:
// a subdirectory, since a volume's root may hold lost+found, which initdb
// refuses (the official image's documented advice), and an explicit
// PGDATA serves postgres:18's new layout as well as older images.
const (
	dataMount = "/var/lib/postgresql/data"
	pgdata    = dataMount + "/pgdata"
)

// newStatefulSet is the project's StatefulSet: zero replicas (Ensure never
// starts a server), the official image's contract for env and data, the
// password from the project's Secret.
func (b *Backend) newStatefulSet(spec backend.Spec) *appsv1.StatefulSet {
	name, l := objectName(spec.Name), b.labels(spec.Name)
	pvc := corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Labels: l},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: b.storage}},
		},
	}
	if b.class != "" {
		pvc.Spec.StorageClassName = ptr.To(b.class)
	}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l, Annotations: map[string]string{
			AnnotationUser: spec.User, AnnotationDatabase: spec.Database,
		}},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To[int32](0),
			ServiceName:         name,
			Selector:            &metav1.LabelSelector{MatchLabels: l},
			PodManagementPolicy: appsv1.ParallelPodManagement,
			// Data outlives the StatefulSet: `rm` keeps it unless asked.
			PersistentVolumeClaimRetentionPolicy: &appsv1.StatefulSetPersistentVolumeClaimRetentionPolicy{
				WhenDeleted: appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
				WhenScaled:  appsv1.RetainPersistentVolumeClaimRetentionPolicyType,
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: l},
				Spec: corev1.PodSpec{
					// Postgres needs no API access, nor the Services' env.
					AutomountServiceAccountToken:  ptr.To(false),
					EnableServiceLinks:            ptr.To(false),
					TerminationGracePeriodSeconds: ptr.To[int64](terminationGrace),
					Containers: []corev1.Container{{
						Name:  "postgres",
						Image: spec.Image,
						Args:  serverArgs(spec.Settings),
						Env: []corev1.EnvVar{
							{Name: "POSTGRES_USER", ValueFrom: secretRef(name, secretUser)},
							{Name: "POSTGRES_PASSWORD", ValueFrom: secretRef(name, secretPassword)},
							{Name: "POSTGRES_DB", ValueFrom: secretRef(name, secretDatabase)},
							{Name: "PGDATA", Value: pgdata},
						},
						Ports: []corev1.ContainerPort{{Name: "postgres", ContainerPort: 5432, Protocol: corev1.ProtocolTCP}},
						// A fast shutdown whatever the image's STOPSIGNAL: the
						// kubelet's default SIGTERM is Postgres's smart
						// shutdown, which waits for every session to end.
						// (The official image's PID 1 is postgres.)
						// Ready once Postgres listens on TCP. Not earlier: a
						// connection the Pod refuses through a port-forward
						// leaves that port-forward connection unusable and
						// the kubelet's handler for it stuck (seen here as
						// thousands of goroutines), so pgwake sends nothing
						// through one before this.
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:     corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("postgres")}},
							PeriodSeconds:    1,
							TimeoutSeconds:   1,
							FailureThreshold: 1,
						},
						Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
							Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c", "kill -INT 1"}},
						}},
						VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: dataMount}},
					}},
				},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{pvc},
		},
	}
}

// serverArgs are the container's args for settings: the official image's
// CMD, postgres, with -c for each (its entrypoint passes them to the
// server). None without settings: the image's own CMD runs.
func serverArgs(settings map[string]string) []string {
	if len(settings) == 0 {
		return nil
	}
	return append([]string{"postgres"}, backend.SettingArgs(settings)...)
}

// drifted reports whether the StatefulSet's Pod template differs from
// spec's: an image to change whenever it differs, and settings, which
// change only while no Pod runs (a template change rolls a running Pod,
// cutting its clients; a running server keeps its settings until it
// sleeps).
func drifted(set *appsv1.StatefulSet, spec backend.Spec) bool {
	c := set.Spec.Template.Spec.Containers[0]
	if spec.Image != "" && c.Image != spec.Image {
		return true
	}
	return ptr.Deref(set.Spec.Replicas, 0) == 0 && !slices.Equal(c.Args, serverArgs(spec.Settings))
}

func secretRef(name, key string) *corev1.EnvVarSource {
	return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key,
	}}
}

// ownerRef makes an object garbage once the StatefulSet is deleted.
func ownerRef(s *appsv1.StatefulSet) []metav1.OwnerReference {
	return []metav1.OwnerReference{*metav1.NewControllerRef(s, appsv1.SchemeGroupVersion.WithKind("StatefulSet"))}
}

// Ensure implements backend.Backend: the StatefulSet (0 replicas), then
// its Secret and headless Service owned by it. Existing objects of the
// project are kept; one with a project's name that is not pgwake's is
// ErrNotOwned and left alone. A kept Secret (`rm` without --volumes) is
// taken over when its password is spec's.
func (b *Backend) Ensure(ctx context.Context, spec backend.Spec) error {
	if ad, err := b.adoptedFor(spec); err != nil || ad != nil {
		return err // an adopted object exists as its owner made it
	}
	_, err := b.ensure(ctx, spec)
	return err
}

func (b *Backend) ensure(ctx context.Context, spec backend.Spec) (*appsv1.StatefulSet, error) {
	if err := validName(spec.Name); err != nil {
		return nil, err
	}
	name := objectName(spec.Name)
	set, err := b.statefulSet(ctx, spec.Name)
	if err != nil {
		return nil, err
	}
	// The Secret and Service are checked first: nothing is created when
	// one of them is somebody else's.
	sec, err := b.cs.CoreV1().Secrets(b.ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		sec = nil
	case err != nil:
		return nil, b.apiErr(err, "read secret "+name)
	case !owned(sec.Labels, spec.Name):
		return nil, notOwned("secret", name)
	case string(sec.Data[secretPassword]) != spec.Password:
		return nil, fmt.Errorf("secret %q holds another password than project %q's: it belongs to data kept by an earlier project of this name (`pgwake create` takes it over; remove the secret and PVC %q to start afresh)", name, spec.Name, pvcName(spec.Name))
	}
	svc, err := b.cs.CoreV1().Services(b.ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		svc = nil
	case err != nil:
		return nil, b.apiErr(err, "read service "+name)
	case !owned(svc.Labels, spec.Name):
		return nil, notOwned("service", name)
	}

	if set == nil {
		set, err = b.cs.AppsV1().StatefulSets(b.ns).Create(ctx, b.newStatefulSet(spec), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// Another pgwake made it meanwhile.
			set, err = b.statefulSet(ctx, spec.Name)
		}
		if err != nil {
			return nil, b.apiErr(err, "create statefulset "+name)
		}
	} else if drifted(set, spec) {
		// The next Pod runs the spec's image and settings, on the same data.
		upd := set.DeepCopy()
		c := &upd.Spec.Template.Spec.Containers[0]
		if spec.Image != "" {
			c.Image = spec.Image
		}
		if ptr.Deref(set.Spec.Replicas, 0) == 0 {
			c.Args = serverArgs(spec.Settings)
		}
		if set, err = b.cs.AppsV1().StatefulSets(b.ns).Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return nil, b.apiErr(err, "update statefulset "+name)
		}
	}
	if sec == nil {
		sec = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: b.labels(spec.Name), OwnerReferences: ownerRef(set)},
			Type:       corev1.SecretTypeOpaque,
			Data: map[string][]byte{
				secretPassword: []byte(spec.Password), secretUser: []byte(spec.User), secretDatabase: []byte(spec.Database),
			},
		}
		if _, err := b.cs.CoreV1().Secrets(b.ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, b.apiErr(err, "create secret "+name)
		}
	} else if sec.Labels[LabelKept] != "" || !ownedBy(sec.OwnerReferences, set) {
		// Kept data taken over, or a StatefulSet made anew: the Secret
		// follows the StatefulSet again.
		upd := sec.DeepCopy()
		delete(upd.Labels, LabelKept)
		upd.OwnerReferences = ownerRef(set)
		if _, err := b.cs.CoreV1().Secrets(b.ns).Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			return nil, b.apiErr(err, "update secret "+name)
		}
	}
	if svc == nil {
		svc = &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: b.labels(spec.Name), OwnerReferences: ownerRef(set)},
			Spec: corev1.ServiceSpec{
				ClusterIP: corev1.ClusterIPNone,
				Selector:  b.labels(spec.Name),
				// Reachable by name while booting too: pgwake checks
				// readiness itself.
				PublishNotReadyAddresses: true,
				Ports: []corev1.ServicePort{{
					Name: "postgres", Port: 5432, TargetPort: intstr.FromString("postgres"), Protocol: corev1.ProtocolTCP,
				}},
			},
		}
		if _, err := b.cs.CoreV1().Services(b.ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, b.apiErr(err, "create service "+name)
		}
	}
	return set, nil
}

func ownedBy(refs []metav1.OwnerReference, set *appsv1.StatefulSet) bool {
	for _, r := range refs {
		if r.UID == set.UID {
			return true
		}
	}
	return false
}

// Save implements backend.Catalog: the project's settings go on its
// StatefulSet as annotations, where every pgwake of the namespace reads
// them.
func (b *Backend) Save(ctx context.Context, rec backend.Record) error {
	if ad, err := b.adoptedFor(rec.Spec); err != nil || ad != nil {
		if err != nil {
			return err
		}
		return b.saveAdopted(ctx, ad, rec)
	}
	set, err := b.statefulSet(ctx, rec.Spec.Name)
	if err != nil {
		return err
	}
	if set == nil {
		return fmt.Errorf("save project %q: %w", rec.Spec.Name, backend.ErrNotFound)
	}
	upd := set.DeepCopy()
	if upd.Annotations == nil {
		upd.Annotations = map[string]string{}
	}
	a := upd.Annotations
	a[AnnotationUser], a[AnnotationDatabase] = rec.Spec.User, rec.Spec.Database
	a[AnnotationSleepAfter] = rec.SleepAfter.String()
	a[AnnotationSleepMode] = string(rec.SleepMode)
	a[AnnotationPinned] = fmt.Sprint(rec.Pinned)
	if _, ok := a[AnnotationCreatedAt]; !ok && !rec.CreatedAt.IsZero() {
		a[AnnotationCreatedAt] = rec.CreatedAt.UTC().Format(time.RFC3339)
	}
	if rec.Ephemeral {
		a[AnnotationEphemeral] = b.instance
	}
	if len(rec.Spec.Settings) > 0 {
		js, err := json.Marshal(rec.Spec.Settings)
		if err != nil {
			return err
		}
		a[AnnotationSettings] = string(js)
	} else {
		delete(a, AnnotationSettings)
	}
	if rec.Parent != "" {
		a[AnnotationParent] = rec.Parent
		a[AnnotationBranchedAt] = rec.BranchedAt.UTC().Format(time.RFC3339)
	}
	if _, err := b.cs.AppsV1().StatefulSets(b.ns).Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) {
			// Changed meanwhile (a scale): read it again and retry once.
			if set, err = b.cs.AppsV1().StatefulSets(b.ns).Get(ctx, set.Name, metav1.GetOptions{}); err == nil {
				for k, v := range a {
					if set.Annotations == nil {
						set.Annotations = map[string]string{}
					}
					set.Annotations[k] = v
				}
				_, err = b.cs.AppsV1().StatefulSets(b.ns).Update(ctx, set, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			return b.apiErr(err, "save settings on statefulset "+set.Name)
		}
	}
	return b.savePassword(ctx, rec.Spec)
}

// savePassword keeps a changed password (`pgwake passwd`) in the project's
// own Secret, where every pgwake of the namespace reads it. A Secret that
// is not pgwake's is left alone.
func (b *Backend) savePassword(ctx context.Context, spec backend.Spec) error {
	name := objectName(spec.Name)
	sec, err := b.cs.CoreV1().Secrets(b.ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return b.apiErr(err, "read secret "+name)
	case !owned(sec.Labels, spec.Name) || spec.Password == "" || string(sec.Data[secretPassword]) == spec.Password:
		return nil
	}
	upd := sec.DeepCopy()
	if upd.Data == nil {
		upd.Data = map[string][]byte{}
	}
	upd.Data[secretPassword] = []byte(spec.Password)
	if _, err := b.cs.CoreV1().Secrets(b.ns).Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		return b.apiErr(err, "save password in secret "+name)
	}
	return nil
}

// Projects implements backend.Catalog: every project of the namespace,
// read from the informer caches: pgwake's own and the adopted ones.
func (b *Backend) Projects(ctx context.Context) ([]backend.Record, error) {
	sets, err := b.sets.List(labelsManaged())
	if err != nil {
		return nil, err
	}
	var out []backend.Record
	for _, s := range sets {
		project := s.Labels[LabelProject]
		if project == "" || s.DeletionTimestamp != nil {
			continue
		}
		sec, err := b.secrets.Get(s.Name)
		if err != nil || !owned(sec.Labels, project) {
			// Being created (the Secret follows the StatefulSet) or
			// broken: not a project anyone can connect to yet.
			continue
		}
		rec := backend.Record{
			Spec: backend.Spec{
				Name: project, Image: s.Spec.Template.Spec.Containers[0].Image,
				User: string(sec.Data[secretUser]), Password: string(sec.Data[secretPassword]),
				Database: string(sec.Data[secretDatabase]),
			},
			SleepMode: backend.SleepMode(s.Annotations[AnnotationSleepMode]),
			Pinned:    s.Annotations[AnnotationPinned] == "true",
			Ephemeral: b.instance != "" && s.Annotations[AnnotationEphemeral] == b.instance,
			Saved:     s.Annotations[AnnotationSleepAfter] != "",
			Parent:    s.Annotations[AnnotationParent],
		}
		rec.BranchedAt, _ = time.Parse(time.RFC3339, s.Annotations[AnnotationBranchedAt])
		if js := s.Annotations[AnnotationSettings]; js != "" {
			if err := json.Unmarshal([]byte(js), &rec.Spec.Settings); err != nil {
				b.log.Warn("ignoring unreadable settings on a project's statefulset", "project", project, "err", err)
			}
		}
		if d, err := time.ParseDuration(s.Annotations[AnnotationSleepAfter]); err == nil {
			rec.SleepAfter = d
		}
		if t, err := time.Parse(time.RFC3339, s.Annotations[AnnotationCreatedAt]); err == nil {
			rec.CreatedAt = t
		} else {
			rec.CreatedAt = s.CreationTimestamp.UTC()
		}
		out = append(out, rec)
	}
	return append(out, b.adoptedRecords(ctx)...), nil
}

// Kept implements backend.Catalog: the credentials of data that `rm`
// kept for a project of this name, so a project created again reaches it.
func (b *Backend) Kept(ctx context.Context, project string) (backend.Spec, bool, error) {
	sec, err := b.cs.CoreV1().Secrets(b.ns).Get(ctx, objectName(project), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return backend.Spec{}, false, nil
	case err != nil:
		return backend.Spec{}, false, b.apiErr(err, "read secret "+objectName(project))
	case !owned(sec.Labels, project) || sec.Labels[LabelKept] != "true":
		return backend.Spec{}, false, nil
	}
	return backend.Spec{
		Name: project, User: string(sec.Data[secretUser]), Password: string(sec.Data[secretPassword]),
		Database: string(sec.Data[secretDatabase]),
	}, true, nil
}
