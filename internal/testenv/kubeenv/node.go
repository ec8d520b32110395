package kubeenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"time"

	"github.com/moby/moby/client"
	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// simNode is the simulated kubelet: a virtual-kubelet node whose provider
// runs Pods on Docker, and the kubelet API (logs, exec, port-forward) it
// serves over HTTPS on loopback for the API server.
type simNode struct {
	name   string
	vk     *nodeutil.Node
	prov   *provider
	srv    *http.Server
	kube   kubernetes.Interface
	cancel context.CancelFunc
}

// nodeConfig is what startNode needs.
type nodeConfig struct {
	name    string
	envID   string
	dir     string
	labels  map[string]string // on every Docker object
	kube    kubernetes.Interface
	docker  *client.Client
	network *podNetwork
	log     *slog.Logger
}

// startNode registers the node and returns once virtual-kubelet reports it
// ready (pod controller running, Node object Ready).
func startNode(ctx context.Context, nc nodeConfig) (_ *simNode, err error) {
	// Listening first gives the port to put in the Node's status, with no
	// window for another process to take it.
	ln, err := net.Listen("tcp", nodeIP+":0")
	if err != nil {
		return nil, fmt.Errorf("kubelet API listener: %w", err)
	}
	defer func() {
		if err != nil {
			_ = ln.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	certPEM, keyPEM, err := selfSigned(nc.name, nodeIP, "localhost", nc.name)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}

	engine := "docker"
	if v, err := nc.docker.ServerVersion(ctx, client.ServerVersionOptions{}); err == nil {
		engine = "docker://" + v.Version
	}

	vkCtx, cancel := context.WithCancel(vklog.WithLogger(context.Background(), vkLogger{nc.log.With("component", "virtual-kubelet")}))
	defer func() {
		if err != nil {
			cancel()
		}
	}()
	prov := &provider{
		docker:    nc.docker,
		kube:      nc.kube,
		net:       nc.network,
		envID:     nc.envID,
		nodeName:  nc.name,
		dir:       nc.dir,
		baseLbl:   nc.labels,
		log:       nc.log.With("component", "provider"),
		pods:      map[string]*podRun{},
		claimDirs: map[string]bool{},
	}
	prov.ctx, prov.shutdown = context.WithCancel(vkCtx)

	mux := http.NewServeMux()
	vk, err := nodeutil.NewNode(nc.name,
		func(pc nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
			describeNode(pc.Node, port, engine)
			return prov, nil, nil // nil NodeProvider: virtual-kubelet's own, which marks the node Ready
		},
		nodeutil.WithClient(nc.kube),
		nodeutil.AttachProviderRoutes(mux),
		func(cfg *nodeutil.NodeConfig) error {
			// The provider reads Secrets and ConfigMaps through the API
			// itself, as the kubelet does, and knows the Pod's IP before
			// its containers start (status.podIP).
			cfg.SkipDownwardAPIResolution = true
			cfg.NumWorkers = 4
			return nil
		},
	)
	if err != nil {
		return nil, fmt.Errorf("virtual-kubelet node: %w", err)
	}

	// The kubelet API, served here rather than by nodeutil so that the
	// listener above is used and handlers log to the env's log. Without
	// --kubelet-client-certificate the API server presents no client
	// certificate, and it accepts this self-signed one as it has no
	// --kubelet-certificate-authority; the API is not authenticated (it
	// listens on loopback, for tests).
	srv := &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 30 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return vkCtx },
		ErrorLog:          log.New(slogWriter{nc.log.With("component", "kubelet-api")}, "", 0),
	}
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			nc.log.Error("kubelet API server", "err", err)
		}
	}()

	n := &simNode{name: nc.name, vk: vk, prov: prov, srv: srv, kube: nc.kube, cancel: cancel}
	go func() {
		if err := vk.Run(vkCtx); err != nil && vkCtx.Err() == nil {
			nc.log.Error("virtual-kubelet stopped", "err", err)
		}
	}()
	if err := vk.WaitReady(ctx, 0); err != nil {
		n.stop()
		return nil, fmt.Errorf("node %s not ready: %w", nc.name, err)
	}
	return n, nil
}

// describeNode fills in what the Node object says about the node.
func describeNode(n *corev1.Node, port int, engine string) {
	res := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("8"),
		corev1.ResourceMemory:           resource.MustParse("16Gi"),
		corev1.ResourcePods:             resource.MustParse("110"),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	n.Labels["kubernetes.io/os"] = "linux"
	n.Labels["kubernetes.io/arch"] = runtime.GOARCH
	n.Labels["type"] = "kubeenv"
	n.Status.Capacity = res
	n.Status.Allocatable = res.DeepCopy()
	// No Hostname address: the API server tries that type first and the
	// node's name resolves nowhere.
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP}}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
	n.Status.NodeInfo = corev1.NodeSystemInfo{
		KubeletVersion:          KubeVersion,
		OperatingSystem:         "linux",
		Architecture:            runtime.GOARCH,
		ContainerRuntimeVersion: engine,
		OSImage:                 "pgwake kubeenv (virtual-kubelet on Docker)",
	}
	now := metav1.Now()
	for i, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			continue
		}
		c.Status = corev1.ConditionFalse
		c.Reason = "KubeenvNode"
		c.LastHeartbeatTime, c.LastTransitionTime = now, now
		if c.Type == corev1.NodeNetworkUnavailable {
			c.Reason = "RouteCreated"
		}
		n.Status.Conditions[i] = c
	}
}

// stop stops the node: virtual-kubelet, the kubelet API, the Pods'
// goroutines (containers are left to the env to remove), and deletes the
// Node object and its Lease, without which the node would stay Ready in
// the API.
func (n *simNode) stop() {
	n.prov.stop(30 * time.Second)
	n.cancel()
	select {
	case <-n.vk.Done():
	case <-time.After(30 * time.Second):
	}
	_ = n.srv.Close()
}

// deleteFromAPI removes the Node object and its Lease.
func (n *simNode) deleteFromAPI(ctx context.Context) error {
	var errs []error
	if err := n.kube.CoreV1().Nodes().Delete(ctx, n.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete node %s: %w", n.name, err))
	}
	if err := n.kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, n.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete lease %s: %w", n.name, err))
	}
	return errors.Join(errs...)
}

// slogWriter turns the HTTP server's error log lines into slog records.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Warn(string(p))
	return len(p), nil
}
