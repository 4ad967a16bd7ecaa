package wirequeue

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// gatedLink is a link that takes a batch only while its gate is open and
// records, in order, the first payload byte of every packet it took.
type gatedLink struct {
	mu      sync.Mutex
	open    bool
	cond    *sync.Cond
	got     []byte
	batches []int
}

func newGatedLink(open bool) *gatedLink {
	l := &gatedLink{open: open}
	l.cond = sync.NewCond(&l.mu)
	return l
}

func (l *gatedLink) WritePackets(pkts tcpipstack.PacketBufferList) (int, tcpip.Error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for !l.open {
		l.cond.Wait()
	}
	for _, p := range pkts.AsSlice() {
		l.got = append(l.got, p.Data().AsRange().ToSlice()[0])
	}
	l.batches = append(l.batches, pkts.Len())
	return pkts.Len(), nil
}

func (l *gatedLink) setOpen(open bool) {
	l.mu.Lock()
	l.open = open
	l.mu.Unlock()
	l.cond.Broadcast()
}

// batchesSoFar returns the sizes of the batches the link took so far.
func (l *gatedLink) batchesSoFar() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.batches...)
}

// taken returns how many packets the link took so far.
func (l *gatedLink) taken() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.got)
}

func packet(b byte) *tcpipstack.PacketBuffer {
	return tcpipstack.NewPacketBuffer(tcpipstack.PacketBufferOptions{Payload: buffer.MakeWithData([]byte{b})})
}

// write offers a packet of its own to q and drops its own reference, as
// netstack does.
func write(q *Queue, b byte) tcpip.Error {
	p := packet(b)
	defer p.DecRef()
	return q.WritePacket(p)
}

// waitFor polls cond for up to 10 s: the dispatcher runs on its own.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// busyLink writes packet 1 and waits until the dispatcher has taken it
// into a gated link that is closed, so that the link holds the dispatcher.
func busyLink(t *testing.T, q *Queue) {
	t.Helper()
	if err := write(q, 1); err != nil {
		t.Fatalf("packet 1: %v", err)
	}
	waitFor(t, "the dispatcher to take packet 1", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.n == 0
	})
}

// newClosedQueue starts a queue of limit packets in front of a gated link
// that is closed; cleanup opens it and closes the queue.
func newClosedQueue(t *testing.T, limit int) (*gatedLink, *Queue, *Stats) {
	link := newGatedLink(false)
	stats := new(Stats)
	q := New(link, limit, stats)
	t.Cleanup(func() { link.setOpen(true); q.Close() })
	return link, q, stats
}

// TestFullQueueWaitsForRoom: with the link busy and the queue full, a
// sender waits; when the link drains, its packet goes out after the
// others, in order, and none is dropped.
func TestFullQueueWaitsForRoom(t *testing.T) {
	link, q, stats := newClosedQueue(t, 2)

	// The dispatcher takes the first packet and blocks in the link; two
	// more fill the queue.
	busyLink(t, q)
	for b := byte(2); b <= 3; b++ {
		if err := write(q, b); err != nil {
			t.Fatalf("packet %d: %v", b, err)
		}
	}
	done := make(chan tcpip.Error, 1)
	go func() { done <- write(q, 4) }()
	waitFor(t, "packet 4 to wait for room", func() bool { return stats.Waits.Load() == 1 })
	select {
	case err := <-done:
		t.Fatalf("packet 4 returned (%v) while the queue was full, want it to wait", err)
	default:
	}

	link.setOpen(true)
	if err := <-done; err != nil {
		t.Fatalf("packet 4: got %v, want it queued once there was room", err)
	}
	waitFor(t, "the link to take all four", func() bool { return link.taken() == 4 })
	link.mu.Lock()
	got := string(link.got)
	link.mu.Unlock()
	if want := "\x01\x02\x03\x04"; got != want {
		t.Errorf("link got packets %q, want %q", got, want)
	}
	if d := stats.Drops.Load(); d != 0 {
		t.Errorf("drops: got %d, want 0", d)
	}
}

// TestWedgedLinkDrops: a link that stops taking packets costs a sender two
// StallTimes, then the packet, so that netstack goes on.
func TestWedgedLinkDrops(t *testing.T) {
	_, q, stats := newClosedQueue(t, 1)
	busyLink(t, q)
	if err := write(q, 2); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := write(q, 3)
	if _, ok := err.(*tcpip.ErrNoBufferSpace); !ok {
		t.Fatalf("packet 3 to a wedged link: got %v, want %v", err, &tcpip.ErrNoBufferSpace{})
	}
	if waited := time.Since(start); waited < 2*StallTime {
		t.Errorf("dropped after %v, want after waiting %v", waited, 2*StallTime)
	}
	if w, d := stats.Waits.Load(), stats.Drops.Load(); w != 1 || d != 1 {
		t.Errorf("waits, drops: got %d, %d, want 1, 1", w, d)
	}
}

// slowLink takes every batch, each after a pause.
type slowLink struct {
	pause time.Duration
	mu    sync.Mutex
	n     int
}

