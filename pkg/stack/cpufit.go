package stack

import (
	"runtime"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/stack/busypoll"
	"github.com/cni-usernet/cni-usernet/pkg/stack/governor"
	"golang.org/x/sys/unix"
)

// Govern has the stack's thread count follow its load, between one and
// most, and, when the stack's busy poller is left to it (governed: the
// default window, or a pod annotation's), its busy polling
// (pkg/stack/governor), from Run on. The process's entry point calls it
// when the configuration leaves the count open: the governor sets the
// whole process's GOMAXPROCS. Call it before Run and before the sandbox:
// it opens /proc/stat.
func (d *Daemon) Govern(most int, governed bool) {
	cpus := 0
	if governed && d.stack.Busy != nil {
		if cpu, err := openNodeCPU(); err != nil {
			// Without the node's load the governor cannot tell whether
			// polling takes a core someone else wants: it stays off.
			d.log.Warn("busy polling stays off: the node's CPU load is unreadable", "err", err)
		} else {
			d.nodeCPU, cpus = cpu, cpu.cpus
		}
	}
	d.governor = newGovernor(most, governor.DefaultInterval, d.governorSample, d.stack.Busy, governed, cpus)
	d.stack.OnLinkBatch(d.governor.Wake)
}

// newGovernor is Govern's governor, reading its samples from read: it
// switches busy, the stack's poller, when the configuration left the
// poller to it (governed) and the node's CPUs (cpus) are known, and
// otherwise turns a governed poller off. A window that is not governed
// (the conflist's) it leaves as the poller started: on, the admin's
// choice. A pod's own window is governed: the pod is not trusted with
// the node's CPU.
func newGovernor(most int, interval time.Duration, read func() governor.Sample, busy *busypoll.Poller, governed bool, cpus int) *governor.Governor {
	g := governor.New(most, interval, read, func(n int) { runtime.GOMAXPROCS(n) })
	if governed && busy != nil {
		if cpus > 0 {
			g.BusyPoll(cpus, busy.SetEnabled)
		} else {
			busy.SetEnabled(false)
		}
	}
	return g
}

// governorSample is what the governor decides from: the process's CPU
// time, the wire link's frames, the relayed connections and the node's
// busy CPU time.
func (d *Daemon) governorSample() governor.Sample {
	// clock_gettime, which the sandbox allows (getrusage it does not).
	var ts unix.Timespec
	var cpu time.Duration
	if unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts) == nil {
		cpu = time.Duration(ts.Nano())
	}
	w := &d.stack.WireStats
	s := governor.Sample{CPU: cpu, RxFrames: w.RxPackets.Load(), RxBytes: w.RxBytes.Load(),
		TxFrames: w.TxPackets.Load(), TxBytes: w.TxBytes.Load(), Conns: d.stack.Relay.Stats().TCPActive.Load()}
	if d.nodeCPU != nil {
		s.NodeBusy, s.NodeWait, _ = d.nodeCPU.sample()
	}
	return s
}

func (d *Daemon) threadsStatus() control.ThreadsStatus {
	if d.governor == nil {
		n := runtime.GOMAXPROCS(0)
		return control.ThreadsStatus{Threads: n, Max: n}
	}
	// The runtime's count, not the governor's: what it set took effect.
	st := d.governor.Stats()
	return control.ThreadsStatus{Threads: runtime.GOMAXPROCS(0), Max: d.governor.Max(), Adaptive: true,
		Raised: st.Raised.Load(), Lowered: st.Lowered.Load()}
}
