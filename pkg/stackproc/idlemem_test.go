package stackproc

import "testing"

// TestMemRelease: the free heap goes back once per burst, after
// quietWindows quiet windows; probe-sized traffic neither counts as a
// burst nor keeps a window from being quiet.
func TestMemRelease(t *testing.T) {
	if quietWindows != 2 {
		t.Fatalf("the steps below assume quietWindows 2, not %d", quietWindows)
	}
	var m memRelease
	frames := uint64(0)
	step := func(n uint64, want bool) {
		t.Helper()
		frames += n
		if got := m.tick(frames); got != want {
			t.Fatalf("after %d more frames (total %d): release %v, want %v", n, frames, got, want)
		}
	}
	step(0, false)     // idle from the start: nothing to give back
	step(50, false)    // probes only
	step(50000, false) // a burst: not quiet
	step(30000, false) // still busy
	step(20, false)    // one quiet window
	step(20, true)     // two: released
	step(0, false)     // quiet on: released already
	step(5000, false)  // a small burst ...
	step(0, false)
	step(0, false)    // ... is not worth a GC
	step(6000, false) // busy: the two together are
	step(0, false)
	step(300, false) // not quiet: the count starts again
	step(0, false)
	step(0, true)
}
