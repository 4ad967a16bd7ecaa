package relay

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

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

// forwardTCP relays the connection req announces to the other leg. It dials
// the other leg first, from the peer's own address and port, and completes
// the handshake only when that succeeds, so a refusal on one side is a
// refusal on the other.
func (r *Relay) forwardTCP(req *tcp.ForwarderRequest, to Leg, timeout time.Duration) {
	if !r.admitTCP(req) {
		return
	}
	outWQ, outEP, ok := r.dialFor(context.Background(), req, to, timeout)
	if !ok {
		return
	}
	var inWQ waiter.Queue
	inEP, terr := req.CreateEndpoint(&inWQ)
	if terr != nil {
		r.stats.TCPActive.Add(-1)
		outEP.Abort()
		outEP.Close()
		req.Complete(true)
		return
	}
	req.Complete(false)
	r.start(inEP, &inWQ, outEP, outWQ)
}

// forwardInbound is forwardTCP for connections from the network, whose
// sources may be spoofed. Each request is pending (see pendingSet) until
// its handshake completes, and the handshake is given up after
// InboundHandshakeTimeout. Under pressure (see dialFirstShare) the
// order is reversed, as Linux's SYN cookies do: the handshake completes
// first, and only a peer that answered it gets the application dialled, so
// a flood of spoofed SYNs never reaches the application. The price, under
// pressure only, is that a refused connection is reset after its handshake
// instead of refused in answer to its SYN.
func (r *Relay) forwardInbound(req *tcp.ForwarderRequest) {
	if !r.admitTCP(req) {
		return
	}
	id := req.ID() // req is not to be used once completed
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
		outWQ, outEP, err := r.dial(context.Background(), id, r.app, r.opts.InboundDialTimeout)
		if err != nil {
			r.stats.TCPActive.Add(-1)
			if _, refused := err.(*tcpip.ErrConnectionRefused); refused {
				r.stats.TCPRefused.Add(1)
			}
			r.opts.Logger.Debug("relaying TCP after its handshake", "from", id.RemoteAddress, "to", id.LocalAddress, "port", id.LocalPort, "err", err)
			inEP.Abort()
			inEP.Close()
			return
		}
		r.start(inEP, inWQ, outEP, outWQ)
		return
	}
	outWQ, outEP, ok := r.dialFor(ctx, req, r.app, r.opts.InboundDialTimeout)
	if !ok {
		return
	}
	inEP, inWQ, ok := r.handshake(ctx, req)
	if !ok {
		r.stats.TCPActive.Add(-1)
		outEP.Abort()
		outEP.Close()
		return
	}
	r.start(inEP, inWQ, outEP, outWQ)
}

// admitTCP counts a new relayed connection against MaxTCP, and refuses it
// when the relay is closing or full.
func (r *Relay) admitTCP(req *tcp.ForwarderRequest) bool {
	if r.closing.Load() {
		req.Complete(true)
		return false
	}
	if r.stats.TCPActive.Add(1) > int64(r.opts.MaxTCP) {
		r.stats.TCPActive.Add(-1)
		r.stats.TCPLimitHit.Add(1)
		req.Complete(true)
		return false
	}
	return true
}

// dialFor dials the other leg for req and, when that fails, completes req
// the way a kernel would answer: RST for a refusal, silence for no answer
// (or a request cancelled by ctx).
func (r *Relay) dialFor(ctx context.Context, req *tcp.ForwarderRequest, to Leg, timeout time.Duration) (*waiter.Queue, tcpip.Endpoint, bool) {
	outWQ, outEP, err := r.dial(ctx, req.ID(), to, timeout)
	if err == nil {
		return outWQ, outEP, true
	}
	r.stats.TCPActive.Add(-1)
	switch err.(type) {
	case *tcpip.ErrConnectionRefused:
		r.stats.TCPRefused.Add(1)
		req.Complete(true)
	case *tcpip.ErrTimeout, *tcpip.ErrAborted:
		// No answer: stay silent and let the peer's own connect timeout
		// decide, as a kernel behind a silent path would.
		req.Complete(false)
	default:
		id := req.ID()
		r.opts.Logger.Debug("relaying TCP", "from", id.RemoteAddress, "to", id.LocalAddress, "port", id.LocalPort, "err", err)
		req.Complete(true)
	}
	return nil, nil, false
}

