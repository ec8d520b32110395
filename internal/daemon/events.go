package daemon

import (
	"context"
	"sync"

	"github.com/pgwake/pgwake/internal/admin"
)

// hub fans project changes out to event-stream subscribers. Changes are
// coalesced per project: a slow subscriber gets each project's latest
// snapshot, never a backlog.
type hub struct {
	mu   sync.Mutex
	subs map[*subscriber]struct{}
}

type subscriber struct {
	mu      sync.Mutex
	pending map[string]bool
	wake    chan struct{} // capacity 1
}

func newHub() *hub { return &hub{subs: map[*subscriber]struct{}{}} }

// changed marks project as changed for every subscriber.
func (h *hub) changed(project string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		s.mu.Lock()
		s.pending[project] = true
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// Subscribe implements admin.Service.
func (d *Daemon) Subscribe(ctx context.Context) <-chan admin.StreamEvent {
	s := &subscriber{pending: map[string]bool{}, wake: make(chan struct{}, 1)}
	d.hub.mu.Lock()
	d.hub.subs[s] = struct{}{}
	d.hub.mu.Unlock()
	out := make(chan admin.StreamEvent, 16)
	go func() {
		defer close(out)
		defer func() {
			d.hub.mu.Lock()
			delete(d.hub.subs, s)
			d.hub.mu.Unlock()
		}()
		send := func(ev admin.StreamEvent) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		// Registered before the snapshot, so no change is lost between the
		// two.
		for _, p := range d.Projects() {
			if !send(admin.StreamEvent{Type: "project", Project: p}) {
				return
			}
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
			}
			s.mu.Lock()
			names := s.pending
			s.pending = map[string]bool{}
			s.mu.Unlock()
			for name := range names {
				ev := admin.StreamEvent{Type: "project"}
				p, err := d.Project(name)
				if err != nil {
					ev.Type, ev.Project = "removed", admin.Project{Name: name}
				} else {
					ev.Project = p
				}
				if !send(ev) {
					return
				}
			}
		}
	}()
	return out
}
