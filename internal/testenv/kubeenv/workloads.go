package kubeenv

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// PostgresTemplate is a Postgres Pod template as a Helm chart or a user
// would write one, for tests of workloads pgwake did not create: labels l
// and not pgwake's, its container called "db" (not "postgres"), the
// password from key "password" of Secret secret, user and database from
// the image's defaults unless given, data under a volume named "data" that
// the caller provides (volumeClaimTemplates or a PVC).
func PostgresTemplate(image string, l map[string]string, secret, user, db string) corev1.PodTemplateSpec {
	env := []corev1.EnvVar{
		{Name: "POSTGRES_PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: "password"}}},
		{Name: "PGDATA", Value: "/var/lib/postgresql/data/pgdata"},
	}
	if user != "" {
		env = append(env, corev1.EnvVar{Name: "POSTGRES_USER", Value: user}, corev1.EnvVar{Name: "POSTGRES_DB", Value: db})
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: l},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			EnableServiceLinks:           ptr.To(false),
			Containers: []corev1.Container{{
				Name: "db", Image: image, Env: env,
				Ports: []corev1.ContainerPort{{Name: "pg", ContainerPort: 5432}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("pg")}},
					PeriodSeconds: 1, FailureThreshold: 1,
				},
				// A fast shutdown, as the official image's STOPSIGNAL.
				Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
					Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c", "kill -INT 1"}},
				}},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/var/lib/postgresql/data"}},
			}},
		},
	}
}

// PostgresStatefulSet is a chart's Postgres StatefulSet named name: Pods
// labelled app=name from PostgresTemplate, a 100Mi volume claim template
// "data", replicas and annotations as given.
func PostgresStatefulSet(image, name string, replicas int32, annotations map[string]string, secret string) *appsv1.StatefulSet {
	l := map[string]string{"app": name}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To(replicas), ServiceName: name,
			Selector: &metav1.LabelSelector{MatchLabels: l},
			Template: PostgresTemplate(image, l, secret, "", ""),
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("100Mi")}},
				},
			}},
		},
	}
}
