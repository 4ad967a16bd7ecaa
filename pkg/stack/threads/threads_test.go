package threads

import (
	"context"
	"sync"
	"testing"
	"time"
)

// load is a rig that plays intervals of a given load to a governor.
type load struct {
	s    Sample
	sets []int
	g    *Governor
}

const tick = 100 * time.Millisecond

func newLoad(most int) *load {
	l := &load{s: Sample{Conns: 34}} // 32 streams and iperf3's control connections
	l.g = New(most, tick, func() Sample { return l.s }, func(n int) { l.sets = append(l.sets, n) })
	return l
}

// interval plays one interval: cores of CPU, frames each way of the given
// sizes, then a tick.
func (l *load) interval(cores float64, rxFrames, rxSize, txFrames, txSize uint64) {
	l.s.CPU += time.Duration(cores * float64(tick))
	l.s.RxFrames += rxFrames
	l.s.RxBytes += rxFrames * rxSize
	l.s.TxFrames += txFrames
	l.s.TxBytes += txFrames * txSize
	l.g.Tick()
}

func (l *load) threads() int { return int(l.g.Stats().Threads.Load()) }

func TestStartsAtOne(t *testing.T) {
	l := newLoad(2)
	if len(l.sets) != 0 || l.threads() != 1 {
		t.Fatalf("a new governor set %v and reports %d threads, want nothing set and 1", l.sets, l.threads())
	}
}

// TestBulkSaturatedRaises: many streams into the pod (GRO'd frames in,
// ACKs out) with the thread saturated gets a second thread, after upAfter
// intervals, and only one more however long it lasts.
func TestBulkSaturatedRaises(t *testing.T) {
	l := newLoad(2)
	for i := range upAfter - 1 {
		l.interval(0.97, 20000, 16000, 15000, 66)
		if l.threads() != 1 {
			t.Fatalf("raised after %d interval(s), want %d", i+1, upAfter)
		}
	}
	l.interval(0.97, 20000, 16000, 15000, 66)
	if l.threads() != 2 {
		t.Fatalf("%d threads after %d saturated bulk intervals, want 2", l.threads(), upAfter)
	}
	for range 20 {
		l.interval(1.9, 20000, 16000, 15000, 66)
	}
	if l.threads() != 2 || l.g.Stats().Raised.Load() != 1 {
		t.Fatalf("%d threads, raised %d times: want 2 and once (max 2)", l.threads(), l.g.Stats().Raised.Load())
	}
	// Bulk out of the pod (GSO frames out, ACKs in) keeps it raised.
	for range 20 {
		l.interval(1.2, 15000, 66, 20000, 30000)
	}
	if l.threads() != 2 {
		t.Fatalf("lowered under bulk traffic out of the pod")
	}
}

// TestRequestsStayOnOne: a thread saturated by requests (small frames
// both ways) is not given a second: two threads cost requests more.
func TestRequestsStayOnOne(t *testing.T) {
	l := newLoad(2)
	for range 50 {
		l.interval(1.0, 40000, 120, 40000, 90)
	}
	if l.threads() != 1 || len(l.sets) != 0 {
		t.Fatalf("requests got %d threads (sets %v), want 1", l.threads(), l.sets)
	}
}

// TestBulkNotSaturatedStaysOnOne: bulk traffic over many connections
// that one thread keeps up with stays there: a second thread would only
// cost CPU.
func TestBulkNotSaturatedStaysOnOne(t *testing.T) {
	l := newLoad(2)
	for range 50 {
		l.interval(0.7, 20000, 60000, 10000, 66)
	}
	if l.threads() != 1 {
		t.Fatalf("one unsaturated stream got %d threads", l.threads())
	}
}

