package governor

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

// pollLoad is a load whose governor switches busy polling on a node of
// two CPUs; others is the node's busy time outside the stack each
// interval, in cores.
type pollLoad struct {
	*load
	polls []bool
}

func newPollLoad() *pollLoad {
	l := &pollLoad{load: newLoad(2)}
	l.g.BusyPoll(2, func(on bool) { l.polls = append(l.polls, on) })
	l.polls = l.polls[:0] // BusyPoll starts from off
	return l
}

func (l *pollLoad) intervalOn(others, cores float64, rxFrames, rxSize, txFrames, txSize uint64) {
	l.intervalWaiting(others, cores, 0.3, rxFrames, rxSize, txFrames, txSize)
}

// intervalWaiting is intervalOn with tasks waiting for a CPU wait of the
// interval (0.3: redis on two CPUs).
func (l *pollLoad) intervalWaiting(others, cores, wait float64, rxFrames, rxSize, txFrames, txSize uint64) {
	l.s.NodeBusy += time.Duration((others + cores) * float64(tick))
	l.s.NodeWait += time.Duration(wait * float64(tick))
	l.interval(cores, rxFrames, rxSize, txFrames, txSize)
}

func (l *pollLoad) polling() bool { return l.g.Stats().BusyPoll.Load() }

// TestBusyPollStartsOffAndForRequests: requests on one thread with idle
// CPU on the node turn busy polling on from their first interval; it
// stays on while they flow, but for one probe interval in probeEvery, and
// goes at once when they stop.
func TestBusyPollStartsOffAndForRequests(t *testing.T) {
	var set []bool
	g := New(2, tick, func() Sample { return Sample{} }, func(int) {})
	g.BusyPoll(2, func(on bool) { set = append(set, on) })
	if len(set) != 1 || set[0] || g.Stats().BusyPoll.Load() {
		t.Fatalf("BusyPoll set %v, on %v: want it turned off at once", set, g.Stats().BusyPoll.Load())
	}
	l := newPollLoad()
	l.intervalOn(0.5, 0.6, 3000, 120, 3000, 90) // a round trip at a time: 1.1 cores busy
	if !l.polling() {
		t.Fatal("requests with 0.9 core idle did not turn busy polling on")
	}
	var states []bool
	for range 3 * probeEvery {
		l.intervalOn(0.4, 0.8, 3000, 120, 3000, 90)
		states = append(states, l.polling())
	}
	off := 0
	for i, on := range states {
		if !on {
			off++
			if i > 0 && !states[i-1] {
				t.Fatalf("off two intervals in a row under steady requests: %v", states)
			}
		}
	}
	if off < 2 || off > 3 || l.g.Stats().Threads.Load() != 1 {
		t.Fatalf("%d probe intervals in %d, %d threads: want one per %d, one thread (%v)", off, len(states), l.g.Stats().Threads.Load(), probeEvery, states)
	}
	l.intervalOn(0.05, 0.01, 10, 100, 10, 100)
	if l.polling() {
		t.Fatalf("still on after the requests stopped")
	}
}

// TestBusyPollNeedsIdleCPU: the node's idle CPU over an interval without
// polling decides, the stack's own CPU counted as busy: under redis on two
// CPUs (client, server and stack, 1.75 cores) it stays off, though the
// others alone left a core.
func TestBusyPollNeedsIdleCPU(t *testing.T) {
	l := newPollLoad()
	l.intervalOn(1.2, 0.4, 3000, 120, 3000, 90)
	if l.polling() {
		t.Fatal("on with 0.4 core idle")
	}
	l.intervalOn(0.9, 0.85, 3000, 120, 3000, 90)
	if l.polling() {
		t.Fatal("on with 0.25 core idle (the stack's own CPU is not idle)")
	}
	l.intervalOn(0.5, 0.9, 3000, 120, 3000, 90)
	if l.polling() {
		t.Fatal("on with 0.6 core idle (one of redis's noisier intervals)")
	}
	l.intervalOn(0.3, 0.9, 3000, 120, 3000, 90)
	if !l.polling() {
		t.Fatal("off with 0.8 core idle")
	}
}

