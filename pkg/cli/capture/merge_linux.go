package capture

import (
	"bufio"
	"container/heap"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/pcap"
)

// merge writes the packets in time order (within reorderDelay) until in
// closes; it calls stop when the count is reached or the output fails.
func merge(in <-chan pcap.Packet, o Options, ifaces []pcap.Interface, states []*ifaceState, stop func(), settle func(countReached bool)) (Summary, error) {
	w, err := newOutput(o, ifaces, states, stop)
	if err != nil {
		stop()
		for range in {
		}
		settle(false)
		return Summary{}, fmt.Errorf("writing the capture: %w", err)
	}
	tick := time.NewTicker(reorderDelay / 3)
	defer tick.Stop()
	for open := true; open; {
		select {
		case p, ok := <-in:
			if !ok {
				open = false
				continue
			}
			if !w.hold(p) {
				continue
			}
		case <-tick.C:
			w.emit(time.Now().Add(-reorderDelay))
		}
		if len(in) == 0 {
			w.flush()
		}
	}
	w.emit(time.Time{})
	settle(w.countReached)
	return Summary{CountReached: w.countReached}, w.finish()
}

// output is merge's side of the pcapng stream: the packets held for
// reordering and what was written. After a write fails it writes no more
// and only counts.
type output struct {
	bw      *bufio.Writer
	pw      *pcap.PcapngWriter
	pending packetHeap
	// pendingBytes are the frames' bytes in pending.
	pendingBytes int
	count        int
	written      int
	countReached bool
	states       []*ifaceState
	stop         func()
	err          error
}

func newOutput(o Options, ifaces []pcap.Interface, states []*ifaceState, stop func()) (*output, error) {
	bw := bufio.NewWriterSize(o.Out, 256<<10)
	pw, err := pcap.NewPcapngWriter(bw, ifaces)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return nil, err
	}
	return &output{bw: bw, pw: pw, count: o.Count, states: states, stop: stop}, nil
}

// hold keeps p for reordering, and reports whether a burst beyond what
// the reorder window may hold made it write the oldest now (in order as
// far as the window went).
func (w *output) hold(p pcap.Packet) bool {
	heap.Push(&w.pending, p)
	w.pendingBytes += len(p.Frame)
	if w.pendingBytes < maxPendingBytes {
		return false
	}
	for w.pendingBytes >= maxPendingBytes/2 && len(w.pending) > 0 {
		w.emit(w.pending[0].Time.Add(1))
	}
	return true
}

// emit writes the pending packets older than before (all if zero).
func (w *output) emit(before time.Time) {
	for len(w.pending) > 0 && (before.IsZero() || w.pending[0].Time.Before(before)) {
		p := heap.Pop(&w.pending).(pcap.Packet)
		w.pendingBytes -= len(p.Frame)
		if w.err != nil || (w.count > 0 && w.written >= w.count) {
			continue
		}
		if w.err = w.pw.WritePacket(&p); w.err != nil {
			w.stop()
			continue
		}
		w.written++
		w.states[p.Iface].Written++
		if w.count > 0 && w.written == w.count {
			w.countReached = true
			w.stop()
		}
	}
}

// flush hands what is buffered to the reader.
func (w *output) flush() {
	if w.err == nil {
		if w.err = w.bw.Flush(); w.err != nil {
			w.stop()
		}
	}
}

// finish writes each interface's counts and flushes. A reader that went
// away (tcpdump -c exited) ends the capture; it is not a failure.
func (w *output) finish() error {
	if w.err == nil {
		now := time.Now()
		for i, st := range w.states {
			if w.err = w.pw.WriteStats(i, now, st.Written, st.Dropped); w.err != nil {
				break
			}
		}
	}
	if w.err == nil {
		w.err = w.bw.Flush()
	}
	if w.err != nil && !errors.Is(w.err, syscall.EPIPE) {
		return fmt.Errorf("writing the capture: %w", w.err)
	}
	return nil
}

type packetHeap []pcap.Packet

func (h packetHeap) Len() int           { return len(h) }
func (h packetHeap) Less(i, j int) bool { return h[i].Time.Before(h[j].Time) }
func (h packetHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *packetHeap) Push(x any)        { *h = append(*h, x.(pcap.Packet)) }
func (h *packetHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	*h = old[:len(old)-1]
	return p
}
