package proxy

// CancelKeys is the number of sessions whose cancel keys are registered.
func (s *Server) CancelKeys() int {
	s.cancels.mu.Lock()
	defer s.cancels.mu.Unlock()
	return len(s.cancels.keys)
}
