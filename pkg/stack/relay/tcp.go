package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/podsock"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

func netProto(a tcpip.Address) tcpip.NetworkProtocolNumber {
	if a.Len() == 16 {
		return ipv6.ProtocolNumber
	}
	return ipv4.ProtocolNumber
}

func addrPort(a tcpip.Address, port uint16) netip.AddrPort {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return netip.AddrPortFrom(ip.Unmap(), port)
}

func tcpipAddr(a netip.Addr) tcpip.Address { return tcpip.AddrFromSlice(a.AsSlice()) }

// forwardInbound relays a connection from the network to the application.
// It dials the application first, from the peer's own address and port,
// and completes the handshake only when that succeeds, so a refusal is a
// refusal on the wire too. Each request is pending (see pendingSet) until
// its handshake completes, and the handshake is given up after
// InboundHandshakeTimeout. Under pressure (see dialFirstShare) the order
// is reversed, as Linux's SYN cookies do: the handshake completes first,
// and only a peer that answered it gets the application dialled, so a
// flood of spoofed SYNs never reaches the application. The price, under
// pressure only, is that a refused connection is reset after its handshake
// instead of refused in answer to its SYN.
func (r *Relay) forwardInbound(req *tcp.ForwarderRequest) {
	id := req.ID() // req is not to be used once completed
	// The wire leg judged the SYN; the policy may have changed since.
	// Before knownClosed: a denied peer gets no RST either.
	if !r.ingressAllowed(id, policy.ProtoTCP) {
		req.Complete(false)
		return
	}
	if r.knownClosed(id.LocalPort, time.Now()) {
		r.stats.TCPRefused.Add(1)
		req.Complete(true)
		return
	}
	if !r.admitTCP() {
		req.Complete(true)
		return
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	e, pressure, evicted := r.pending.add(cancel)
	defer r.pending.remove(e)
	if evicted {
		r.stats.TCPPendingEvicted.Add(1)
	}
	if pressure {
		r.stats.TCPHandshakeFirst.Add(1)
		inEP, inWQ, ok := r.handshake(ctx, req)
		if !ok {
			r.stats.TCPActive.Add(-1)
			return
		}
		r.pending.remove(e)
		app, err := r.dialApp(context.Background(), id)
		if err != nil {
			r.stats.TCPActive.Add(-1)
			if podsock.Refused(err) {
				r.stats.TCPRefused.Add(1)
			}
			r.opts.Logger.Debug("relaying TCP after its handshake", "from", id.RemoteAddress, "to", id.LocalAddress, "port", id.LocalPort, "err", err)
			inEP.Abort()
			inEP.Close()
			return
		}
		r.start(newWireConn(inEP, inWQ), app)
		return
	}
	app, err := r.dialApp(ctx, id)
	if err != nil {
		r.stats.TCPActive.Add(-1)
		switch {
		case podsock.Refused(err):
			r.stats.TCPRefused.Add(1)
			req.Complete(true)
		case podsock.TimedOut(err) || ctx.Err() != nil:
			// No answer: stay silent and let the peer's own connect timeout
			// decide, as a kernel behind a silent path would.
			req.Complete(false)
		default:
			r.opts.Logger.Debug("relaying TCP", "from", id.RemoteAddress, "to", id.LocalAddress, "port", id.LocalPort, "err", err)
			req.Complete(true)
		}
		return
	}
	// The application listens on a port the wire leg does not mirror yet.
	r.kickMirror()
	inEP, inWQ, ok := r.handshake(ctx, req)
	if !ok {
		r.stats.TCPActive.Add(-1)
		podsock.Reset(app)
		return
	}
	r.start(newWireConn(inEP, inWQ), app)
}

// dialApp connects to the application id is for, from id's remote address
// and port.
func (r *Relay) dialApp(ctx context.Context, id stack.TransportEndpointID) (*net.TCPConn, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.InboundDialTimeout)
	defer cancel()
	from, to := addrPort(id.RemoteAddress, id.RemotePort), addrPort(id.LocalAddress, id.LocalPort)
	c, err := r.pod.Dialer.DialTCP(ctx, from, to)
	if errors.Is(err, syscall.EADDRINUSE) {
		// The peer's address and port are taken in the pod's kernel (a
		// pod reaching itself through a Service without masquerade): an
		// ephemeral port keeps the connection working at the cost of the
		// port being visible as rewritten.
		c, err = r.pod.Dialer.DialTCP(ctx, netip.AddrPortFrom(from.Addr(), 0), to)
	}
	return c, err
}

// admitTCP counts a new relayed connection against MaxTCP. It returns
// false when the relay is closing or full.
func (r *Relay) admitTCP() bool {
	if r.closing.Load() {
		return false
	}
	if r.stats.TCPActive.Add(1) > int64(r.opts.MaxTCP) {
		r.stats.TCPActive.Add(-1)
		r.stats.TCPLimitHit.Add(1)
		return false
	}
	return true
}

