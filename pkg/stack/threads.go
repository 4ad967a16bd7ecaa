package stack

import (
	"runtime"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/stack/threads"
	"golang.org/x/sys/unix"
)

// AdaptThreads has the stack's thread count follow its load, between one
// and most (pkg/stack/threads), from Run on. The process's entry point calls it
// when the configuration leaves the count open: the governor sets the
// whole process's GOMAXPROCS. Call it before Run.
func (d *Daemon) AdaptThreads(most int) {
	d.threads = threads.New(most, threads.DefaultInterval, d.threadSample, func(n int) { runtime.GOMAXPROCS(n) })
	d.stack.OnLinkBatch(d.threads.Wake)
}

// threadSample is what the governor decides from: the process's CPU time,
// the wire link's frames and the relayed connections.
func (d *Daemon) threadSample() threads.Sample {
	// clock_gettime, which the sandbox allows (getrusage it does not).
	var ts unix.Timespec
	var cpu time.Duration
	if unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts) == nil {
		cpu = time.Duration(ts.Nano())
	}
	w := &d.stack.WireStats
	return threads.Sample{CPU: cpu, RxFrames: w.RxPackets.Load(), RxBytes: w.RxBytes.Load(),
		TxFrames: w.TxPackets.Load(), TxBytes: w.TxBytes.Load(), Conns: d.stack.Relay.Stats().TCPActive.Load()}
}

func (d *Daemon) threadsStatus() control.ThreadsStatus {
	if d.threads == nil {
		n := runtime.GOMAXPROCS(0)
		return control.ThreadsStatus{Threads: n, Max: n}
	}
	// The runtime's count, not the governor's: what it set took effect.
	st := d.threads.Stats()
	return control.ThreadsStatus{Threads: runtime.GOMAXPROCS(0), Max: d.threads.Max(), Adaptive: true,
		Raised: st.Raised.Load(), Lowered: st.Lowered.Load()}
}
