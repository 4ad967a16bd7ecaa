// Package wirequeue owns the queue between netstack and the pod's wire
// link: it hands the link batches from a goroutine of its own and, when
// full, makes the sender wait for room instead of dropping the packet.
//
// Why not gVisor's fifo qdisc: fifo drops a packet that finds the queue
// full, and netstack's TCP counts a packet its own stack dropped as sent.
// The whole tail of a window can go that way (a GSO burst of 2 segments
// under gso_max_segs 2 fills 1024 slots with 3 MB, less than five
// connections' windows), and with nothing above the hole for the peer to
// SACK, netstack's RACK recovery counts every lost segment as still in
// flight (SetPipe ignores RACK's lost marks): the connection then sends one
// segment per retransmission timeout, 14 KB/s, for minutes (make
// bench-quick's nginx 10 MiB with gso_max_segs 2 hung in CI on it). Linux
// never gets there: TCP small queues keep a socket's packets in the qdisc
// to a few, and a packet the qdisc drops is reported back and not counted
// as sent. Waiting for room is the same back-pressure for netstack: the
// sender pauses for as long as the link takes to drain one batch.
package wirequeue

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/sleep"
	"gvisor.dev/gvisor/pkg/tcpip"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// BatchSize is the most packets handed to the link in one call: a 64 KiB
// burst that netstack segments itself (software GSO) is 46 segments and a
// short one, as in gVisor's fifo.
const BatchSize = 47

// StallTime is how long the link may take one batch before a sender that
// waits for room gives up and drops its packet: twice, back to back, with
// no batch taken in between. Draining one batch takes microseconds; a link
// that stalls this long is wedged, and dropping keeps netstack's timers
// and the other connections going. Progress, not the time a sender
// waited, decides: a sender behind many others may wait long while the
// link drains, and a stack whose process the kernel did not run for a
// while (CPU quota, a busy node) must not find its timers expired on
// waking and drop what the link was about to take, as a plain deadline
// does in TestDownloadsThroughAFullWireQueue (docs/architecture.md,
// "Queues").
const StallTime = 100 * time.Millisecond

// Stats counts what the queue did besides passing packets on.
type Stats struct {
	// Waits counts packets that found the queue full and waited for room.
	Waits atomic.Uint64
	// Drops counts packets dropped because the link stalled (StallTime),
	// or offered after Close.
	Drops atomic.Uint64
}

// Queue is a tcpipstack.QueueingDiscipline that never drops for lack of room
// unless the link stops draining it.
type Queue struct {
	lower tcpipstack.LinkWriter
	stats *Stats

	mu sync.Mutex
	// ring holds the queued packets from head on, n of them, each with a
	// reference of its own.
	ring    []*tcpipstack.PacketBuffer
	head, n int
	// room is closed, and replaced, whenever the dispatcher takes
	// packets out of a full queue: the waiting senders' wake-up.
	room chan struct{}
	// taken counts the batches the dispatcher took: the link's progress.
	taken  uint64
	closed bool

	// newPacket and closing wake the dispatcher: gVisor's wakers, as in
	// its fifo, so that a lone packet's hand-off costs what it did.
	newPacket sleep.Waker
	closing   sleep.Waker
	done      chan struct{}
}

var _ tcpipstack.QueueingDiscipline = (*Queue)(nil)

// New starts a queue of up to limit packets in front of lower. stats may
// be nil.
func New(lower tcpipstack.LinkWriter, limit int, stats *Stats) *Queue {
	if stats == nil {
		stats = new(Stats)
	}
	q := &Queue{
		lower: lower,
		stats: stats,
		ring:  make([]*tcpipstack.PacketBuffer, max(limit, 1)),
		room:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	go q.dispatch()
	return q
}

// WritePacket queues pkt, waiting for room when the queue is full.
func (q *Queue) WritePacket(pkt *tcpipstack.PacketBuffer) tcpip.Error {
	var (
		timer   *time.Timer
		seen    uint64 // q.taken when the timer was last armed
		stalled bool   // the last timer saw no batch taken
	)
	q.mu.Lock()
	for !q.closed && q.n == len(q.ring) {
		room := q.room
		if timer == nil {
			q.stats.Waits.Add(1)
			timer = time.NewTimer(StallTime)
			defer timer.Stop()
			seen = q.taken
		}
		q.mu.Unlock()
		select {
		case <-room:
			q.mu.Lock()
			continue
		case <-timer.C:
		}
		q.mu.Lock()
		if q.taken == seen && stalled {
			q.mu.Unlock()
			q.stats.Drops.Add(1)
			return &tcpip.ErrNoBufferSpace{}
		}
		stalled, seen = q.taken == seen, q.taken
		timer.Reset(StallTime)
	}
	if q.closed {
		q.mu.Unlock()
		q.stats.Drops.Add(1)
		return &tcpip.ErrClosedForSend{}
	}
	q.ring[(q.head+q.n)%len(q.ring)] = pkt.IncRef()
	q.n++
	q.mu.Unlock()
	q.newPacket.Assert()
	return nil
}

// dispatch hands the queued packets to the link in batches until Close.
func (q *Queue) dispatch() {
	defer close(q.done)
	var sleeper sleep.Sleeper
	sleeper.AddWaker(&q.newPacket)
	sleeper.AddWaker(&q.closing)
	defer sleeper.Done()
	var batch tcpipstack.PacketBufferList
	for sleeper.Fetch(true) != &q.closing {
		// The sender that woke the dispatcher made it the goroutine Go
		// runs next, ahead of the others already ready: the relay's
		// readers of the other connections whose answers came in the
		// same poll. Yielding once lets them queue theirs first, and the
		// batch then carries all of them in one system call instead of
		// one each. With nothing else ready it costs one pass through
		// the scheduler.
		runtime.Gosched()
		for q.take(&batch) {
			// Errors are the link's to count: a send that fails is a
			// packet lost on the wire, which TCP recovers from.
			_, _ = q.lower.WritePackets(batch)
			batch.Reset()
		}
	}
}

// take moves up to BatchSize packets from the queue into batch, waking the
// senders waiting for room, and reports whether there were any.
func (q *Queue) take(batch *tcpipstack.PacketBufferList) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.n == 0 {
		return false
	}
	wasFull := q.n == len(q.ring)
	q.taken++
	for range min(q.n, BatchSize) {
		batch.PushBack(q.ring[q.head])
		q.ring[q.head] = nil
		q.head = (q.head + 1) % len(q.ring)
		q.n--
	}
	if wasFull {
		close(q.room)
		q.room = make(chan struct{})
	}
	return true
}

// Close drops what is still queued, wakes the waiting senders and stops
// the dispatcher.
func (q *Queue) Close() {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.room)
		for ; q.n > 0; q.n-- {
			q.ring[q.head].DecRef()
			q.ring[q.head] = nil
			q.head = (q.head + 1) % len(q.ring)
		}
	}
	q.mu.Unlock()
	q.closing.Assert()
	<-q.done
}