// handshake completes the wire leg's handshake of req and completes req.
// The handshake is aborted when ctx ends (eviction) or after
// InboundHandshakeTimeout: the peer never sent its final ACK, most likely
// because its address was spoofed.
func (r *Relay) handshake(ctx context.Context, req *tcp.ForwarderRequest) (tcpip.Endpoint, *waiter.Queue, bool) {
	id := req.ID()
	ctx, cancel := context.WithTimeout(ctx, r.opts.InboundHandshakeTimeout)
	defer cancel()
	returned := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		// The request may be cancelled before CreateEndpoint has registered
		// its endpoint: keep trying until it is there or the handshake is
		// over.
		for {
			if abortHandshake(r.wire, id) {
				if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
					r.stats.TCPHandshakeTimeouts.Add(1)
				}
				return
			}
			select {
			case <-returned:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	wq := new(waiter.Queue)
	ep, err := req.CreateEndpoint(wq)
	close(returned)
	stop()
	if err != nil {
		// Silence for an abandoned handshake, as for a SYN-RCVD that
		// expires in a kernel; a RST for anything else.
		req.Complete(ctx.Err() == nil)
		return nil, nil, false
	}
	req.Complete(false)
	return ep, wq, true
}

// start relays between an established pair.
func (r *Relay) start(wire *wireConn, pod *net.TCPConn) {
	r.stats.TCPTotal.Add(1)
	// The applications at both ends already chose when to send; a relay
	// that waits for more data (Nagle) only adds a round trip to every
	// request/response exchange. Go sets TCP_NODELAY on its own sockets.
	wire.ep.SocketOptions().SetDelayOption(false)
	go r.splice(wire, podConn{pod})
}

// dialTCP connects through the wire leg and keeps the endpoint and the
// netstack error, so that the caller can tell a refusal from a timeout and
// can abort the connection with a RST later.
func dialTCP(ctx context.Context, leg Leg, local, remote tcpip.FullAddress, proto tcpip.NetworkProtocolNumber) (*waiter.Queue, tcpip.Endpoint, tcpip.Error) {
	wq := new(waiter.Queue)
	ep, err := leg.Stack.NewEndpoint(tcp.ProtocolNumber, proto, wq)
	if err != nil {
		return nil, nil, err
	}
	entry, notify := waiter.NewChannelEntry(waiter.WritableEvents)
	wq.EventRegister(&entry)
	defer wq.EventUnregister(&entry)
	if err := ep.Bind(local); err != nil {
		ep.Close()
		return nil, nil, err
	}
	err = ep.Connect(remote)
	if _, started := err.(*tcpip.ErrConnectStarted); started {
		select {
		case <-ctx.Done():
			ep.Close()
			return nil, nil, &tcpip.ErrTimeout{}
		case <-notify:
		}
		err = ep.LastError()
	}
	if err != nil {
		ep.Close()
		return nil, nil, err
	}
	return wq, ep, nil
}

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
func (r *Relay) splice(w *wireConn, p podConn) {
	pr := &pair{w, p}
	r.conns.add(pr)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.ended(pr, r.wireToPod(w, p), func() error { return p.CloseWrite() })
	}()
	r.ended(pr, r.podToWire(p, w), w.CloseWrite)
	wg.Wait()
	r.conns.remove(pr)
	w.Close()
	p.Close()
	r.stats.TCPActive.Add(-1)
}

// ended finishes one direction: a clean end (the source's FIN) is passed
// on as a half-close and leaves the other direction flowing; an error
// resets both ends.
func (r *Relay) ended(pr *pair, err error, closeWrite func() error) {
	if err == nil {
		closeWrite()
		return
	}
	r.stats.TCPResets.Add(1)
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
// reads slowly (throughput measured level:
// docs/benchmarks/2026-12-01-relay-writev-gro.md).
// Peeked data stays valid because only this goroutine consumes the queue
// and only Abort (under peekMu) or Close (after this returns) frees it.
func (r *Relay) wireToPod(w *wireConn, p podConn) error {
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
			g := getGather(r.opts.CopyBufferBytes)
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
				r.stats.ToAppBytes.Add(int64(n))
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
// 64 KiB chunk at a time, so bulk data then took four reads where this
// takes one: in alternated lab runs pod→node fell to 7.1–7.5 Gbit/s
// against 7.7–9.1 and nginx 10 MiB with it
// (docs/benchmarks/2026-12-01-relay-writev-gro.md).
//
// Each read also tells how much the socket still holds (TCP_INQ, see
// appReader), so an answer costs one read, not a read and then another
// that says EAGAIN. The whole loop runs in one rc.Read callback for that:
// a new rc.Read forgets the readiness the netpoller saw meanwhile, so the
// read that finds the socket empty would be needed again.
func (r *Relay) podToWire(p podConn, w *wireConn) error {
	rc, err := p.SyscallConn()
	if err != nil {
		return err
	}
	ar := newAppReader(rc)
	var ferr error // what ended the loop: nil at the application's FIN
	err = rc.Read(func(fd uintptr) bool {
		for {
			buf := r.getBuf()
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
			if r.opts.Traffic != nil {
				r.opts.Traffic()
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
			r.stats.FromAppBytes.Add(int64(n))
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

func (r *Relay) getBuf() []byte {
	if b, ok := bufPool.Get().(*[]byte); ok && len(*b) == r.opts.CopyBufferBytes {
		return *b
	}
	return make([]byte, r.opts.CopyBufferBytes)
}

func putBuf(b []byte) { bufPool.Put(&b) }
