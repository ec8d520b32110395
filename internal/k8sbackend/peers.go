package k8sbackend

// Peer-aware idle: every pgwake process serving the namespace keeps one
// coordination.k8s.io Lease, renewed every third of its duration, whose
// annotation carries this process's use of each project (connections,
// whether it is waking it, when a client last came or went). A process
// puts a server to sleep only when no live peer's Lease shows a use; the
// proxy asks through backend.Shared. No other infrastructure is needed:
// the API server is the only thing every replica already reaches.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/pgwake/pgwake/internal/backend"
)

// Peer Leases: labelled as pgwake's, with the role that tells them from
// anything else pgwake might keep as a Lease.
const (
	LabelRole     = "dev.pgwake.role"
	rolePeer      = "peer"
	AnnotationUse = "dev.pgwake.use"
	// AnnotationCancel is "TAG ADDR": the tag this process puts in the
	// cancel keys it issues, and where it accepts CancelRequests.
	AnnotationCancel = "dev.pgwake.cancel"
	// AnnotationRun tells one run of a process from another.
	AnnotationRun   = "dev.pgwake.run"
	peerLeasePrefix = "pgwake-peer-"
)

// minGap spaces the Lease writes of one process.
const minGap = 100 * time.Millisecond

// DefaultLeaseDuration is how long a peer's published use counts after its
// last renewal when Options.LeaseDuration is not set.
const DefaultLeaseDuration = 15 * time.Second

var _ backend.Shared = (*Backend)(nil)

// publishedUse is one project's entry in a peer Lease's annotation.
type publishedUse struct {
	Conns      int   `json:"c,omitempty"`
	Waking     bool  `json:"w,omitempty"`
	LastActive int64 `json:"t,omitempty"` // unix milliseconds
}

// peers publishes this process's use of the projects and reads the others'.
type peers struct {
	b        *Backend
	id       string // this process's name among its peers (the Lease's holder)
	lease    string // its Lease's name
	duration time.Duration

	tag atomic.Uint32 // in the cancel keys this process issues; chosen by run

	mu      sync.Mutex
	addr    string // where this process accepts CancelRequests
	uses    map[string]backend.Use
	current *coordinationv1.Lease // as last written, for the next update
	failing bool                  // the last write failed (logged once)
	runID   string                // this run of the process, to tell a namesake's Lease from an earlier run's
	kick    chan struct{}
	done    chan struct{}

	cacheMu   sync.Mutex
	cached    []peerLease // the last list, for cancels
	cachedAge time.Time
}

// peerID names this process among the pgwake processes of the namespace:
// the Pod's name inside the cluster (unique among a Deployment's
// replicas), the host and instance outside it (two pgwakes on one laptop
// have two instances).
func peerID(explicit, instance string, inCluster bool) string {
	if explicit != "" {
		return explicit
	}
	if name := os.Getenv("POD_NAME"); name != "" {
		return name
	}
	host, _ := os.Hostname()
	if inCluster && host != "" {
		return host
	}
	if host == "" {
		host = "pgwake"
	}
	return host + "-" + instance
}

// leaseName makes a valid object name of a peer id: lowercase letters,
// digits and dashes, with a digest when the id had to be changed or cut.
func leaseName(id string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(id) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	name := strings.Trim(b.String(), "-")
	if name != id || len(name) > 40 {
		sum := sha256.Sum256([]byte(id))
		name = strings.Trim(name[:min(len(name), 40)], "-") + "-" + hex.EncodeToString(sum[:4])
	}
	return peerLeasePrefix + name
}

func newPeers(b *Backend, id string, duration time.Duration) *peers {
	if duration <= 0 {
		duration = DefaultLeaseDuration
	}
	var run [6]byte
	rand.Read(run[:])
	return &peers{
		b: b, id: id, lease: leaseName(id), duration: duration, runID: hex.EncodeToString(run[:]),
		uses: map[string]backend.Use{}, kick: make(chan struct{}, 1), done: make(chan struct{}),
	}
}

