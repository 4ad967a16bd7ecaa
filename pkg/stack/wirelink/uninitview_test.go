package wirelink

import (
	"runtime"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
)

// TestUninitializedViewsSkipTheClear: the link reader's views come from
// gVisor's chunk pool without the clear NewViewSize does (patch 0002,
// docs/gvisor-patches.md), and NewViewSize, which the rest of netstack
// uses, still clears.
func TestUninitializedViewsSkipTheClear(t *testing.T) {
	// One P: a chunk put back is the next one taken (the pool's per-P
	// slot), unless the race detector's pool drops it, so try a few times.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	size := rxBufSizes[len(rxBufSizes)-1]
	dirty := func() {
		v := buffer.NewViewSize(size)
		b := v.AsSlice()
		for i := range b {
			b[i] = 0xaa
		}
		v.Release()
	}
	reused := false
	for range 50 {
		dirty()
		v := newRxView(size)
		if v.Size() != size {
			t.Fatalf("newRxView(%d) has %d bytes", size, v.Size())
		}
		reused = reused || v.AsSlice()[size-1] == 0xaa
		v.Release()
		dirty()
		w := buffer.NewViewSize(size)
		for i, c := range w.AsSlice() {
			if c != 0 {
				t.Fatalf("NewViewSize gave a byte %#x at %d: pooled chunks are no longer cleared for it", c, i)
			}
		}
		w.Release()
		if reused {
			return
		}
	}
	t.Fatal("newRxView never returned a reused chunk as it was: it clears them")
}
