package kubeenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/moby/moby/client"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probeReadiness runs a container's readinessProbe every periodSeconds
// (after initialDelaySeconds) while ctx lasts, and sets the container's
// readiness as the kubelet does: not ready until successThreshold
// successes in a row, not ready again after failureThreshold failures in a
// row. exec runs through docker exec, tcpSocket dials, httpGet fetches, all
// against the Pod's IP. Liveness and startup probes are not run.
func (r *podRun) probeReadiness(ctx context.Context, c *ctrRun, id string) {
	pr := c.spec.ReadinessProbe
	period := time.Duration(max(pr.PeriodSeconds, 1)) * time.Second
	timeout := time.Duration(max(pr.TimeoutSeconds, 1)) * time.Second
	successes, failures := max(pr.SuccessThreshold, 1), max(pr.FailureThreshold, 1)
	if !sleepCtx(ctx, time.Duration(pr.InitialDelaySeconds)*time.Second) {
		return
	}
	ready := false
	var okRun, failRun int32
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		err := r.probe(ctx, c, id, &pr.ProbeHandler, timeout)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			okRun, failRun = okRun+1, 0
			if !ready && okRun >= successes {
				ready = true
				r.log.Info("readiness probe passed", "container", c.spec.Name)
				r.update(func() { c.ready = true })
			}
		} else {
			okRun, failRun = 0, failRun+1
			r.log.Debug("readiness probe failed", "container", c.spec.Name, "err", err)
			if ready && failRun >= failures {
				ready = false
				r.log.Info("readiness probe failing", "container", c.spec.Name, "err", err)
				r.update(func() { c.ready = false })
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// probe runs a probe handler once; nil is success.
func (r *podRun) probe(ctx context.Context, c *ctrRun, id string, h *corev1.ProbeHandler, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	host := r.podIP().String()
	switch {
	case h.Exec != nil:
		return r.probeExec(ctx, id, h.Exec.Command)
	case h.TCPSocket != nil:
		port, err := probePort(c.spec, h.TCPSocket.Port)
		if err != nil {
			return err
		}
		if h.TCPSocket.Host != "" {
			host = h.TCPSocket.Host
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	case h.HTTPGet != nil:
		g := h.HTTPGet
		port, err := probePort(c.spec, g.Port)
		if err != nil {
			return err
		}
		if g.Host != "" {
			host = g.Host
		}
		scheme := "http"
		if g.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		u := url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port)), Path: g.Path}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return err
		}
		for _, hd := range g.HTTPHeaders {
			req.Header.Add(hd.Name, hd.Value)
		}
		// The kubelet does not verify a probed server's certificate.
		tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
		_ = resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
		}
		return nil
	}
	return errors.New("probe handler not supported by the kubeenv node (exec, tcpSocket and httpGet are)")
}

// probeExec runs command in the container and succeeds on exit code 0.
func (r *podRun) probeExec(ctx context.Context, id string, command []string) error {
	docker := r.p.docker
	ex, err := docker.ExecCreate(ctx, id, client.ExecCreateOptions{Cmd: command, AttachStdout: true, AttachStderr: true})
	if err != nil {
		return err
	}
	hj, err := docker.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		// The output is not used; reading it to the end is waiting for
		// the command.
		_, _ = io.Copy(io.Discard, hj.Reader)
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	hj.Close()
	<-done
	if ctx.Err() != nil {
		return fmt.Errorf("command %q timed out", command)
	}
	code, err := r.p.execExitCode(ctx, ex.ID)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("command %q exited with %d", command, code)
	}
	return nil
}

// probePort resolves a probe's port, a number or the name of one of the
// container's ports.
func probePort(c corev1.Container, p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("port %q not found in container %s", p.StrVal, c.Name)
}
