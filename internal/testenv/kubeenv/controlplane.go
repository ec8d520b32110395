package kubeenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// KubeVersion is the Kubernetes release the control plane binaries are
// built from (tools/kube) and the node reports.
const KubeVersion = "v1.37.2"

// BinEnv names the environment variable holding the directory of the
// control plane binaries; without it they are looked up where
// scripts/kube-tools builds them.
const BinEnv = "PGWAKE_KUBE_BIN"

var binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// errNoBinaries matches the error of a machine where scripts/kube-tools has
// not built the control plane yet.
var errNoBinaries = errors.New("kubernetes control plane binaries missing")

// binDir is where the control plane binaries are: $PGWAKE_KUBE_BIN, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/pgwake-ci/kube/<KubeVersion>, the
// directory scripts/kube-tools builds into.
func binDir() string {
	if d := os.Getenv(BinEnv); d != "" {
		return d
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = os.TempDir()
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "pgwake-ci", "kube", KubeVersion)
}

// findBinaries returns the path of each control plane binary by name,
// building them with scripts/kube-tools first when they are missing from
// the default directory (once per machine: 15-25 minutes on two cores;
// the script takes a lock, so test packages running in parallel wait for
// one build), or an error wrapping errNoBinaries that says how to build
// them.
func findBinaries() (map[string]string, error) {
	paths, err := lookBinaries()
	if err == nil || os.Getenv(BinEnv) != "" {
		return paths, err
	}
	script, ok := kubeToolsScript()
	if !ok {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "kubeenv: %v\nkubeenv: building them now with %s (once per machine)\n", err, script)
	cmd := exec.Command(script)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if berr := cmd.Run(); berr != nil {
		return nil, fmt.Errorf("%w (and %s failed: %v)", err, script, berr)
	}
	return lookBinaries()
}

// kubeToolsScript finds scripts/kube-tools above the working directory
// (a test's is its package's directory in this repository).
func kubeToolsScript() (string, bool) {
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		p := filepath.Join(dir, "scripts", "kube-tools")
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

func lookBinaries() (map[string]string, error) {
	dir := binDir()
	paths := make(map[string]string, len(binaries))
	var missing []string
	for _, b := range binaries {
		p := filepath.Join(dir, b)
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
			continue
		}
		paths[b] = p
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s not in %s; build them once per machine with scripts/kube-tools "+
			"(15-25 minutes on two cores; it prints the directory), or point $%s at a directory holding %s",
			errNoBinaries, strings.Join(missing, ", "), dir, BinEnv, strings.Join(binaries, ", "))
	}
	return paths, nil
}

// controlPlane is etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler, run as processes on loopback.
type controlPlane struct {
	sp    *spawner
	mu    sync.Mutex
	procs []*process // in start order; stopped in reverse

	server string // https://127.0.0.1:<port> of the API server
	caPEM  []byte // the API server's self-signed certificate
}

// controlPlaneFiles are the inputs the env prepares before starting the
// control plane.
type controlPlaneFiles struct {
	dir             string // working directory: data, logs, certificates
	adminToken      string
	tokenFile       string
	saKey, saPub    string
	certPEM, keyPEM []byte
	adminKubeconfig string // written by startControlPlane once the port is known
}

