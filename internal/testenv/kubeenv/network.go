package kubeenv

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
)

// podNetwork is the Docker bridge network the node's Pods live on, with
// the env's own address allocation: a Pod's IP is picked when the node
// accepts the Pod, as a real kubelet's sandbox gets it before any
// container starts, so status.podIP is known for the environment
// (valueFrom.fieldRef) and stays the same across container restarts.
// Docker assigns a chosen address only on a network whose subnet the user
// configured; the subnet is one the engine itself picks as free.
type podNetwork struct {
	name    string
	id      string
	subnet  netip.Prefix
	gateway netip.Addr

	mu   sync.Mutex
	used map[netip.Addr]bool
	next netip.Addr // round robin, so a released address is not reused at once
}

// createNetwork makes the network: first without a subnet, to learn one the
// engine considers free, then again with that subnet configured.
func createNetwork(ctx context.Context, cli *client.Client, name string, labels map[string]string) (*podNetwork, error) {
	var lastErr error
	for range 5 {
		probe, err := cli.NetworkCreate(ctx, name, client.NetworkCreateOptions{Driver: "bridge", Labels: labels})
		if err != nil {
			return nil, fmt.Errorf("create docker network %s: %w", name, err)
		}
		info, err := cli.NetworkInspect(ctx, probe.ID, client.NetworkInspectOptions{})
		_, rmErr := cli.NetworkRemove(ctx, probe.ID, client.NetworkRemoveOptions{})
		if err != nil || rmErr != nil {
			return nil, fmt.Errorf("docker network %s: %w", name, errors.Join(err, rmErr))
		}
		var subnet netip.Prefix
		for _, c := range info.Network.IPAM.Config {
			if c.Subnet.Addr().Is4() {
				subnet = c.Subnet.Masked()
				break
			}
		}
		if !subnet.IsValid() || subnet.Bits() > 24 {
			return nil, fmt.Errorf("docker network %s: the engine offered no IPv4 subnet of /24 or larger (%v)", name, info.Network.IPAM.Config)
		}
		gw := subnet.Addr().Next()
		res, err := cli.NetworkCreate(ctx, name, client.NetworkCreateOptions{
			Driver: "bridge",
			Labels: labels,
			IPAM:   &network.IPAM{Config: []network.IPAMConfig{{Subnet: subnet, Gateway: gw}}},
		})
		if err != nil {
			// Another network took the subnet in between: try again.
			lastErr = err
			continue
		}
		return &podNetwork{
			name: name, id: res.ID, subnet: subnet, gateway: gw,
			used: map[netip.Addr]bool{}, next: gw.Next(),
		}, nil
	}
	return nil, fmt.Errorf("create docker network %s: %w", name, lastErr)
}

// allocate returns a free address of the subnet.
func (n *podNetwork) allocate() (netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	first := n.gateway.Next()
	a := n.next
	for range 1 << (32 - n.subnet.Bits()) {
		if !n.subnet.Contains(a) || isBroadcast(n.subnet, a) {
			a = first
		}
		if !n.used[a] {
			n.used[a] = true
			n.next = a.Next()
			return a, nil
		}
		a = a.Next()
	}
	return netip.Addr{}, fmt.Errorf("docker network %s: no free address in %s", n.name, n.subnet)
}

func (n *podNetwork) release(a netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.used, a)
}

func isBroadcast(p netip.Prefix, a netip.Addr) bool {
	b := a.As4()
	host := 32 - p.Bits()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	mask := uint32(1)<<host - 1
	return v&mask == mask
}
