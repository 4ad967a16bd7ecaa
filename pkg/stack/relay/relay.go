// Package relay carries connections between the pod's wire leg (a netstack
// on the pod's interface) and the pod's own kernel, where the applications
// are: TCP streams, UDP flows and ICMP echo, with the peer's address and
// port preserved on both sides.
package relay

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
	"github.com/cni-usernet/cni-usernet/pkg/stack/podsock"
	"gvisor.dev/gvisor/pkg/tcpip"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// Leg is the wire side of the relay: a stack and the NIC to bind dials to.
type Leg struct {
	Stack *tcpipstack.Stack
	NIC   tcpip.NICID
	// MTU is the NIC's MTU: the MSS the SYN cookie fast path advertises
	// derives from it, as netstack's listener's does. Zero: 1500.
	MTU uint32
	// WriteDirect, when set, writes one IP packet to the link address to
	// without the NIC's queue. The SYN cookie fast path uses it when that
	// queue is full: at a full-speed flood the queue's sender falls
	// behind in bursts, and a real client whose SYN-ACK was dropped there
	// waits a second for its SYN retransmission.
	WriteDirect func(to tcpip.LinkAddress, proto tcpip.NetworkProtocolNumber, ipPacket []byte) error
}

// PodSide is the pod kernel's side of the relay: descriptors the stack
// opened during setup (see podsock and podkernel.Divert). The relay owns them
// once New succeeds.
type PodSide struct {
	// TUN carries what the applications send that the divert rules leave
	// in it: a connection's first SYN, echo requests, other protocols.
	TUN *os.File
	// TCPListeners receive the applications' connections once the stack
	// wrote their SYN back into the TUN.
	TCPListeners []*net.TCPListener
	// UDPListeners receive the applications' datagrams to peers that have
	// no flow yet, with their original destination.
	UDPListeners []*net.UDPConn
	// Dialer opens the per-connection sockets to the applications. Nil:
	// podsock's transparent sockets.
	Dialer Dialer
	// Diag lists the applications' listening sockets, which the wire leg
	// mirrors (see mirror.go). Nil: no mirror, every connection from the
	// network goes through the forwarder.
	Diag *podsock.Diag
}

// Dialer opens the pod side's per-connection sockets, from a remote
// peer's address to an application.
type Dialer interface {
	DialTCP(ctx context.Context, from, to netip.AddrPort) (*net.TCPConn, error)
	DialUDP(from, to netip.AddrPort) (*net.UDPConn, error)
}

// transparentDialer is the Dialer of a real pod.
type transparentDialer struct{}

func (transparentDialer) DialTCP(ctx context.Context, from, to netip.AddrPort) (*net.TCPConn, error) {
	return podsock.DialTCP(ctx, from, to)
}

func (transparentDialer) DialUDP(from, to netip.AddrPort) (*net.UDPConn, error) {
	return podsock.DialUDP(from, to)
}

// Close closes every descriptor of p; New's caller uses it when setup
// fails before the relay owns them.
func (p *PodSide) Close() {
	for _, l := range p.TCPListeners {
		l.Close()
	}
	for _, l := range p.UDPListeners {
		l.Close()
	}
	if p.TUN != nil {
		p.TUN.Close()
	}
	if p.Diag != nil {
		p.Diag.Close()
	}
}

