// Package kubeenv gives integration tests a Kubernetes cluster without a
// cluster: a real control plane on loopback and one simulated node that
// runs each Pod's containers on the local Docker engine.
//
// What is real: etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler, the upstream binaries of Kubernetes v1.37.2 (built once
// per machine by scripts/kube-tools), with token authentication (users
// Admin and Limited) and Node,RBAC authorization; the controllers a
// StatefulSet needs (statefulset, garbagecollector, namespace,
// serviceaccount, pvc-protection, pv-protection, and
// persistentvolume-binder with the in-tree host-path provisioner: PVs are
// directories /tmp/hostpath_pv/<uuid> on this machine, deleted with their
// claims); scheduling; the API server's kubelet proxy for logs, exec and
// port-forward (the path kubectl port-forward takes); and whatever runs in
// the containers, such as the Postgres server of the test image. Two API
// server settings differ from a cluster's: no endpoint reconciler (it
// refuses a loopback address) and no TaintNodesByCondition admission
// (without the node-lifecycle controller nothing would lift its
// not-ready taint).
//
// What is simulated: the kubelet. The node is a virtual-kubelet
// (github.com/virtual-kubelet/virtual-kubelet v1.14.1) with a provider in
// this package that does what a kubelet does with the Docker engine as its
// runtime, in small:
//   - one Docker container per Pod container (init containers are not
//     run), on a bridge network of the env's with the Pod's IP, reachable
//     from this machine; the image must be in the engine (a missing one
//     shows ErrImagePull, then ImagePullBackOff);
//   - env from values, Secrets and ConfigMaps (read through the API) and
//     the downward API's name, namespace, labels, annotations, node and
//     IPs; command and args over the image's entrypoint and cmd, with
//     $(VAR) expansion;
//   - volumes: persistentVolumeClaim (the bound PV's directory, bind
//     mounted; a provisioned one is made mode 0777 first, as kind's
//     local-path volumes are, where the host-path provisioner leaves 0750
//     root), hostPath, emptyDir, secret and configMap; the
//     service-account token is not mounted; no fsGroup handling;
//   - readiness probes (exec, tcpSocket, httpGet) set the Ready
//     condition; liveness and startup probes are not run;
//   - restarts by restartPolicy with the kubelet's crash-loop back-off
//     (10 s doubling to 5 min: CrashLoopBackOff with lastState and
//     restartCount);
//   - deletion: the preStop hook (exec, httpGet, sleep), then the
//     container's stop signal (the image's STOPSIGNAL, or SIGTERM;
//     lifecycle.stopSignal if set), then SIGKILL after what is left of the
//     Pod's grace period (at least 2 s, as the kubelet); the Pod is then
//     removed from the API; postStart hooks are not run;
//   - logs, exec and port-forward through the kubelet API, which the API
//     server reaches on 127.0.0.1 over TLS.
//
// No kube-proxy, DNS or CNI: Services get cluster IPs that lead nowhere;
// reach a Pod at its IP or through port-forward.
//
// Everything starts once per test process, on the first call of Shared,
// in a few seconds. The test binary's TestMain must stop it:
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		kubeenv.StopShared()
//		os.Exit(code)
//	}
//
// A test then takes a namespace of its own, deleted when it ends (the
// test's clean-up waits until its Pods are gone):
//
//	env := kubeenv.Shared(t) // skips under -short
//	ns := env.NewNamespace(t)
//	_, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
//
// The control plane processes die with the test binary (Linux's parent
// death signal); the Docker containers and network of a test process that
// died are removed by the next env started on the machine (its PV
// directories under /tmp/hostpath_pv are not).
package kubeenv
