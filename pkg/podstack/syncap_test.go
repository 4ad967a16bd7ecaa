package podstack

import (
	"testing"
	"time"
)

func TestSynBucket(t *testing.T) {
	var b synBucket
	now := time.Unix(1000, 0)
	passed := 0
	for range synBurst + 100 {
		if b.take(now) {
			passed++
		}
	}
	if passed != synBurst {
		t.Errorf("burst at one instant: got %d SYNs through, want %d", passed, synBurst)
	}
	// One second later: a second's worth, capped at the burst.
	now = now.Add(100 * time.Millisecond)
	passed = 0
	for range synRate {
		if b.take(now) {
			passed++
		}
	}
	if want := synRate / 10; passed != want {
		t.Errorf("after 100 ms: got %d SYNs through, want %d", passed, want)
	}
}

// TestSYNPressure: the fast path takes every SYN from the first check
// that sees netstack's cookie count grow until pressureHold after it last
// grew, and none before.
func TestSYNPressure(t *testing.T) {
	var sent uint64
	count := func() uint64 { return sent }
	var p synPressure
	t0 := time.Unix(1000, 0)
	if p.on(t0, count) {
		t.Fatal("on before any cookie")
	}
	sent = 5 // the listener's backlog filled: netstack sends cookies
	if p.on(t0.Add(50*time.Millisecond), count) {
		t.Fatal("on before the next check")
	}
	if !p.on(t0.Add(pressureCheck), count) {
		t.Fatal("off although the cookie count grew")
	}
	// The fast path answers now, so netstack's count stays put.
	if !p.on(t0.Add(pressureCheck+pressureHold-time.Millisecond), count) {
		t.Fatal("off before pressureHold ran out")
	}
	if p.on(t0.Add(pressureCheck+pressureHold), count) {
		t.Fatal("still on pressureHold after the count last grew")
	}
	if (&synPressure{}).on(t0, nil) {
		t.Fatal("on without a cookie counter")
	}
}
