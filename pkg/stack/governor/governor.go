// Package governor fits a pod stack's use of CPU to what the stack is
// doing, every interval while traffic flows: how many threads run its Go
// code (its GOMAXPROCS), one and a second only while bulk traffic keeps the
// one busy; and whether its one thread busy-polls (pkg/stack/busypoll)
// between requests, only while requests flow and the node has a core to
// spare for it.
//
// One thread is the stack's best shape for requests: every goroutine a
// frame wakes runs on the thread that read it, and a second P only adds a
// thread that the runtime wakes to spin for work at every hand-off, which
// costs requests both latency and stack CPU (docs/architecture.md,
// "Threads", holds the measurements).
// Bulk traffic over many connections is the opposite: each goroutine
// has a large write to make, the one thread saturates, and many streams
// into one pod move more on two threads than on one (docs/performance.md,
// "Where a request's time goes"). What tells them apart is the size of
// the frames: GSO and GRO aggregates under bulk traffic, a few hundred
// bytes under requests; and the number of connections: one stream gains
// nothing from a second thread and pays more CPU per byte for it.
//
// Busy polling is for requests what the second thread is for bulk: a
// request that finds the stack's thread asleep pays for its wake-up, most
// of a small request's latency on a VM (docs/performance.md, "Busy
// polling"). Polling after each request spends the CPU of the wait
// instead. That pays while requests come often and the CPU it spins is
// idle anyway; it costs bulk traffic (the poller spins on the core the
// receiving application needs) and other pods on a node whose cores are
// all taken, or nearly: under redis on two CPUs (client, server and
// stack busy) polling, always on or not, gained nothing and at times cost
// requests. So the governor polls only on one thread, for traffic of
// small frames at a request rate, when the node had three quarters of a
// core idle without it, and while no task waits long for a CPU; every
// second it looks again without polling. A pod that asks for a window
// with its annotation gets it only by this rule too: the pod is not
// trusted to spend the node's CPU (docs/security.md). Only the
// conflist's window, the cluster admin's choice, polls always, and then
// the governor leaves polling alone.
package governor

import (
	"context"
	"sync/atomic"
	"time"
)

// Sample is what the governor reads at each tick: running totals.
type Sample struct {
	// CPU is the CPU time the process has used.
	CPU time.Duration
	// RxFrames, RxBytes, TxFrames and TxBytes count the wire link's frames
	// and their bytes, each way.
	RxFrames, RxBytes, TxFrames, TxBytes uint64
	// Conns is how many connections the stack relays now.
	Conns int64
	// NodeBusy is the CPU time the node's CPUs were busy, all of them
	// together (pkg/stack's /proc/stat); zero when unknown, and busy
	// polling then stays off.
	NodeBusy time.Duration
	// NodeWait is the time some task on the node waited for a CPU
	// (the kernel's pressure stall information, /proc/pressure/cpu's
	// "some" total).
	NodeWait time.Duration
}

