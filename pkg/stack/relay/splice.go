package relay

import (
	"errors"
	"io"
	"net"
	"sync"

	"github.com/cni-usernet/cni-usernet/pkg/stack/podsock"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/waiter"
)

// wireConn is the wire leg's end of a relayed connection.
type wireConn struct {
	*gonet.TCPConn // for writes: it waits for room in the send buffer
	ep             tcpip.Endpoint
	wq             *waiter.Queue
	abortOnce      sync.Once
	// peekMu is held while wireToPod writes to the application straight
	// from the segments netstack still holds (see wireToPod). Abort frees
	// those segments' buffers to a pool the link reader fills again, so
	// it waits for such a write to end. Never held while waiting for the
	// application's socket or for netstack.
	peekMu sync.Mutex
}

func newWireConn(ep tcpip.Endpoint, wq *waiter.Queue) *wireConn {
	return &wireConn{TCPConn: gonet.NewTCPConn(wq, ep), ep: ep, wq: wq}
}

// abort resets the connection: the peer sees a RST, as it would from a
// kernel whose other side was reset.
func (c *wireConn) abort() {
	c.abortOnce.Do(func() {
		c.peekMu.Lock()
		defer c.peekMu.Unlock()
		c.ep.Abort()
	})
}

// podConn is the pod kernel's end.
type podConn struct{ *net.TCPConn }

func (c podConn) abort() { podsock.Reset(c.TCPConn) }

type pair struct {
	w *wireConn
	p podConn
}

func (p *pair) Close() error {
	p.w.abort()
	p.p.abort()
	return nil
}

// splice copies both directions until both are done. A FIN is carried as a
// half-close; an error (RST, or shutdown) on either side aborts both.
// Towards the network a direction holds a copy buffer only while it has
// data to move, never while it waits, and towards the application it
// writes from netstack's own buffers: thousands of idle connections cost
// no buffers.
func (t *tcpRelay) splice(w *wireConn, p podConn) {
	pr := &pair{w, p}
	t.conns.add(pr)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t.ended(pr, t.wireToPod(w, p), func() error { return p.CloseWrite() })
	}()
	t.ended(pr, t.podToWire(p, w), w.CloseWrite)
	wg.Wait()
	t.conns.remove(pr)
	w.Close()
	p.Close()
	t.stats.TCPActive.Add(-1)
}

// ended finishes one direction: a clean end (the source's FIN) is passed
// on as a half-close and leaves the other direction flowing; an error
// resets both ends.
func (t *tcpRelay) ended(pr *pair, err error, closeWrite func() error) {
	if err == nil {
		closeWrite()
		return
	}
	t.stats.TCPResets.Add(1)
	pr.Close()
}

// wireToPod moves what the wire leg receives to the application. It
// returns nil at the peer's FIN.
//
// Nothing is copied on the way: the payload is peeked in netstack's
// receive queue, written to the application's socket with one writev from
// netstack's own buffers, and only the bytes the socket took are then
// consumed. A copy through a buffer of ours was 7 % of the stack's CPU
// receiving bulk data, and held 256 KiB per connection whose application
// reads slowly; throughput measured level (BENCHMARKS.md, the run that
// made the relay write from netstack's buffers).
// Peeked data stays valid because only this goroutine consumes the queue
// and only Abort (under peekMu) or Close (after this returns) frees it.
func (t *tcpRelay) wireToPod(w *wireConn, p podConn) error {
	rc, err := p.SyscallConn()
	if err != nil {
		return err
	}
	entry, readable := waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr)
	w.wq.EventRegister(&entry)
	defer w.wq.EventUnregister(&entry)
	for {
		var rerr tcpip.Error
		var werr error
		err := rc.Write(func(fd uintptr) bool {
			w.peekMu.Lock()
			defer w.peekMu.Unlock()
			g := getGather(t.opts.CopyBufferBytes)
			defer putGather(g)
			if _, rerr = w.ep.Read(g, tcpip.ReadOptions{Peek: true}); rerr != nil {
				return true
			}
			if testHookPeeked != nil {
				testHookPeeked(w)
			}
			n, errno := rawWritev(fd, g.iovs)
			if n > 0 {
				consume(w.ep, n)
				t.stats.ToAppBytes.Add(int64(n))
			}
			switch errno {
			case 0:
				return true
			case unix.EAGAIN:
				return false // the socket is full: wait for room
			default:
				werr = errno
				return true
			}
		})
		if err == nil {
			err = werr
		}
		if err != nil {
			return err
		}
		switch rerr.(type) {
		case nil:
		case *tcpip.ErrWouldBlock:
			<-readable
		case *tcpip.ErrClosedForReceive:
			return nil
		default:
			return errors.New(rerr.String())
		}
	}
}

