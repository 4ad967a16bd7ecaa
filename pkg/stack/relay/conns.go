package relay

import (
	"io"
	"sync"
)

// connSet tracks live relays so that shutdown can close them.
type connSet struct {
	mu sync.Mutex // guards m
	m  map[io.Closer]struct{}
}

func (s *connSet) init() { s.m = make(map[io.Closer]struct{}) }

func (s *connSet) add(c io.Closer) {
	s.mu.Lock()
	s.m[c] = struct{}{}
	s.mu.Unlock()
}

func (s *connSet) remove(c io.Closer) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
}

func (s *connSet) closeAll() {
	s.mu.Lock()
	all := make([]io.Closer, 0, len(s.m))
	for c := range s.m {
		all = append(all, c)
	}
	s.mu.Unlock()
	for _, c := range all {
		c.Close()
	}
}
