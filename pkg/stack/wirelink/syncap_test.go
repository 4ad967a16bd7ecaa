package wirelink

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

// TestSYNPressureHeldByRate: once on, pressure stays on while SYNs keep
// arriving at pressureSYNRate or faster although netstack sends no more
// cookies (the fast path answers them all), and ends pressureHold after
// they slow down.
func TestSYNPressureHeldByRate(t *testing.T) {
	var sent uint64 = 1
	count := func() uint64 { return sent }
	var p synPressure
	t0 := time.Unix(1000, 0)
	p.on(t0, count) // first check: the count grew from 0
	perCheck := int(pressureSYNRate*pressureCheck.Seconds()) + 10
	now := t0
	for range 30 { // 3 s of flood, three times pressureHold
		for range perCheck {
			if !p.on(now, count) {
				t.Fatalf("off at %s into the flood", now.Sub(t0))
			}
		}
		now = now.Add(pressureCheck)
	}
	// The flood ends: a trickle of SYNs.
	end := now
	for now.Sub(end) < pressureHold+2*pressureCheck {
		now = now.Add(pressureCheck)
		p.on(now, count)
	}
	if p.on(now, count) {
		t.Fatalf("still on %s after the flood ended", now.Sub(end))
	}
}