// run renews the Lease every third of its duration, and at once when
// kicked, until ctx ends; then it deletes the Lease, so peers need not
// wait for it to expire.
func (p *peers) run(ctx context.Context) {
	defer close(p.done)
	p.chooseTag(ctx, false)
	t := time.NewTicker(p.duration / 3)
	defer t.Stop()
	for n := 0; ; n++ {
		p.publish(ctx)
		if n == 1 {
			// Peers that started at the same time chose without seeing
			// each other; now their Leases are there.
			p.chooseTag(ctx, true)
		}
		// At most one write per minGap: a pool that opens and closes its
		// only connection in a loop costs the API server little.
		select {
		case <-ctx.Done():
		case <-time.After(minGap):
		}
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := p.b.cs.CoordinationV1().Leases(p.b.ns).Delete(dctx, p.lease, metav1.DeleteOptions{})
			cancel()
			if err != nil && !apierrors.IsNotFound(err) {
				p.b.log.Warn("delete peer lease", "lease", p.lease, "err", oneLine(err))
			}
			return
		case <-t.C:
		case <-p.kick:
		}
	}
}

// use records this process's use of a project. A project becoming used,
// or starting to wake, is published at once: a peer about to sleep it must
// see that. So is one becoming unused, so that a peer's sleep need not wait
// for the next renewal; other changes wait for it.
func (p *peers) use(project string, u backend.Use) {
	p.mu.Lock()
	old := p.uses[project]
	p.uses[project] = u
	p.mu.Unlock()
	if (old.Conns == 0) != (u.Conns == 0) || old.Waking != u.Waking {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

func (p *peers) forget(project string) {
	p.mu.Lock()
	delete(p.uses, project)
	p.mu.Unlock()
}

// publish writes the Lease: created when missing, else updated from the
// last version written (only this process writes it). A conflict or a
// Lease gone is retried at once: what is published may be a new use that
// a peer about to sleep the server must see.
func (p *peers) publish(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, p.duration/3)
	defer cancel()
	var err error
	for try := 0; try < 2; try++ {
		if err = p.write(ctx); err == nil {
			break
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if !p.failing {
			p.b.log.Warn("publish peer lease: once it is older than twice its duration, peers no longer count this process's clients",
				"lease", p.lease, "err", p.b.apiErr(err, "write lease "+p.lease))
		}
		p.failing = true
		return
	}
	if p.failing {
		p.b.log.Info("peer lease published again", "lease", p.lease)
	}
	p.failing = false
}

// write makes one attempt to write the Lease.
func (p *peers) write(ctx context.Context) error {
	p.mu.Lock()
	entries := make(map[string]publishedUse, len(p.uses))
	for name, u := range p.uses {
		e := publishedUse{Conns: u.Conns, Waking: u.Waking}
		if !u.LastActive.IsZero() {
			e.LastActive = u.LastActive.UnixMilli()
		}
		entries[name] = e
	}
	cur, name := p.current, p.lease
	ann := map[string]string{
		AnnotationCancel: strconv.Itoa(int(p.tag.Load())) + " " + p.addr,
		AnnotationRun:    p.runID,
	}
	p.mu.Unlock()
	data, err := json.Marshal(entries)
	if err != nil {
		return err
	}
	ann[AnnotationUse] = string(data)
	now := metav1.NowMicro()
	secs := int32((p.duration + time.Second - 1) / time.Second)
	leases := p.b.cs.CoordinationV1().Leases(p.b.ns)
	var out *coordinationv1.Lease
	if cur == nil {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:        name,
				Labels:      map[string]string{LabelManaged: "true", LabelRole: rolePeer},
				Annotations: ann,
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: &p.id, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now,
			},
		}
		out, err = leases.Create(ctx, l, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			if cur, err = leases.Get(ctx, name, metav1.GetOptions{}); err != nil {
				return err
			}
			if p.namesake(cur) {
				return errNamesake
			}
			// An earlier run of this process (the same Pod name) left it.
			out, err = p.update(ctx, cur, ann, now, secs)
		}
	} else {
		out, err = p.update(ctx, cur, ann, now, secs)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			p.current = nil // read it again, or create it
		}
		return err
	}
	p.current = out
	return nil
}

// errNamesake makes publish try again under the new name namesake chose.
var errNamesake = errors.New("another live pgwake has this peer name")