// testHookPeeked, set by tests, runs while wireToPod holds data it peeked
// and has not written yet.
var testHookPeeked func(*wireConn)

// gatherMaxIovecs bounds one writev: a 64 KiB segment from the link
// reader spans about ten views.
const gatherMaxIovecs = 256

var errGatherFull = errors.New("gather full")

// gather is the io.Writer a peeking netstack Read fills: it keeps iovecs
// pointing into netstack's buffers instead of copying, up to about max
// bytes (a view is taken whole) and gatherMaxIovecs views. A connection
// holds one only while it writes, as it held a copy buffer before.
type gather struct {
	iovs  []unix.Iovec
	bytes int
	max   int
}

var gatherPool = sync.Pool{New: func() any { return &gather{iovs: make([]unix.Iovec, 0, gatherMaxIovecs)} }}

func getGather(max int) *gather {
	g := gatherPool.Get().(*gather)
	g.max = max
	return g
}

// putGather forgets the pointers into netstack's buffers, which the pool
// would otherwise keep from the garbage collector.
func putGather(g *gather) {
	clear(g.iovs)
	g.iovs, g.bytes = g.iovs[:0], 0
	gatherPool.Put(g)
}

func (g *gather) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if g.bytes >= g.max || len(g.iovs) == cap(g.iovs) {
		return 0, errGatherFull
	}
	g.iovs = append(g.iovs, unix.Iovec{Base: &p[0]})
	g.iovs[len(g.iovs)-1].SetLen(len(p))
	g.bytes += len(p)
	return len(p), nil
}

// consume drops the first n bytes of ep's receive queue, which the caller
// peeked and wrote.
func consume(ep tcpip.Endpoint, n int) {
	ep.Read(&tcpip.LimitedWriter{W: io.Discard, N: int64(n)}, tcpip.ReadOptions{})
}

// podToWire moves what the application sends to the wire leg. It returns
// nil at the application's FIN.
//
// It copies through a buffer of ours. netstack can read the socket itself
// (a Payloader whose Read is the read system call), but it reads into one
// 64 KiB chunk at a time, so bulk data would take four reads where this
// takes one, and pod→node bulk and nginx lose for it
// (docs/performance.md).
//
// Each read also tells how much the socket still holds (TCP_INQ, see
// appReader), so an answer costs one read, not a read and then another
// that says EAGAIN. The whole loop runs in one rc.Read callback for that:
// a new rc.Read forgets the readiness the netpoller saw meanwhile, so the
// read that finds the socket empty would be needed again.
func (t *tcpRelay) podToWire(p podConn, w *wireConn) error {
	rc, err := p.SyscallConn()
	if err != nil {
		return err
	}
	ar := newAppReader(rc)
	var ferr error // what ended the loop: nil at the application's FIN
	err = rc.Read(func(fd uintptr) bool {
		for {
			buf := t.getBuf()
			n, left, errno := ar.read(fd, buf)
			if testHookAppRead != nil {
				testHookAppRead(n, errno)
			}
			switch {
			case errno == unix.EAGAIN:
				// Wait for readability holding no buffer.
				putBuf(buf)
				return false
			case errno != 0:
				putBuf(buf)
				ferr = errno
				return true
			case n == 0:
				putBuf(buf)
				return true
			}
			if t.opts.Traffic != nil {
				t.opts.Traffic()
			}
			// netstack's write may wait for room in its send buffer;
			// waiting here keeps the socket's read lock, which only this
			// goroutine takes.
			_, werr := w.Write(buf[:n])
			putBuf(buf)
			if werr != nil {
				ferr = werr
				return true
			}
			t.stats.FromAppBytes.Add(int64(n))
			if left == 0 {
				// Empty when read: what arrived since marked the socket
				// readable, so the netpoller's wait returns at once
				// for it.
				return false
			}
		}
	})
	if err != nil {
		return err
	}
	return ferr
}

// testHookAppRead, set by tests, sees every read of podToWire.
var testHookAppRead func(n int, errno unix.Errno)

var bufPool sync.Pool

func (t *tcpRelay) getBuf() []byte {
	if b, ok := bufPool.Get().(*[]byte); ok && len(*b) == t.opts.CopyBufferBytes {
		return *b
	}
	return make([]byte, t.opts.CopyBufferBytes)
}

func putBuf(b []byte) { bufPool.Put(&b) }