// TestBusyPollProbeSeesTheIdleGone: while polling, the node got busy
// without its tasks waiting much; the next probe sees no idle and keeps
// it off.
func TestBusyPollProbeSeesTheIdleGone(t *testing.T) {
	l := newPollLoad()
	l.intervalOn(0.3, 0.5, 3000, 120, 3000, 90)
	for range probeEvery - 1 {
		l.intervalWaiting(1.0, 1.0, 0.2, 3000, 120, 3000, 90)
		if !l.polling() {
			t.Fatal("turned off before the probe, with tasks waiting 20 % of the time")
		}
	}
	l.intervalWaiting(1.0, 1.0, 0.2, 3000, 120, 3000, 90)
	if l.polling() {
		t.Fatalf("no probe after %d intervals on", probeEvery)
	}
	for range 3 {
		l.intervalWaiting(1.1, 0.8, 0.2, 3000, 120, 3000, 90)
		if l.polling() {
			t.Fatal("turned on again with 0.1 core idle")
		}
	}
}

// TestBusyPollNotWhereTasksWait: a node whose tasks wait for a CPU keeps
// it off, or turns it off, whatever its idle time says.
func TestBusyPollNotWhereTasksWait(t *testing.T) {
	l := newPollLoad()
	l.intervalWaiting(0.3, 0.5, 0.45, 3000, 120, 3000, 90)
	if l.polling() {
		t.Fatal("turned on with tasks waiting 45 % of the interval")
	}
	l.intervalWaiting(0.3, 0.5, 0.35, 3000, 120, 3000, 90)
	if !l.polling() {
		t.Fatal("off with tasks waiting 35 % of the interval and 1.2 cores idle")
	}
	l.intervalWaiting(0.3, 0.5, 0.45, 3000, 120, 3000, 90)
	if !l.polling() {
		t.Fatal("turned off at 45 %, under waitKeep")
	}
	l.intervalWaiting(0.3, 0.5, 0.6, 3000, 120, 3000, 90)
	if l.polling() {
		t.Fatal("kept on with tasks waiting 60 % of the interval")
	}
}

// TestBusyPollOffForBulkAndTwoThreads: bulk traffic turns it off at once
// (the poller would spin on the receiving application's core), and a
// second thread never polls.
func TestBusyPollOffForBulkAndTwoThreads(t *testing.T) {
	l := newPollLoad()
	l.intervalOn(0.3, 0.5, 3000, 120, 3000, 90)
	if !l.polling() {
		t.Fatal("requests did not turn it on")
	}
	l.intervalOn(0.3, 0.9, 20000, 16000, 15000, 66) // one stream into the pod
	if l.polling() {
		t.Fatal("bulk traffic kept it on")
	}
	for range upAfter {
		l.intervalOn(0.0, 0.97, 20000, 16000, 15000, 66)
	}
	if l.g.Stats().Threads.Load() != 2 || l.polling() {
		t.Fatalf("%d threads, polling %v: want 2 and off", l.g.Stats().Threads.Load(), l.polling())
	}
}

// TestBusyPollOffWithoutTheNodesLoad: a stack that cannot read the
// node's load (NodeBusy zero or going backwards) never polls.
func TestBusyPollOffWithoutTheNodesLoad(t *testing.T) {
	l := newPollLoad()
	l.interval(0.5, 3000, 120, 3000, 90)
	if l.polling() {
		t.Fatal("on without the node's load")
	}
	l.s.NodeBusy = time.Hour
	l.intervalOn(0.1, 0.5, 3000, 120, 3000, 90)
	l.s.NodeBusy = time.Minute
	l.interval(0.5, 3000, 120, 3000, 90)
	if l.polling() {
		t.Fatal("on with the node's busy time going backwards")
	}
}

// TestRaisesOneAtATimeUpToMax: on a larger node the count climbs one
// thread at a time, each only once the threads it has are all saturated,
// and stops at the most it was given.
func TestRaisesOneAtATimeUpToMax(t *testing.T) {
	l := newLoad(4)
	for range 10 {
		l.interval(1.5, 40000, 16000, 30000, 66) // 1.5 cores: two threads' worth, not three
	}
	if l.threads() != 2 {
		t.Fatalf("%d threads at 1.5 cores, want 2", l.threads())
	}
	for range 10 {
		l.interval(2.7, 40000, 16000, 30000, 66)
	}
	if l.threads() != 4 || l.g.Stats().Raised.Load() != 3 {
		t.Fatalf("%d threads, raised %d times under saturated bulk, want 4 and 3", l.threads(), l.g.Stats().Raised.Load())
	}
	for range 10 {
		l.interval(3.9, 40000, 16000, 30000, 66)
	}
	if l.threads() != 4 {
		t.Fatalf("%d threads beyond the most it was given (4)", l.threads())
	}
	if got := l.sets; len(got) != 3 || got[0] != 2 || got[1] != 3 || got[2] != 4 {
		t.Fatalf("set %v, want [2 3 4]", got)
	}
}