// namesake reports whether l, the Lease under this process's name, is a
// live one of another process that has the same peer name (two pgwakes
// given one kubernetes.peer): taking it over would hide each one's clients
// from the other. This process then moves to a name of its own.
func (p *peers) namesake(l *coordinationv1.Lease) bool {
	if l.Annotations[AnnotationRun] == p.runID || l.Spec.RenewTime == nil ||
		time.Since(l.Spec.RenewTime.Time) > time.Duration(ptrInt32(l.Spec.LeaseDurationSeconds))*time.Second {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.lease
	p.lease = leaseName(p.id + "-" + p.runID)
	p.b.log.Error("another live pgwake uses this peer name (kubernetes.peer): publishing under a name of this run's own; give each pgwake its own name",
		"peer", p.id, "lease", old, "now", p.lease)
	return true
}

func ptrInt32(v *int32) int32 {
	if v == nil {
		return 0
	}
	return *v
}

func (p *peers) update(ctx context.Context, cur *coordinationv1.Lease, ann map[string]string, now metav1.MicroTime, secs int32) (*coordinationv1.Lease, error) {
	l := cur.DeepCopy()
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	for k, v := range ann {
		l.Annotations[k] = v
	}
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &p.id, &secs, &now
	return p.b.cs.CoordinationV1().Leases(p.b.ns).Update(ctx, l, metav1.UpdateOptions{})
}

// peerLease is another process's Lease as read now.
type peerLease struct {
	*coordinationv1.Lease
	holder string
	age    time.Duration // since its last renewal
	dur    time.Duration
}

// listPeers lists the other processes' Leases. Long-expired ones (their
// process is gone for good) are deleted on the way and not returned.
func (p *peers) listPeers(ctx context.Context) ([]peerLease, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelManaged: "true", LabelRole: rolePeer}).String()
	list, err := p.b.cs.CoordinationV1().Leases(p.b.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, p.b.apiErr(err, "list peer leases")
	}
	now := time.Now()
	p.mu.Lock()
	own := p.lease
	p.mu.Unlock()
	var out []peerLease
	for i := range list.Items {
		l := &list.Items[i]
		if l.Name == own {
			continue
		}
		pl := peerLease{Lease: l, holder: l.Name, dur: p.duration}
		if l.Spec.HolderIdentity != nil {
			pl.holder = *l.Spec.HolderIdentity
		}
		if l.Spec.LeaseDurationSeconds != nil {
			pl.dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		if l.Spec.RenewTime != nil {
			pl.age = now.Sub(l.Spec.RenewTime.Time)
		} else {
			pl.age = now.Sub(l.CreationTimestamp.Time)
		}
		if pl.age > max(10*pl.dur, 10*time.Minute) {
			p.collect(l)
			continue
		}
		out = append(out, pl)
	}
	return out, nil
}

// peerUse sums the live peers' use of project. A Lease past its duration
// but not past twice that is in doubt (the peer may be alive and unable to
// renew); one older than that is a dead peer's and ignored.
func (p *peers) peerUse(ctx context.Context, project string) (backend.PeerUse, error) {
	list, err := p.listPeers(ctx)
	if err != nil {
		return backend.PeerUse{}, err
	}
	var pu backend.PeerUse
	for _, l := range list {
		switch {
		case l.age > 2*l.dur:
			continue // a dead peer's
		case l.age > l.dur:
			return backend.PeerUse{}, fmt.Errorf("%w: peer %s last renewed its lease %s ago (expired %s ago)",
				backend.ErrPeerInDoubt, l.holder, l.age.Round(time.Second), (l.age - l.dur).Round(time.Second))
		}
		var entries map[string]publishedUse
		if s := l.Annotations[AnnotationUse]; s != "" {
			if err := json.Unmarshal([]byte(s), &entries); err != nil {
				return backend.PeerUse{}, fmt.Errorf("%w: peer %s's lease has an unreadable %s annotation: %v", backend.ErrPeerInDoubt, l.holder, AnnotationUse, err)
			}
		}
		e, ok := entries[project]
		if !ok {
			continue
		}
		pu.Conns += e.Conns
		pu.Waking = pu.Waking || e.Waking
		if e.LastActive > 0 {
			if t := time.UnixMilli(e.LastActive); t.After(pu.LastActive) {
				pu.LastActive = t
			}
		}
		if e.Conns > 0 || e.Waking {
			pu.Peers = append(pu.Peers, l.holder)
		}
	}
	sort.Strings(pu.Peers)
	return pu, nil
}

// cancelOf reads a Lease's cancel annotation.
func cancelOf(l *coordinationv1.Lease) (tag byte, addr string) {
	t, a, _ := strings.Cut(l.Annotations[AnnotationCancel], " ")
	n, err := strconv.Atoi(t)
	if err != nil || n < 1 || n > 255 {
		return 0, ""
	}
	return byte(n), a
}

