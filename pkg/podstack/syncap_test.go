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