// Options configures a Relay. Zero values take the documented defaults.
type Options struct {
	// MaxTCP caps concurrently relayed TCP connections; a SYN beyond it gets
	// a RST and counts in Stats.TCPLimitHit. Zero: 16384.
	MaxTCP int
	// MaxPendingInbound caps connections from the network that are not yet
	// established (the application being dialled, or the peer's final ACK
	// awaited); a SYN beyond it evicts the oldest (Stats.TCPPendingEvicted),
	// and beyond an eighth of it, handshakes complete before the application
	// is dialled (Stats.TCPHandshakeFirst). Zero: 1024.
	MaxPendingInbound int
	// InboundHandshakeTimeout is how long a connection from the network may
	// take to send the final ACK of its handshake once the application
	// accepted it; then both are dropped (Stats.TCPHandshakeTimeouts).
	// netstack alone would wait about two minutes. Zero: 20 s, time for
	// four SYN-ACK retransmissions (1, 3, 7, 15 s).
	InboundHandshakeTimeout time.Duration
	// MaxUDP caps concurrent UDP flows. A datagram from the network that
	// would open one more evicts the oldest flow from the network that has
	// never carried a reply (Stats.UDPEvicted), as conntrack's early drop
	// does; when there is none, the datagram is dropped
	// (Stats.UDPLimitHit). Zero: 4096.
	MaxUDP int
	// MaxUDPUnreplied caps the flows from the network that have not carried
	// a reply yet; beyond it the oldest is evicted. Each holds a socket in
	// the pod's kernel bound to the sender's (possibly spoofed) address, a
	// netstack endpoint and a goroutine, so this cap is what bounds a flood
	// from many sources. An evicted flow that is answered after all is
	// recreated by the answer, in the other direction. Zero: 256.
	MaxUDPUnreplied int
	// UDPIdle is how long a UDP flow lives without traffic either way. Zero:
	// 60 s, between Linux conntrack's 30 s unreplied and 120 s stream.
	UDPIdle time.Duration
	// UDPUnrepliedIdle is UDPIdle for a flow that has carried datagrams one
	// way only. Zero: 30 s (conntrack's unreplied UDP timeout), or UDPIdle
	// if that is shorter.
	UDPUnrepliedIdle time.Duration
	// InboundDialTimeout bounds dialling the application for a connection
	// from the network. The application is in the same kernel, so a
	// listening socket answers at once. Zero: 10 s.
	InboundDialTimeout time.Duration
	// OutboundDialTimeout bounds dialling a remote for the application. Zero:
	// 60 s (the kernel's connect gives up after about 127 s; the application
	// retransmits its SYN meanwhile and those are folded into the dial).
	OutboundDialTimeout time.Duration
	// MaxOutboundPending bounds the applications' connections whose remote
	// is still being dialled; beyond it a new one gives up the oldest dial
	// if that one is unanswered for a second, and is dropped otherwise
	// (both counted in Stats.TCPOutboundDropped); the application's next
	// SYN retransmission starts either again. Zero: 1024.
	MaxOutboundPending int
	// CopyBufferBytes is the most one relayed direction moves per system
	// call and per netstack read or write: the buffer podToWire copies
	// through (held only while it has data to move), and the most
	// wireToPod writes from netstack's buffers at once. Zero: 256 KiB:
	// four maximum-size segments. Against 64 KiB, bulk both ways and
	// nginx gain and the stack spends less CPU per byte
	// (docs/performance.md).
	CopyBufferBytes int
	// PodAddrs are the pod's own addresses (podnet.Spec.PodIPs): the only
	// sources the relay takes from the applications' leg, in the TUN and
	// on its listeners; anything else is dropped and counted in
	// Stats.PodSpoofed (see spoof.go). Empty: nothing from the
	// applications is relayed.
	PodAddrs []netip.Addr
	// Policy is the pod's network policy in force: the relay takes the
	// ingress verdict on UDP flows from the network and on every TCP
	// connection it accepts from there (ingress.go), the egress verdict
	// on the applications' connections, flows and echo requests, and
	// dials a Service VIP's allowed backend itself when egress is
	// isolated (docs/policy.md). Nil: everything is allowed.
	Policy *enforce.Enforcer
	// Logger receives the relay's messages: per-connection and per-flow
	// failures at Debug (a flood must not fill the stack's log; the
	// counters in Stats say how many), problems with the stack at Warn.
	// Nil: discarded.
	Logger *slog.Logger
	// Traffic, when set, is called after each read from an application's
	// socket (pkg/stack/busypoll: traffic keeps the stack's thread polling).
	Traffic func()
	// TUNGone is told, once, that the pod's TUN is gone: a pod with
	// CAP_NET_ADMIN deleted its eth0, and the descriptor reads and writes
	// nothing any more (EBADFD). The relay cannot reach the applications'
	// first SYNs again; the stack's process should exit so that the node
	// agent starts a new one, which creates the TUN anew from the spec.
	// Nil: the relay stops reading the TUN and logs it.
	TUNGone func(error)
}

// Defaults of the limits a memory bound is computed from
// (stack.MemoryBound).
const (
	DefaultMaxUDP            = 4096
	DefaultMaxUDPUnreplied   = 256
	DefaultMaxPendingInbound = 1024
)

