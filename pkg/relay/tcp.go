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
	id := req.ID()
	if r.closing.Load() {
		req.Complete(true)
		return
	}
	if r.stats.TCPActive.Add(1) > int64(r.opts.MaxTCP) {
		r.stats.TCPActive.Add(-1)
		r.stats.TCPLimitHit.Add(1)
		req.Complete(true)
		return
	}
	proto := netProto(id.LocalAddress)
	local := tcpip.FullAddress{NIC: to.NIC, Addr: id.RemoteAddress, Port: id.RemotePort}
	remote := tcpip.FullAddress{Addr: id.LocalAddress, Port: id.LocalPort}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	outWQ, outEP, err := dialTCP(ctx, to, local, remote, proto)
	if _, inUse := err.(*tcpip.ErrPortInUse); inUse {
		// The peer's port is taken on the other leg (another flow bound it);
		// an ephemeral port keeps the connection working at the cost of the
		// port being visible as rewritten.
		local.Port = 0
		outWQ, outEP, err = dialTCP(ctx, to, local, remote, proto)
	}
	cancel()
	if err != nil {
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
			r.opts.Logger.Debug("relaying TCP", "from", id.RemoteAddress, "to", id.LocalAddress, "port", id.LocalPort, "err", err)
			req.Complete(true)
		}
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
	r.stats.TCPTotal.Add(1)
	// The applications at both ends already chose when to send; a relay
	// that waits for more data (Nagle) only adds a round trip to every
	// request/response exchange.
	inEP.SocketOptions().SetDelayOption(false)
	outEP.SocketOptions().SetDelayOption(false)
	in := &tcpConn{TCPConn: gonet.NewTCPConn(&inWQ, inEP), ep: inEP}
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