// TestLowersAtOnceForRequestsOrQuiet: once the traffic is requests, or
// none, the second thread goes at the next tick: requests pay for it from
// their first interval.
func TestLowersAtOnceForRequestsOrQuiet(t *testing.T) {
	for _, c := range []struct {
		name          string
		cores         float64
		frames, bytes uint64
	}{
		{"quiet", 0.01, 0, 0},
		{"requests", 1.4, 40000, 120},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newLoad(2)
			for range upAfter {
				l.interval(0.97, 20000, 16000, 15000, 66)
			}
			if l.threads() != 2 {
				t.Fatal("not raised")
			}
			l.interval(c.cores, c.frames, c.bytes, c.frames, c.bytes)
			if l.threads() != 1 || l.g.Stats().Lowered.Load() != 1 {
				t.Fatalf("%d threads, lowered %d times after one %s interval: want 1 and once", l.threads(), l.g.Stats().Lowered.Load(), c.name)
			}
			if got := l.sets; len(got) != 2 || got[0] != 2 || got[1] != 1 {
				t.Fatalf("set %v, want [2 1]", got)
			}
		})
	}
}

// TestLowersWhenBulkFitsOnOne: bulk traffic that one thread would carry
// lowers the count after downAfter intervals, and one such interval
// does not flap it.
func TestLowersWhenBulkFitsOnOne(t *testing.T) {
	l := newLoad(2)
	for range upAfter {
		l.interval(0.97, 20000, 16000, 15000, 66)
	}
	l.interval(0.5, 8000, 16000, 6000, 66)
	l.interval(1.5, 20000, 16000, 15000, 66)
	if l.threads() != 2 {
		t.Fatal("one light interval lowered it")
	}
	for i := range downAfter {
		if l.threads() != 2 {
			t.Fatalf("lowered after %d light interval(s), want %d", i, downAfter)
		}
		l.interval(0.5, 8000, 16000, 6000, 66)
	}
	if l.threads() != 1 {
		t.Fatalf("%d threads after %d light intervals, want 1", l.threads(), downAfter)
	}
}

// TestOneStreamStaysOnOne: one stream saturating the thread (two
// connections: the stream and iperf3's control) gains nothing from a
// second thread.
func TestOneStreamStaysOnOne(t *testing.T) {
	l := newLoad(2)
	l.s.Conns = 2
	for range 20 {
		l.interval(1.0, 20000, 60000, 10000, 66)
	}
	if l.threads() != 1 {
		t.Fatalf("one stream got %d threads", l.threads())
	}
}

// TestMaxOneNeverRaises: a governor for one thread (a one-CPU node) never
// changes anything.
func TestMaxOneNeverRaises(t *testing.T) {
	l := newLoad(1)
	for range 20 {
		l.interval(1.0, 20000, 16000, 15000, 66)
	}
	if l.threads() != 1 || len(l.sets) != 0 {
		t.Fatalf("%d threads, sets %v", l.threads(), l.sets)
	}
}

// TestSleepsWhileQuiet: at one thread on a quiet link the governor stops
// ticking (an idle stack wakes for nothing) until Wake, then ticks while
// frames flow, and sleeps again once they stop.
func TestSleepsWhileQuiet(t *testing.T) {
	var mu sync.Mutex
	var s Sample
	reads := 0
	flowing := false
	g := New(2, 2*time.Millisecond, func() Sample {
		mu.Lock()
		defer mu.Unlock()
		reads++
		if flowing {
			s.RxFrames += 1000
			s.RxBytes += 1000 * 200
		}
		return s
	}, func(int) {})
	count := func() int { mu.Lock(); defer mu.Unlock(); return reads }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	time.Sleep(50 * time.Millisecond)
	before := count()
	time.Sleep(100 * time.Millisecond)
	if n := count() - before; n != 0 {
		t.Fatalf("a quiet governor read %d samples in 100 ms (ticks of 2 ms): it should sleep", n)
	}
	mu.Lock()
	flowing = true
	mu.Unlock()
	g.Wake()
	time.Sleep(100 * time.Millisecond)
	if n := count() - before; n < 10 {
		t.Fatalf("%d samples in 100 ms after Wake with frames flowing, want ticks", n)
	}
	mu.Lock()
	flowing = false
	mu.Unlock()
	time.Sleep(50 * time.Millisecond)
	before = count()
	time.Sleep(100 * time.Millisecond)
	if n := count() - before; n != 0 {
		t.Fatalf("%d samples in 100 ms after the frames stopped: it should sleep again", n)
	}
}