const (
	// DefaultInterval is how often the governor looks.
	DefaultInterval = 100 * time.Millisecond
	// busyCores: a stack that used this much of a core per thread over an
	// interval is saturated. It sits below a whole core because a thread
	// that many streams saturate still shows less than one in a noisy
	// interval. One stream can use as much; minConns keeps it on one
	// thread.
	busyCores = 0.85
	// idleCores: a stack on two threads that used less than this over an
	// interval fits on one.
	idleCores = 0.75
	// bulkFrameBytes: frames larger than this on average, one way or the
	// other, are aggregates (GSO, GRO): bulk traffic. An MTU frame is
	// smaller, a request's much smaller.
	bulkFrameBytes = 4096
	// minConns: fewer relayed connections than this are not "many" (an
	// iperf3 stream and its control connection are two).
	minConns = 4
	// upAfter and downAfter are how many intervals in a row must agree
	// before the count changes: a change costs a stop of the world, and a
	// burst of a few hundred milliseconds is not worth one. Traffic that
	// is no longer bulk (requests, or none) lowers it at once: requests
	// pay for a second thread from their first interval.
	upAfter   = 2
	downAfter = 4
	// quietFrames: an interval with fewer frames both ways is quiet, and
	// a governor at one thread then sleeps until Wake instead of ticking:
	// an idle stack wakes for nothing (kubelet's probes stay below it).
	quietFrames = 64
	// idleStart is the idle CPU, in cores, that the node must have had
	// over an interval without polling for busy polling to be turned on:
	// three quarters of a core that nobody, the stack included, asked
	// for. Polling then spends only what was idle: under redis on two
	// CPUs (client, server and stack busy, well under this idle) it stays
	// off, under a round trip at a time (about one core busy) it goes on.
	// Half a core let redis's noisier intervals turn it on, and redis
	// lost requests for it
	// (docs/performance.md).
	idleStart = 0.75
	// probeEvery: while polling, the node's idle cannot be seen (the
	// poller spends it), so every probeEvery intervals one goes without
	// polling, and the rule for turning it on decides again.
	probeEvery = 10
	// waitStart and waitKeep bound the share of an interval during which
	// some task on the node waited for a CPU, for busy polling to be
	// turned on and to stay on between probes: polling that makes others
	// wait goes at once. Redis on two CPUs makes tasks wait for less
	// than waitStart; spinners that outnumber the CPUs, for more.
	waitStart = 0.4
	waitKeep  = 0.5
)

// Stats counts what the governor did.
type Stats struct {
	// Threads is the current count.
	Threads atomic.Int32
	// Raised and Lowered count the changes.
	Raised, Lowered atomic.Uint64
	// BusyPoll is whether busy polling is on now.
	BusyPoll atomic.Bool
}

// Governor sets the thread count from the samples it reads.
type Governor struct {
	max      int
	interval time.Duration
	read     func() Sample
	set      func(int)
	stats    Stats

	last     Sample
	n        int
	up, down int  // intervals in a row that asked for a change
	quiet    bool // the last interval was quiet
	asleep   atomic.Bool
	wake     chan struct{}

	// cpus is the node's CPU count and poll switches busy polling; nil
	// when the governor does not decide it (BusyPoll). polled counts the
	// intervals since polling went on, for the probes.
	cpus   int
	poll   func(bool)
	polled int
}

// New returns a governor between one and most threads, starting at one
// (the caller's to set). read gives the samples, set applies a change
// (runtime.GOMAXPROCS in the stack).
func New(most int, interval time.Duration, read func() Sample, set func(int)) *Governor {
	if interval <= 0 {
		interval = DefaultInterval
	}
	g := &Governor{max: max(1, most), interval: interval, read: read, set: set, n: 1, wake: make(chan struct{}, 1)}
	g.stats.Threads.Store(1)
	g.last = read()
	return g
}

// BusyPoll has the governor switch the stack's busy polling too, on a
// node of cpus CPUs: set applies each change, starting from off. Call it
// before Run.
func (g *Governor) BusyPoll(cpus int, set func(bool)) {
	g.cpus, g.poll = cpus, set
	set(false)
}

// Stats returns the governor's counters.
func (g *Governor) Stats() *Stats { return &g.stats }

// Max is the most threads the governor gives.
func (g *Governor) Max() int { return g.max }

// Run ticks until ctx ends, and sleeps while the stack is quiet on one
// thread, until Wake.
func (g *Governor) Run(ctx context.Context) {
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		if g.n == 1 && g.quiet {
			t.Stop()
			g.asleep.Store(true)
			select {
			case <-ctx.Done():
				return
			case <-g.wake:
			}
			g.asleep.Store(false)
			g.last, g.quiet, g.up = g.read(), false, 0
			t.Reset(g.interval)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.Tick()
		}
	}
}

// Wake tells a sleeping governor that traffic flows. The link reader
// calls it for every batch it reads: an atomic load when awake.
func (g *Governor) Wake() {
	if g.asleep.Load() {
		select {
		case g.wake <- struct{}{}:
		default:
		}
	}
}

