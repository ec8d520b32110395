package proxy

import "time"

// CancelKeys is the number of sessions whose cancel keys are registered.
func (s *Server) CancelKeys() int {
	s.cancels.mu.Lock()
	defer s.cancels.mu.Unlock()
	return len(s.cancels.keys)
}

// Closing is closed once a shutdown has begun.
func (s *Server) Closing() <-chan struct{} { return s.closingCh }

// StartupConns is the number of connections still in their startup phase.
func (s *Server) StartupConns() int { return s.startupLen() }

// SetClock makes the server's projects read the time from now. Call it
// before adding projects.
func (s *Server) SetClock(now func() time.Time) { s.env.now = now }

// Sweep runs one idle sweep now, every project's in turn, and returns
// when their sleep calls have.
func (s *Server) Sweep() {
	for _, p := range s.projectList() {
		p.maybeSleep()
	}
}

// SetStopAfter changes how long a tiered project stays paused before it
// is stopped.
func (s *Server) SetStopAfter(name string, d time.Duration) error {
	return s.setConfig(name, func(c *Project) { c.StopAfter = d })
}

// LoginTime is the time project's server took to log pgwake in last,
// which a wrong password at pgwake is answered in.
func (s *Server) LoginTime(name string) time.Duration {
	p := s.project(name)
	if p == nil {
		return 0
	}
	return p.loginTime()
}
