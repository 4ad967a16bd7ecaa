package podstack

import (
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// maxQueueBatch is the most packets the queue hands the link at once (one
// sendmmsg): fdbased's own batch size.
const maxQueueBatch = 47

// sendQueue is the FIFO queue in front of the wire link. A packet that
// finds nothing queued and nothing being sent goes out at once, in the
// goroutine that wrote it: a lone request or response crosses no
// goroutine hand-off (netstack's fifo queue always hands off, which costs
// a wake-up per small packet, the price that dominated request/response).
// Packets that meet a send in progress queue up, and a goroutine of the
// queue's own sends them in batches once the send ahead of them is done,
// so order is kept, bulk transfers keep TCP processing and the send system
// calls (in which the kernel also delivers to the veth's peer) on
// different cores, and the link gets batches.
type sendQueue struct {
	lower stack.LinkWriter
	limit int

	mu      sync.Mutex            // guards the fields below
	cond    sync.Cond             // signals the sender: packets queued, a send done, or closing
	queue   []*stack.PacketBuffer // queue[head:] waits; the array is reused once drained
	head    int
	sending bool // a send is in progress (inline or by the sender)
	closed  bool
	done    chan struct{}
}

var _ stack.QueueingDiscipline = (*sendQueue)(nil)

func newSendQueue(lower stack.LinkWriter, limit int) *sendQueue {
	q := &sendQueue{lower: lower, limit: limit, done: make(chan struct{})}
	q.cond.L = &q.mu
	go q.run()
	return q
}

// WritePacket implements stack.QueueingDiscipline.
func (q *sendQueue) WritePacket(pkt *stack.PacketBuffer) tcpip.Error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return &tcpip.ErrClosedForSend{}
	}
	if !q.sending && q.head == len(q.queue) {
		q.sending = true
		q.mu.Unlock()
		var batch stack.PacketBufferList
		batch.PushBack(pkt.IncRef())
		_, err := q.lower.WritePackets(batch)
		batch.Reset()
		q.mu.Lock()
		q.sending = false
		if q.head < len(q.queue) {
			q.cond.Signal()
		}
		q.mu.Unlock()
		return err
	}
	if len(q.queue)-q.head >= q.limit {
		q.mu.Unlock()
		return &tcpip.ErrNoBufferSpace{}
	}
	q.queue = append(q.queue, pkt.IncRef())
	if !q.sending {
		q.cond.Signal()
	}
	q.mu.Unlock()
	return nil
}

// run sends what queued up behind a send in progress.
func (q *sendQueue) run() {
	defer close(q.done)
	var batch stack.PacketBufferList
	q.mu.Lock()
	for {
		for !q.closed && (q.sending || q.head == len(q.queue)) {
			q.cond.Wait()
		}
		if q.closed {
			for _, p := range q.queue[q.head:] {
				p.DecRef()
			}
			q.queue, q.head = nil, 0
			q.mu.Unlock()
			return
		}
		end := min(len(q.queue), q.head+maxQueueBatch)
		for _, p := range q.queue[q.head:end] {
			batch.PushBack(p)
		}
		clear(q.queue[q.head:end])
		q.head = end
		if q.head == len(q.queue) {
			q.queue, q.head = q.queue[:0], 0
		}
		q.sending = true
		q.mu.Unlock()
		q.lower.WritePackets(batch)
		batch.Reset()
		q.mu.Lock()
		q.sending = false
	}
}

// Close implements stack.QueueingDiscipline.
func (q *sendQueue) Close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
	<-q.done
}
