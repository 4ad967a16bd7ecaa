package stack

import (
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
)

// TestMemRelease: the free heap goes back once per burst, after
// quietWindows quiet windows; probe-sized traffic neither counts as a
// burst nor keeps a window from being quiet.
func TestMemRelease(t *testing.T) {
	if quietWindows != 2 {
		t.Fatalf("the steps below assume quietWindows 2, not %d", quietWindows)
	}
	var m memRelease
	frames := uint64(0)
	reassembling := false
	step := func(n uint64, want bool) {
		t.Helper()
		frames += n
		if got := m.tick(frames, reassembling); got != want {
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
	// A fragment flood: the release waits for its reassemblies to time
	// out, however long the link has been quiet.
	step(100000, false)
	reassembling = true
	step(0, false)
	step(0, false)
	step(0, false)
	reassembling = false
	step(0, true)
	step(0, false)
}

// TestReleaseFreeHeapEmptiesPools: what sync.Pools held (after bulk
// traffic, megabytes of netstack's buffer chunks) is freed by the release,
// not kept alive in the pools' victim caches, where one collection alone
// leaves it.
func TestReleaseFreeHeapEmptiesPools(t *testing.T) {
	const chunks, size = 256, 64 << 10 // 16 MiB
	// No collection of its own while the pool fills: one would move the
	// chunks to the victim cache, the next drop them, before the release.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	var pool sync.Pool
	for range chunks {
		pool.Put(make([]byte, size))
	}
	ReleaseFreeHeap()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if ms.HeapAlloc > chunks*size/2 {
		t.Fatalf("heap still holds %d MiB after the release: the pool's %d MiB stayed live", ms.HeapAlloc>>20, chunks*size>>20)
	}
	runtime.KeepAlive(&pool)
}
