package stack

import (
	"context"
	"runtime"
	"runtime/debug"
	"time"
)

// Go keeps the heap that a burst of traffic grew to for reuse, and returns
// it to the kernel only slowly: minutes after a burst, a stack still holds
// well above its idle RSS, little of it live (docs/performance.md, "What
// a pod's stack costs"). With one stack per pod, that is memory a node
// pays for every pod that was ever busy. So when the link goes quiet
// after a burst, the stack hands the free heap back once.
const (
	// memCheckEvery is the window over which the link counts as quiet.
	memCheckEvery = 15 * time.Second
	// quietPackets: a window with fewer frames both ways is quiet.
	// kubelet's probes (one connection every 10 s) stay below it.
	quietPackets = 200
	// quietWindows: the release waits for this many quiet windows in a
	// row, because what closing connections still hold (their unsent
	// data) is freed some 20 s after the traffic stops.
	quietWindows = 2
	// burstPackets: what the link must have moved since the last release
	// for another to be worth a forced GC.
	burstPackets = 10000
)

// memRelease decides, from the link's frame count at the end of each
// window, when to release the free heap: once quietWindows quiet windows
// follow at least burstPackets frames, and no reassembly a fragment
// opened can still hold memory (a fragment flood's reassemblies stay up
// to 30 s, IPv6's 60 s, after the link went quiet: released before, their
// memory would stay with the process until the next burst).
type memRelease struct {
	last, atRelease uint64
	quiet           int  // quiet windows in a row
	deferred        bool // a release waits for reassembly to end
}

// tick takes the frame count and whether the reassemblies may still hold
// fragments now.
func (m *memRelease) tick(frames uint64, reassembling bool) bool {
	if frames-m.last < quietPackets {
		m.quiet++
	} else {
		m.quiet = 0
	}
	m.last = frames
	due := (m.quiet == quietWindows || m.deferred && m.quiet > quietWindows) && frames-m.atRelease >= burstPackets
	m.deferred = due && reassembling
	if due && !reassembling {
		m.atRelease = frames
		return true
	}
	return false
}

// releaseWhenQuiet runs until ctx ends, returning the free heap to the
// kernel (a forced GC) when the link goes quiet after a burst.
func (d *Daemon) releaseWhenQuiet(ctx context.Context) {
	t := time.NewTicker(memCheckEvery)
	defer t.Stop()
	var m memRelease
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		frames := d.stack.WireStats.RxPackets.Load() + d.stack.WireStats.TxPackets.Load()
		if m.tick(frames, time.Now().Before(d.stack.ReassemblyHeldUntil())) {
			ReleaseFreeHeap()
		}
	}
}

// ReleaseFreeHeap collects twice and returns the free heap to the kernel.
// The first collection only moves what sync.Pools hold (netstack's buffer
// chunks, the relay's copy buffers: megabytes after bulk traffic) to
// their victim caches; the second frees it. After one alone, that memory
// stayed live until a collection that an idle stack's heap never reaches.
func ReleaseFreeHeap() {
	runtime.GC()
	debug.FreeOSMemory()
}