// dial connects to id's local end through leg to, from id's remote address
// and port.
func (r *Relay) dial(ctx context.Context, id stack.TransportEndpointID, to Leg, timeout time.Duration) (*waiter.Queue, tcpip.Endpoint, tcpip.Error) {
	proto := netProto(id.LocalAddress)
	local := tcpip.FullAddress{NIC: to.NIC, Addr: id.RemoteAddress, Port: id.RemotePort}
	remote := tcpip.FullAddress{Addr: id.LocalAddress, Port: id.LocalPort}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	outWQ, outEP, err := dialTCP(ctx, to, local, remote, proto)
	if _, inUse := err.(*tcpip.ErrPortInUse); inUse {
		// The peer's port is taken on the other leg (another flow bound it);
		// an ephemeral port keeps the connection working at the cost of the
		// port being visible as rewritten.
		local.Port = 0
		outWQ, outEP, err = dialTCP(ctx, to, local, remote, proto)
	}
	return outWQ, outEP, err
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
func (r *Relay) start(inEP tcpip.Endpoint, inWQ *waiter.Queue, outEP tcpip.Endpoint, outWQ *waiter.Queue) {
	r.stats.TCPTotal.Add(1)
	// The applications at both ends already chose when to send; a relay
	// that waits for more data (Nagle) only adds a round trip to every
	// request/response exchange.
	inEP.SocketOptions().SetDelayOption(false)
	outEP.SocketOptions().SetDelayOption(false)
	in := &tcpConn{TCPConn: gonet.NewTCPConn(inWQ, inEP), ep: inEP}
	out := &tcpConn{TCPConn: gonet.NewTCPConn(outWQ, outEP), ep: outEP}
	go r.splice(in, out)
}

// dialTCP is gonet.DialTCPWithBind keeping the endpoint and the netstack
// error, so that the caller can tell a refusal from a timeout and can abort
// the connection with a RST later.
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

type tcpConn struct {
	*gonet.TCPConn
	ep        tcpip.Endpoint
	abortOnce sync.Once
}

// abort resets the connection: the peer sees a RST, as it would from a
// kernel whose other side was reset.
func (c *tcpConn) abort() { c.abortOnce.Do(c.ep.Abort) }

type pair struct{ a, b *tcpConn }

func (p *pair) Close() error {
	p.a.abort()
	p.b.abort()
	return nil
}

var bufPool sync.Pool

func (r *Relay) getBuf() []byte {
	if b, ok := bufPool.Get().(*[]byte); ok && len(*b) == r.opts.CopyBufferBytes {
		return *b
	}
	return make([]byte, r.opts.CopyBufferBytes)
}

func putBuf(b []byte) { bufPool.Put(&b) }

// splice copies both directions until both are done. A FIN is carried as a
// half-close; an error (RST, or shutdown) on either side aborts both.
func (r *Relay) splice(a, b *tcpConn) {
	p := &pair{a, b}
	r.conns.add(p)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.pipe(a, b)
	}()
	r.pipe(b, a)
	wg.Wait()
	r.conns.remove(p)
	a.Close()
	b.Close()
	r.stats.TCPActive.Add(-1)
}

// readerOnly hides the source's WriteTo, so io.CopyBuffer uses our buffer.
type readerOnly struct{ io.Reader }

func (r *Relay) pipe(src, dst *tcpConn) {
	buf := r.getBuf()
	defer putBuf(buf)
	_, err := io.CopyBuffer(dst.TCPConn, readerOnly{src.TCPConn}, buf)
	if err == nil {
		// EOF: the source half-closed; pass the FIN on and keep the other
		// direction flowing.
		dst.CloseWrite()
		return
	}
	if !errors.Is(err, io.EOF) {
		r.stats.TCPResets.Add(1)
	}
	src.abort()
	dst.abort()
}
