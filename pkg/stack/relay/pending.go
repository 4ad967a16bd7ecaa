package relay

import (
	"container/list"
	"context"
	"errors"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// errEvicted is the cancel cause of a pending connection pushed out by a
// newer one.
var errEvicted = errors.New("evicted by a newer connection request")

// pendingSet holds the inbound connection requests that are not yet
// established (dialling the application, or waiting for the peer's final
// ACK), oldest first. netstack's forwarder has no SYN cookies and keeps a
// passive handshake for about two minutes, so spoofed SYNs, which never
// complete, would otherwise fill every slot and lock real clients out. When
// the set is full, the oldest request is cancelled to make room, like the
// pruning of Linux's SYN queue: a real client completes its handshake in
// a round trip, long before a flood can push it out.
type pendingSet struct {
	max int
	mu  sync.Mutex // guards l
	l   list.List  // of context.CancelCauseFunc
}

// dialFirstShare: while at most 1/dialFirstShare of the set is in use, a
// request dials the application before its handshake (refusals stay exact);
// beyond, handshakes come first. A request that dials first holds a
// transparent socket in the pod's kernel, bound to the peer's (possibly
// spoofed) address, and a dial in progress: keeping those few keeps a
// flood from many spoofed sources from reaching the applications.
const dialFirstShare = 8

// add registers a request. It returns the element to remove when the
// request is settled, whether the set is under pressure (beyond
// 1/dialFirstShare full, counting the new request) and whether an older
// request was evicted.
func (p *pendingSet) add(cancel context.CancelCauseFunc) (e *list.Element, pressure, evicted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.l.Len() >= p.max {
		oldest := p.l.Front()
		p.l.Remove(oldest)
		oldest.Value.(context.CancelCauseFunc)(errEvicted)
		evicted = true
	}
	e = p.l.PushBack(cancel)
	return e, dialFirstShare*p.l.Len() > p.max, evicted
}

// remove settles a request; removing twice is harmless.
func (p *pendingSet) remove(e *list.Element) {
	p.mu.Lock()
	p.l.Remove(e) // a no-op for an element already removed
	p.mu.Unlock()
}

func (p *pendingSet) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.l.Len()
}

// abortHandshake ends the passive handshake of id on leg as if the peer had
// answered with ICMP host unreachable: netstack then fails the handshake at
// once and the forwarder request's CreateEndpoint returns. It only touches
// an endpoint still in SYN-RCVD, so a connection that completed meanwhile is
// left alone.
func abortHandshake(leg Leg, id tcpipstack.TransportEndpointID) bool {
	proto := netProto(id.LocalAddress)
	ep, ok := leg.Stack.FindTransportEndpoint(proto, tcp.ProtocolNumber, id, leg.NIC).(*tcp.Endpoint)
	if !ok || ep.EndpointState() != tcp.StateSynRecv {
		return false
	}
	pkt := tcpipstack.NewPacketBuffer(tcpipstack.PacketBufferOptions{})
	defer pkt.DecRef()
	pkt.NetworkProtocolNumber = proto
	ep.HandleError(hostUnreachable{}, pkt)
	return true
}

// hostUnreachable is the transport error abortHandshake delivers.
type hostUnreachable struct{}

var _ tcpipstack.TransportError = hostUnreachable{}

func (hostUnreachable) Origin() tcpip.SockErrOrigin { return tcpip.SockExtErrorOriginLocal }
func (hostUnreachable) Type() uint8                 { return 0 }
func (hostUnreachable) Code() uint8                 { return 0 }
func (hostUnreachable) Info() uint32                { return 0 }
func (hostUnreachable) Kind() tcpipstack.TransportErrorKind {
	return tcpipstack.DestinationHostUnreachableTransportError
}