// startControlPlane starts the four processes and waits until each is
// ready: etcd answers /health, the API server /readyz (all post-start hooks
// done: RBAC roles, priority classes), the controller manager and scheduler
// /healthz. timings receives how long each step took.
func startControlPlane(ctx context.Context, bins map[string]string, f *controlPlaneFiles, timings *[]timing) (*controlPlane, error) {
	cp := &controlPlane{sp: newSpawner(), caPEM: f.certPEM}
	ok := false
	defer func() {
		if !ok {
			cp.stop()
		}
	}()
	step := func(name string, begin time.Time) {
		*timings = append(*timings, timing{name, time.Since(begin)})
	}

	// etcd
	begin := time.Now()
	clientPort, err := freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	// A fresh data directory: one left by an attempt that failed on a
	// taken port remembers that attempt's peer URL.
	dataDir := filepath.Join(f.dir, "etcd-data")
	if err := os.RemoveAll(dataDir); err != nil {
		return nil, err
	}
	etcd, err := cp.start(f.dir, "etcd", bins["etcd"],
		"--name=kubeenv",
		"--data-dir="+dataDir,
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubeenv="+peerURL,
		// Test data need not survive a power cut; fsync on a loaded
		// machine's disk is what makes etcd (and so every write) slow.
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	if err != nil {
		return nil, err
	}
	if err := etcd.waitReady(ctx, etcdURL+"/health", "", nil, `"health":"true"`); err != nil {
		return nil, err
	}
	step("etcd", begin)

	// kube-apiserver
	begin = time.Now()
	apiPort, err := freePort()
	if err != nil {
		return nil, err
	}
	cp.server = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	certDir := filepath.Join(f.dir, "apiserver")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, err
	}
	certFile, keyFile := filepath.Join(certDir, "serving.crt"), filepath.Join(certDir, "serving.key")
	if err := writeFile(certFile, f.certPEM); err != nil {
		return nil, err
	}
	if err := writeFile(keyFile, f.keyPEM); err != nil {
		return nil, err
	}
	api, err := cp.start(f.dir, "kube-apiserver", bins["kube-apiserver"],
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(apiPort),
		"--cert-dir="+certDir,
		"--tls-cert-file="+certFile,
		"--tls-private-key-file="+keyFile,
		"--token-auth-file="+f.tokenFile,
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+f.saPub,
		"--service-account-signing-key-file="+f.saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--allow-privileged=true",
		// The endpoint reconciler refuses a loopback advertise address;
		// without it the "kubernetes" Service has no endpoints, which
		// nothing here uses (Pods reach nothing by Service anyway).
		"--endpoint-reconciler-type=none",
		// This admission plugin taints every new Node not-ready until the
		// node-lifecycle controller, not run here, sees it Ready.
		"--disable-admission-plugins=TaintNodesByCondition",
		"--profiling=false",
	)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.certPEM)
	if err := api.waitReady(ctx, cp.server+"/readyz", f.adminToken, &tls.Config{RootCAs: pool}, "ok"); err != nil {
		return nil, err
	}
	step("kube-apiserver", begin)
	if err := writeKubeconfig(f.adminKubeconfig, cp.server, f.certPEM, "admin", f.adminToken); err != nil {
		return nil, err
	}

	// The controller manager and the scheduler need only the API server:
	// start them together.
	begin = time.Now()
	kcmPort, err := freePort()
	if err != nil {
		return nil, err
	}
	schedPort, err := freePort()
	if err != nil {
		return nil, err
	}
	kcm, err := cp.start(f.dir, "kube-controller-manager", bins["kube-controller-manager"],
		"--kubeconfig="+f.adminKubeconfig,
		"--leader-elect=false",
		// Only what the tests need: StatefulSets and their Pods' clean-up,
		// PV provisioning and binding, each namespace's default
		// ServiceAccount, namespace deletion, and the protection
		// controllers that remove the finalizers the API server's
		// StorageObjectInUseProtection admission puts on PVCs and PVs
		// (without them no PVC, and so no namespace, is ever deleted).
		"--controllers=statefulset,deployment,replicaset,garbagecollector,persistentvolume-binder,serviceaccount,namespace,pvc-protection,pv-protection",
		// In-tree kubernetes.io/host-path provisioner: PVs are directories
		// /tmp/hostpath_pv/<uuid> on this machine, removed by its deleter
		// when a PV with reclaimPolicy Delete is released.
		"--enable-hostpath-provisioner",
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(kcmPort),
		"--cert-dir="+filepath.Join(f.dir, "kcm"),
	)
	if err != nil {
		return nil, err
	}
	sched, err := cp.start(f.dir, "kube-scheduler", bins["kube-scheduler"],
		"--kubeconfig="+f.adminKubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(schedPort),
		"--cert-dir="+filepath.Join(f.dir, "scheduler"),
	)
	if err != nil {
		return nil, err
	}
	// Their serving certificates are generated on start: nothing to check
	// them against, and /healthz carries no secret.
	insecure := &tls.Config{InsecureSkipVerify: true}
	errs := make(chan error, 2)
	go func() {
		errs <- kcm.waitReady(ctx, "https://127.0.0.1:"+strconv.Itoa(kcmPort)+"/healthz", "", insecure, "ok")
	}()
	go func() {
		errs <- sched.waitReady(ctx, "https://127.0.0.1:"+strconv.Itoa(schedPort)+"/healthz", "", insecure, "ok")
	}()
	if err := errors.Join(<-errs, <-errs); err != nil {
		return nil, err
	}
	step("kube-controller-manager+kube-scheduler", begin)
	ok = true
	return cp, nil
}

func (cp *controlPlane) start(dir, name, bin string, args ...string) (*process, error) {
	p, err := startProcess(cp.sp, dir, name, bin, args...)
	if err != nil {
		return nil, err
	}
	cp.mu.Lock()
	cp.procs = append(cp.procs, p)
	cp.mu.Unlock()
	return p, nil
}

// failed returns an error for each process that has exited.
func (cp *controlPlane) failed() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var errs []error
	for _, p := range cp.procs {
		errs = append(errs, p.exitErr())
	}
	return errors.Join(errs...)
}

// stop stops the processes in reverse start order (the API server before
// etcd, so it does not spend its last seconds reconnecting) and ends the
// spawning thread.
func (cp *controlPlane) stop() {
	cp.mu.Lock()
	procs := cp.procs
	cp.procs = nil
	cp.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop(10 * time.Second)
	}
	if cp.sp != nil {
		cp.sp.close()
		cp.sp = nil
	}
}

// timing is how long one start-up step took.
type timing struct {
	step string
	d    time.Duration
}

func formatTimings(ts []timing) string {
	var b strings.Builder
	for i, t := range ts {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %v", t.step, t.d.Round(time.Millisecond))
	}
	return b.String()
}
