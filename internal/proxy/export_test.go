package proxy

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