func (l *slowLink) WritePackets(pkts tcpipstack.PacketBufferList) (int, tcpip.Error) {
	time.Sleep(l.pause)
	l.mu.Lock()
	l.n += pkts.Len()
	l.mu.Unlock()
	return pkts.Len(), nil
}

// TestSlowLinkNeverDrops: senders queued behind each other wait for
// longer than the link's stall time in all, but the link keeps taking
// batches, so none of them drops.
func TestSlowLinkNeverDrops(t *testing.T) {
	link := &slowLink{pause: StallTime * 6 / 10}
	var stats Stats
	q := New(link, 1, &stats)
	t.Cleanup(q.Close)
	const senders = 6
	errs := make(chan tcpip.Error, senders)
	for i := range senders {
		go func() { errs <- write(q, byte(i)) }()
	}
	for range senders {
		if err := <-errs; err != nil {
			t.Errorf("sender: got %v, want its packet queued", err)
		}
	}
	if d := stats.Drops.Load(); d != 0 {
		t.Errorf("drops: got %d, want 0 (the link never stalled)", d)
	}
	if w := stats.Waits.Load(); w < senders-2 {
		t.Errorf("waits: got %d, want at least %d (the test checks nothing)", w, senders-2)
	}
}

// TestCloseReleasesEverything: Close wakes a waiting sender with an error,
// drops the queued packets' references and refuses what comes after.
func TestCloseReleasesEverything(t *testing.T) {
	link := newGatedLink(false)
	q := New(link, 1, nil)
	busyLink(t, q)
	queued := packet(2)
	if err := q.WritePacket(queued); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan tcpip.Error, 1)
	go func() { waiting <- write(q, 3) }()
	waitFor(t, "packet 3 to wait", func() bool { return q.stats.Waits.Load() == 1 })

	closed := make(chan struct{})
	go func() { q.Close(); close(closed) }()
	if err := <-waiting; !isClosed(err) {
		t.Errorf("waiting sender on Close: got %v, want %v", err, &tcpip.ErrClosedForSend{})
	}
	// The dispatcher is still in the link with packet 1: Close waits
	// for it.
	link.setOpen(true)
	<-closed
	if refs := queued.ReadRefs(); refs != 1 {
		t.Errorf("references to a packet queued at Close: got %d, want 1 (the test's own)", refs)
	}
	queued.DecRef()
	if err := write(q, 4); !isClosed(err) {
		t.Errorf("write after Close: got %v, want %v", err, &tcpip.ErrClosedForSend{})
	}
	if got := link.taken(); got != 1 {
		t.Errorf("link took %d packets, want 1 (the one it held at Close)", got)
	}
}

func isClosed(err tcpip.Error) bool {
	_, ok := err.(*tcpip.ErrClosedForSend)
	return ok
}

// TestBatchesInOrder: packets leave in the order they came, in batches of
// at most BatchSize, each released once the link has it.
func TestBatchesInOrder(t *testing.T) {
	link := newGatedLink(false)
	q := New(link, 256, nil)
	t.Cleanup(q.Close)
	var pkts []*tcpipstack.PacketBuffer
	for i := range 200 {
		p := packet(byte(i))
		pkts = append(pkts, p)
		if err := q.WritePacket(p); err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
	}
	link.setOpen(true)
	waitFor(t, "the link to take 200 packets", func() bool { return link.taken() == 200 })
	link.mu.Lock()
	defer link.mu.Unlock()
	for i, b := range link.got {
		if b != byte(i) {
			t.Fatalf("packet %d on the link: got %d, want %d", i, b, byte(i))
		}
	}
	for i, n := range link.batches {
		if n > BatchSize {
			t.Errorf("batch %d: %d packets, want at most %d", i, n, BatchSize)
		}
	}
	for i, p := range pkts {
		if refs := p.ReadRefs(); refs != 1 {
			t.Fatalf("packet %d: %d references after the link took it, want 1 (the test's own)", i, refs)
		}
		p.DecRef()
	}
}

// TestBatchesSendersReadyTogether: senders made ready at once (the relay's
// readers of the connections whose answers one poll found) go to the
// link in one batch, not one system call each: the sender that wakes the
// dispatcher makes it the goroutine Go runs next, and it yields to the
// others first.
func TestBatchesSendersReadyTogether(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	l := newGatedLink(true)
	q := New(l, 1024, nil)
	t.Cleanup(q.Close)
	const n = 20
	for round := range 3 {
		before := len(l.batchesSoFar())
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				write(q, byte(i))
			})
		}
		time.Sleep(10 * time.Millisecond) // every sender waits on start
		close(start)
		wg.Wait()
		waitFor(t, "the packets", func() bool { return l.taken() == (round+1)*n })
		batches := l.batchesSoFar()[before:]
		t.Logf("round %d: %d packets in batches %v", round, n, batches)
		if len(batches) > 3 {
			t.Fatalf("%d senders ready together went out in %d batches %v, want at most 3", n, len(batches), batches)
		}
	}
}