// chooseTag picks this process's cancel tag: derived from its id, moved on
// past the tags of live peers. Peers starting at the same moment cannot see
// each other's choice; resolving once their Leases exist, the one whose
// Lease name sorts first keeps a shared tag and the other moves on. Keys
// issued meanwhile keep the old tag: their cancels may then be dropped.
func (p *peers) chooseTag(ctx context.Context, resolve bool) {
	lctx, cancel := context.WithTimeout(ctx, p.duration/3)
	defer cancel()
	list, err := p.listPeers(lctx)
	if err != nil {
		list = nil
	}
	p.mu.Lock()
	own := p.lease
	p.mu.Unlock()
	taken := map[byte]bool{}
	clash := false
	tag := byte(p.tag.Load())
	for _, l := range list {
		if l.age > 2*l.dur {
			continue
		}
		t, _ := cancelOf(l.Lease)
		if t == 0 {
			continue
		}
		taken[t] = true
		if t == tag && l.Name < own {
			clash = true
		}
	}
	if resolve && !clash {
		return
	}
	if !resolve {
		sum := sha256.Sum256([]byte(p.id))
		tag = sum[0]%255 + 1
	}
	for i := 0; i < 255 && taken[tag]; i++ {
		tag = tag%255 + 1
	}
	p.tag.Store(uint32(tag))
	if resolve {
		p.b.log.Info("cancel tag shared with a peer; moved to another", "tag", tag)
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// cancelPeers returns where the peers issuing tag accept CancelRequests:
// live ones, and those only just expired, which may still carry sessions.
// It reads a list at most a second old: cancels come from anyone, and must
// not become a flood of list calls. This process's own address is never
// among them, so a cancel cannot come back to it.
func (p *peers) cancelPeers(ctx context.Context, tag byte) ([]string, error) {
	p.cacheMu.Lock()
	list := p.cached
	if time.Since(p.cachedAge) > time.Second {
		fresh, err := p.listPeers(ctx)
		if err != nil {
			p.cacheMu.Unlock()
			return nil, err
		}
		list, p.cached, p.cachedAge = fresh, fresh, time.Now()
	}
	p.cacheMu.Unlock()
	p.mu.Lock()
	self := p.addr
	p.mu.Unlock()
	var addrs []string
	for _, l := range list {
		if t, addr := cancelOf(l.Lease); t == tag && addr != "" && addr != self && l.age <= 2*l.dur {
			addrs = append(addrs, addr)
		}
	}
	return addrs, nil
}

// collect deletes a Lease long expired: its process is gone for good. The
// precondition keeps a Lease that was renewed meanwhile.
func (p *peers) collect(l *coordinationv1.Lease) {
	rv := l.ResourceVersion
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := p.b.cs.CoordinationV1().Leases(p.b.ns).Delete(ctx, l.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{ResourceVersion: &rv},
		})
		if err == nil {
			p.b.log.Info("deleted a long-expired peer lease", "lease", l.Name)
		}
	}()
}

// Use implements backend.Shared.
func (b *Backend) Use(project string, u backend.Use) {
	if b.peers != nil {
		b.peers.use(project, u)
	}
}

// PeerUse implements backend.Shared.
func (b *Backend) PeerUse(ctx context.Context, project string) (backend.PeerUse, error) {
	if b.peers == nil {
		return backend.PeerUse{}, nil
	}
	return b.peers.peerUse(ctx, project)
}

// CancelTag implements proxy.CancelRouter: the tag in the cancel keys this
// process issues, zero until its peers were read once.
func (b *Backend) CancelTag() byte {
	if b.peers == nil {
		return 0
	}
	return byte(b.peers.tag.Load())
}

// CancelPeers implements proxy.CancelRouter.
func (b *Backend) CancelPeers(ctx context.Context, tag byte) ([]string, error) {
	if b.peers == nil {
		return nil, nil
	}
	return b.peers.cancelPeers(ctx, tag)
}

// Advertise says where this process accepts CancelRequests (its proxy's
// address as its peers reach it); published with its Lease.
func (b *Backend) Advertise(addr string) {
	if b.peers == nil {
		return
	}
	b.peers.mu.Lock()
	b.peers.addr = addr
	b.peers.mu.Unlock()
	select {
	case b.peers.kick <- struct{}{}:
	default:
	}
}

// Peer is this process's name among the pgwake processes of the
// namespace, and its Lease's.
func (b *Backend) Peer() (id, lease string) {
	if b.peers == nil {
		return "", ""
	}
	b.peers.mu.Lock()
	defer b.peers.mu.Unlock()
	return b.peers.id, b.peers.lease
}