func (o *Options) setDefaults() {
	if o.MaxTCP == 0 {
		o.MaxTCP = 16384
	}
	if o.MaxUDP == 0 {
		o.MaxUDP = DefaultMaxUDP
	}
	if o.MaxPendingInbound == 0 {
		o.MaxPendingInbound = DefaultMaxPendingInbound
	}
	if o.InboundHandshakeTimeout == 0 {
		o.InboundHandshakeTimeout = 20 * time.Second
	}
	if o.MaxUDPUnreplied == 0 {
		o.MaxUDPUnreplied = DefaultMaxUDPUnreplied
	}
	if o.UDPIdle == 0 {
		o.UDPIdle = 60 * time.Second
	}
	if o.UDPUnrepliedIdle == 0 {
		o.UDPUnrepliedIdle = 30 * time.Second
	}
	o.UDPUnrepliedIdle = min(o.UDPUnrepliedIdle, o.UDPIdle)
	if o.InboundDialTimeout == 0 {
		o.InboundDialTimeout = 10 * time.Second
	}
	if o.OutboundDialTimeout == 0 {
		o.OutboundDialTimeout = 60 * time.Second
	}
	if o.MaxOutboundPending == 0 {
		o.MaxOutboundPending = 1024
	}
	if o.CopyBufferBytes == 0 {
		o.CopyBufferBytes = 256 << 10
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Stats are the relay's counters, read concurrently by the control
// socket; control.RelayCountersOf says what each counts.
type Stats struct {
	control.LiveRelayCounters
}

// Snapshot reads every counter.
func (s *Stats) Snapshot() control.RelayCounters {
	return control.Snapshot[control.RelayCounters](&s.LiveRelayCounters)
}

// env is what the protocols' relays share: the two legs, the options,
// the counters and the shutdown state. The Relay owns it; tcpRelay,
// udpRelay and the mirror read it through a pointer.
type env struct {
	wire    Leg
	pod     PodSide
	opts    Options
	stats   Stats
	closing atomic.Bool
	conns   connSet        // live relayed connections and flows, closed on shutdown
	tunGone sync.Once      // TUNGone is called once
	wg      sync.WaitGroup // the pod side's readers, the mirror and its accept loops
	// ctx ends, and done closes, when the relay closes.
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// Relay joins the wire leg (the pod's interface) and the pod's kernel. It
// routes each protocol to the relay that owns its state: TCP connections
// (tcpRelay), UDP flows (udpRelay) and ICMP echo (Pinger).
type Relay struct {
	env
	tcp  *tcpRelay
	udp  *udpRelay
	icmp *Pinger
}

// newRelay assembles a relay without starting it: New installs its
// handlers and starts its goroutines, tests use parts of it as they are.
func newRelay(wire Leg, pod PodSide, opts Options) *Relay {
	opts.setDefaults()
	if pod.Dialer == nil {
		pod.Dialer = transparentDialer{}
	}
	opts.PodAddrs = slices.Clone(opts.PodAddrs)
	for i, a := range opts.PodAddrs {
		opts.PodAddrs[i] = a.Unmap()
	}
	r := &Relay{env: env{wire: wire, pod: pod, opts: opts, done: make(chan struct{})}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.conns.init()
	r.tcp = newTCPRelay(&r.env)
	r.udp = newUDPRelay(&r.env)
	return r
}

// New installs the relay's forwarders on the wire leg and starts reading
// the pod side.
func New(wire Leg, pod PodSide, opts Options) (*Relay, error) {
	if wire.Stack == nil || pod.TUN == nil {
		return nil, fmt.Errorf("relay needs the wire stack and the TUN")
	}
	r := newRelay(wire, pod, opts)
	r.icmp = newPinger(r.wire, r.pod.TUN, &r.stats, r.opts.Policy)
	// Inbound: from the network to the application.
	r.tcp.install()
	r.wire.Stack.SetTransportProtocolHandler(udp.ProtocolNumber,
		udp.NewForwarder(r.wire.Stack, r.udp.forwardInbound).HandlePacket)
	// Outbound: from the applications to the network.
	r.wg.Add(1)
	go r.readTUN()
	for _, l := range r.pod.TCPListeners {
		r.wg.Add(1)
		go r.tcp.acceptOutbound(l)
	}
	for _, l := range r.pod.UDPListeners {
		r.wg.Add(1)
		go r.udp.readOutbound(l)
	}
	r.tcp.mirror.start()
	return r, nil
}

// Stats returns the live counters.
func (r *Relay) Stats() *Stats { return &r.stats }

// Close stops accepting new relays, closes every live one and the pod
// side's descriptors.
func (r *Relay) Close() {
	r.closing.Store(true)
	r.cancel()
	close(r.done)
	r.pod.Close()
	r.wg.Wait()
	if r.icmp != nil {
		r.icmp.Close()
	}
	r.tcp.outbound.closeAll()
	r.conns.closeAll()
}
