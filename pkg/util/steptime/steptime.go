// Package steptime times the steps of a procedure for one log line: with
// many pods starting at once, it says which step waits. It is a package of
// its own because two processes use it (the plugin's ADD and the stack's
// start) and neither may link the other.
package steptime

import (
	"log/slog"
	"time"
)

// Steps records how long each step took. The zero value is not usable:
// call Start.
type Steps struct {
	start, last time.Time
	attrs       []any
}

// Start begins timing at now.
func Start() *Steps {
	now := time.Now()
	return &Steps{start: now, last: now}
}

// Done records the time since the previous step (or Start) under name.
func (s *Steps) Done(name string) {
	now := time.Now()
	s.attrs = append(s.attrs, slog.Duration(name, now.Sub(s.last).Round(100*time.Microsecond)))
	s.last = now
}

// Attr is the steps and their total as one log attribute named key.
func (s *Steps) Attr(key string) slog.Attr {
	return slog.Group(key, append(s.attrs, slog.Duration("total", time.Since(s.start).Round(100*time.Microsecond)))...)
}
