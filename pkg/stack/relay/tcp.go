package relay

import (
	"cmp"
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/podsock"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
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

// tcpRelay relays TCP connections: from the network through netstack's
// forwarder (forwardInbound) or a mirrored listener (see mirror.go), from
// the applications through the TUN and the pod's listeners (outbound.go).
type tcpRelay struct {
	*env
	pending  pendingSet  // inbound connections not yet established
	outbound outboundSet // applications' connections being dialled
	mirror   *mirror     // the wire leg's copies of the applications' listeners
	wireMTU  int         // the wire NIC's MTU, for the SYN cookie fast path
}

func newTCPRelay(e *env) *tcpRelay {
	t := &tcpRelay{env: e, wireMTU: int(cmp.Or(e.wire.MTU, 1500))}
	t.pending.max = e.opts.MaxPendingInbound
	t.outbound.init(e.opts.MaxOutboundPending)
	t.mirror = newMirror(e, t.relayAccepted)
	return t
}

// install makes the relay netstack's TCP handler on the wire leg.
func (t *tcpRelay) install() {
	// The forwarder's own limit leaves room for evicted requests that are
	// still unwinding; the pending set is the bound that matters.
	inbound := tcp.NewForwarder(t.wire.Stack, 0, 2*t.opts.MaxPendingInbound, func(req *tcp.ForwarderRequest) {
		t.stats.TCPPending.Add(1)
		defer t.stats.TCPPending.Add(-1)
		t.forwardInbound(req)
	})
	t.wire.Stack.SetTransportProtocolHandler(tcp.ProtocolNumber, func(id tcpipstack.TransportEndpointID, pkt *tcpipstack.PacketBuffer) bool {
		if h := header.TCP(pkt.TransportHeader().Slice()); len(h) >= header.TCPMinimumSize {
			if f := h.Flags(); f.Contains(header.TCPFlagSyn) && !f.Contains(header.TCPFlagAck) {
				t.stats.TCPSyns.Add(1)
			}
		}
		return inbound.HandlePacket(id, pkt)
	})
}

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
func (t *tcpRelay) forwardInbound(req *tcp.ForwarderRequest) {
	id := req.ID() // req is not to be used once completed
	// The wire leg judged the SYN; the policy may have changed since.
	// Before knownClosed: a denied peer gets no RST either.
	if !t.ingressAllowed(id, policy.ProtoTCP) {
		req.Complete(false)
		return
	}
	if t.mirror.knownClosed(id.LocalPort, time.Now()) {
		t.stats.TCPRefused.Add(1)
		req.Complete(true)
		return
	}
	if !t.admit() {
		req.Complete(true)
		return
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	e, pressure, evicted := t.pending.add(cancel)
	defer t.pending.remove(e)
	if evicted {
		t.stats.TCPPendingEvicted.Add(1)
	}
	if pressure {
		t.stats.TCPHandshakeFirst.Add(1)
		inEP, inWQ, ok := t.handshake(ctx, req)
		if !ok {
			t.stats.TCPActive.Add(-1)
			return
		}
		t.pending.remove(e)
		app, err := t.dialApp(context.Background(), id)
		if err != nil {
			t.stats.TCPActive.Add(-1)
			if podsock.Refused(err) {
				t.stats.TCPRefused.Add(1)
			}
			t.opts.Logger.Debug("relaying TCP after its handshake", "from", id.RemoteAddress, "to", id.LocalAddress, "port", id.LocalPort, "err", err)
			inEP.Abort()
			inEP.Close()
			return
		}
		t.start(newWireConn(inEP, inWQ), app)
		return
	}
	app, err := t.dialApp(ctx, id)
	if err != nil {
		t.stats.TCPActive.Add(-1)
		switch {
		case podsock.Refused(err):
			t.stats.TCPRefused.Add(1)
			req.Complete(true)
		case podsock.TimedOut(err) || ctx.Err() != nil:
			// No answer: stay silent and let the peer's own connect timeout
			// decide, as a kernel behind a silent path would.
			req.Complete(false)
		default:
			t.opts.Logger.Debug("relaying TCP", "from", id.RemoteAddress, "to", id.LocalAddress, "port", id.LocalPort, "err", err)
			req.Complete(true)
		}
		return
	}
	// The application listens on a port the wire leg does not mirror yet.
	t.mirror.kick()
	inEP, inWQ, ok := t.handshake(ctx, req)
	if !ok {
		t.stats.TCPActive.Add(-1)
		podsock.Reset(app)
		return
	}
	t.start(newWireConn(inEP, inWQ), app)
}

// relayAccepted dials the application for a connection whose handshake a
// mirrored listener completed; a refusal (the application closed its
// listener meanwhile) resets it. A peer the ingress policy denies is
// dropped unanswered first (see ingress.go): its handshake may have
// completed through a SYN cookie, without the SYN the wire leg judged.
func (t *tcpRelay) relayAccepted(ep tcpip.Endpoint, wq *waiter.Queue) {
	local, lerr := ep.GetLocalAddress()
	remote, rerr := ep.GetRemoteAddress()
	if lerr != nil || rerr != nil {
		ep.Abort()
		ep.Close()
		return
	}
	id := tcpipstack.TransportEndpointID{LocalAddress: local.Addr, LocalPort: local.Port, RemoteAddress: remote.Addr, RemotePort: remote.Port}
	if !t.ingressAllowed(id, policy.ProtoTCP) {
		abortSilently(ep, wq)
		return
	}
	if !t.admit() {
		ep.Abort()
		ep.Close()
		return
	}
	app, err := t.dialApp(t.ctx, id)
	if err != nil {
		t.stats.TCPActive.Add(-1)
		if podsock.Refused(err) {
			t.stats.TCPRefused.Add(1)
			t.mirror.kick()
		}
		ep.Abort()
		ep.Close()
		return
	}
	t.start(newWireConn(ep, wq), app)
}

// dialApp connects to the application id is for, from id's remote address
// and port.
func (t *tcpRelay) dialApp(ctx context.Context, id tcpipstack.TransportEndpointID) (*net.TCPConn, error) {
	ctx, cancel := context.WithTimeout(ctx, t.opts.InboundDialTimeout)
	defer cancel()
	from, to := addrPort(id.RemoteAddress, id.RemotePort), addrPort(id.LocalAddress, id.LocalPort)
	c, err := t.pod.Dialer.DialTCP(ctx, from, to)
	if errors.Is(err, syscall.EADDRINUSE) {
		// The peer's address and port are taken in the pod's kernel (a
		// pod reaching itself through a Service without masquerade): an
		// ephemeral port keeps the connection working at the cost of the
		// port being visible as rewritten.
		c, err = t.pod.Dialer.DialTCP(ctx, netip.AddrPortFrom(from.Addr(), 0), to)
	}
	return c, err
}

// admit counts a new relayed connection against MaxTCP. It returns
// false when the relay is closing or full.
func (t *tcpRelay) admit() bool {
	if t.closing.Load() {
		return false
	}
	if t.stats.TCPActive.Add(1) > int64(t.opts.MaxTCP) {
		t.stats.TCPActive.Add(-1)
		t.stats.TCPLimitHit.Add(1)
		return false
	}
	return true
}

// handshake completes the wire leg's handshake of req and completes req.
// The handshake is aborted when ctx ends (eviction) or after
// InboundHandshakeTimeout: the peer never sent its final ACK, most likely
// because its address was spoofed.
func (t *tcpRelay) handshake(ctx context.Context, req *tcp.ForwarderRequest) (tcpip.Endpoint, *waiter.Queue, bool) {
	id := req.ID()
	ctx, cancel := context.WithTimeout(ctx, t.opts.InboundHandshakeTimeout)
	defer cancel()
	returned := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		// The request may be cancelled before CreateEndpoint has registered
		// its endpoint: keep trying until it is there or the handshake is
		// over.
		for {
			if abortHandshake(t.wire, id) {
				if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
					t.stats.TCPHandshakeTimeouts.Add(1)
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
func (t *tcpRelay) start(wire *wireConn, pod *net.TCPConn) {
	t.stats.TCPTotal.Add(1)
	// The applications at both ends already chose when to send; a relay
	// that waits for more data (Nagle) only adds a round trip to every
	// request/response exchange. Go sets TCP_NODELAY on its own sockets.
	wire.ep.SocketOptions().SetDelayOption(false)
	go t.splice(wire, podConn{pod})
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
