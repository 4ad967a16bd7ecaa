package enforce

import (
	"testing"
	"time"
)

// TestLogLimit: denialLogLines lines per window; the first line of a
// later window says how many went without one since the last line.
func TestLogLimit(t *testing.T) {
	var l logLimit
	t0 := time.Unix(1000, 0)
	written := 0
	for i := range 25 {
		ok, s := l.take(t0.Add(time.Duration(i) * time.Millisecond))
		if ok {
			written++
			if s != 0 {
				t.Fatalf("line %d says %d suppressed, want 0", written, s)
			}
		}
	}
	if written != denialLogLines {
		t.Fatalf("lines in one window: got %d, want %d", written, denialLogLines)
	}
	ok, s := l.take(t0.Add(denialLogWindow))
	if !ok || s != 25-denialLogLines {
		t.Fatalf("first denial of the next window: got line %v suppressed %d, want a line saying %d", ok, s, 25-denialLogLines)
	}
	if ok, s := l.take(t0.Add(denialLogWindow + time.Millisecond)); !ok || s != 0 {
		t.Fatalf("second line of the window: got %v suppressed %d, want a line saying 0", ok, s)
	}
	if l.total != 25-denialLogLines {
		t.Fatalf("total suppressed: got %d, want %d", l.total, 25-denialLogLines)
	}
	// A clock that went back starts a new window rather than muting
	// every line until it catches up.
	if ok, _ := l.take(t0.Add(-time.Hour)); !ok {
		t.Fatal("no line after the clock went back")
	}
}