// Tick takes a sample and changes the count if the last intervals asked
// for it. Run calls it; tests call it directly.
func (g *Governor) Tick() {
	s := g.read()
	prev := g.last
	want, now := decide(g.n, g.max, g.interval, prev, s)
	g.quiet = s.RxFrames-prev.RxFrames+s.TxFrames-prev.TxFrames < quietFrames
	g.last = s
	defer g.decidePoll(prev, s)
	switch {
	case now:
	case want > g.n:
		g.down = 0
		if g.up++; g.up < upAfter {
			return
		}
	case want < g.n:
		g.up = 0
		if g.down++; g.down < downAfter {
			return
		}
	default:
		g.up, g.down = 0, 0
		return
	}
	g.up, g.down = 0, 0
	if want > g.n {
		g.stats.Raised.Add(1)
	} else {
		g.stats.Lowered.Add(1)
	}
	g.n = want
	g.set(want)
	g.stats.Threads.Store(int32(want))
}

// decidePoll switches busy polling for the interval from prev to cur,
// once the thread count is decided: the poller spins beside nothing.
func (g *Governor) decidePoll(prev, cur Sample) {
	if g.poll == nil {
		return
	}
	on := g.stats.BusyPoll.Load()
	want := decidePoll(on, g.n, g.cpus, g.interval, prev, cur)
	if want && on {
		if g.polled++; g.polled >= probeEvery {
			want = false // a probe: the next interval shows the idle
		}
	}
	if want != on {
		g.polled = 0
		g.stats.BusyPoll.Store(want)
		g.poll(want)
	}
}

// decidePoll is whether one interval asks for busy polling, on telling
// whether it was on during it: for traffic of small frames, on one
// thread, while tasks waited for a CPU less than waitStart of the
// interval (waitKeep once on); and, to turn it on, the node's CPUs, this
// stack's included, left idleStart idle. Once on, the idle is the
// poller's and cannot be read: the governor's probes read it again.
func decidePoll(on bool, n, cpus int, interval time.Duration, prev, cur Sample) bool {
	frames := cur.RxFrames - prev.RxFrames + cur.TxFrames - prev.TxFrames
	if n != 1 || frames < quietFrames || isBulk(prev, cur) || cur.NodeBusy == 0 || cur.NodeBusy < prev.NodeBusy || cur.NodeWait < prev.NodeWait {
		return false
	}
	wait := float64(cur.NodeWait-prev.NodeWait) / float64(interval)
	if on {
		return wait < waitKeep
	}
	idle := float64(cpus) - float64(cur.NodeBusy-prev.NodeBusy)/float64(interval)
	return idle >= idleStart && wait < waitStart
}

// decide is the count one interval (from prev to cur, interval long) asks
// for, n threads running: one more when each thread was saturated by bulk
// aggregates over many connections, one fewer when the load would fit on
// one thread less, and one at once (now) when the traffic is no longer
// bulk.
func decide(n, max int, interval time.Duration, prev, cur Sample) (want int, now bool) {
	cores := float64(cur.CPU-prev.CPU) / float64(interval)
	bulk := isBulk(prev, cur)
	switch {
	case n > 1 && !bulk:
		return 1, true
	case n < max && bulk && cur.Conns >= minConns && cores >= busyCores*float64(n):
		return n + 1, false
	case n > 1 && cores < idleCores*float64(n-1):
		return n - 1, false
	}
	return n, false
}

// isBulk says whether the frames of an interval were aggregates, one way
// or the other, on average.
func isBulk(prev, cur Sample) bool {
	return avg(cur.RxBytes-prev.RxBytes, cur.RxFrames-prev.RxFrames) > bulkFrameBytes ||
		avg(cur.TxBytes-prev.TxBytes, cur.TxFrames-prev.TxFrames) > bulkFrameBytes
}

func avg(bytes, frames uint64) float64 {
	if frames == 0 {
		return 0
	}
	return float64(bytes) / float64(frames)
}
