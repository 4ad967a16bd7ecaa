// Package relay carries connections between the pod's two netstack legs:
// TCP streams, UDP flows and ICMP echo, with the peer's address and port
// preserved on both sides.
package relay

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// Leg is one side of the relay: a stack and the NIC to bind dials to.
type Leg struct {
	Stack *stack.Stack
	NIC   tcpip.NICID
}

// Options configures a Relay. Zero values take the documented defaults.
type Options struct {
	// MaxTCP caps concurrently relayed TCP connections; a SYN beyond it gets
	// a RST and counts in Stats.TCPLimitHit. Zero: 16384.
	MaxTCP int
	// MaxUDP caps concurrent UDP flows; a datagram that would open one more
	// is dropped and counted. Zero: 4096.
	MaxUDP int
	// UDPIdle is how long a UDP flow lives without traffic either way. Zero:
	// 60 s, between Linux conntrack's 30 s unreplied and 120 s stream.
	UDPIdle time.Duration
	// InboundDialTimeout bounds dialling the application for a connection
	// from the network. The application is in the same kernel, so a
	// listening socket answers at once. Zero: 10 s.
	InboundDialTimeout time.Duration
	// OutboundDialTimeout bounds dialling a remote for the application. Zero:
	// 60 s (the kernel's connect gives up after about 127 s; the application
	// retransmits its SYN meanwhile and the forwarder folds those in).
	OutboundDialTimeout time.Duration
	// CopyBufferBytes is the buffer each relayed direction copies through.
	// Zero: 64 KiB, one maximum-size TSO segment.
	CopyBufferBytes int
	// Logger receives relay errors (rate limited by the caller's handler).
	Logger *slog.Logger
}

func (o *Options) setDefaults() {
	if o.MaxTCP == 0 {
		o.MaxTCP = 16384
	}
	if o.MaxUDP == 0 {
		o.MaxUDP = 4096
	}
	if o.UDPIdle == 0 {
		o.UDPIdle = 60 * time.Second
	}
	if o.InboundDialTimeout == 0 {
		o.InboundDialTimeout = 10 * time.Second
	}
	if o.OutboundDialTimeout == 0 {
		o.OutboundDialTimeout = 60 * time.Second
	}
	if o.CopyBufferBytes == 0 {
		o.CopyBufferBytes = 64 << 10
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Stats are the relay's counters, read concurrently by the control socket.
type Stats struct {
	TCPActive      atomic.Int64
	TCPTotal       atomic.Int64
	TCPRefused     atomic.Int64
	TCPLimitHit    atomic.Int64
	TCPResets      atomic.Int64
	UDPActive      atomic.Int64
	UDPTotal       atomic.Int64
	UDPLimitHit    atomic.Int64
	UDPDropped     atomic.Int64
	ICMPEchoes     atomic.Int64
	ICMPEchoFailed atomic.Int64
}

// Snapshot is a plain copy of Stats for JSON.
type Snapshot struct {
	TCPActive      int64 `json:"tcpActive"`
	TCPTotal       int64 `json:"tcpTotal"`
	TCPRefused     int64 `json:"tcpRefused"`
	TCPLimitHit    int64 `json:"tcpLimitHit"`
	TCPResets      int64 `json:"tcpResets"`
	UDPActive      int64 `json:"udpActive"`
	UDPTotal       int64 `json:"udpTotal"`
	UDPLimitHit    int64 `json:"udpLimitHit"`
	UDPDropped     int64 `json:"udpDropped"`
	ICMPEchoes     int64 `json:"icmpEchoes"`
	ICMPEchoFailed int64 `json:"icmpEchoFailed"`
}

// Snapshot reads every counter.
func (s *Stats) Snapshot() Snapshot {
	return Snapshot{
		TCPActive: s.TCPActive.Load(), TCPTotal: s.TCPTotal.Load(), TCPRefused: s.TCPRefused.Load(),
		TCPLimitHit: s.TCPLimitHit.Load(), TCPResets: s.TCPResets.Load(),
		UDPActive: s.UDPActive.Load(), UDPTotal: s.UDPTotal.Load(), UDPLimitHit: s.UDPLimitHit.Load(),
		UDPDropped: s.UDPDropped.Load(), ICMPEchoes: s.ICMPEchoes.Load(), ICMPEchoFailed: s.ICMPEchoFailed.Load(),
	}
}

// Relay joins the wire leg (the pod's interface) and the app leg (the TUN
// the applications use).
type Relay struct {
	wire, app Leg
	opts      Options
	stats     Stats
	closing   atomic.Bool
	conns     connSet // live relayed connections, closed on shutdown
}

// maxInFlight bounds half-open connections per forwarder: the SYNs whose
// other-leg dial is still in progress. Beyond it a SYN is dropped and the
// peer retransmits, which is what a kernel's full SYN queue does too.
const maxInFlight = 1024

// New installs the relay's forwarders on both legs.
func New(wire, app Leg, opts Options) (*Relay, error) {
	opts.setDefaults()
	r := &Relay{wire: wire, app: app, opts: opts}
	r.conns.init()
	if wire.Stack == nil || app.Stack == nil {
		return nil, fmt.Errorf("relay needs both stacks")
	}
	// Inbound: from the network to the application.
	wire.Stack.SetTransportProtocolHandler(tcp.ProtocolNumber,
		tcp.NewForwarder(wire.Stack, 0, maxInFlight, func(req *tcp.ForwarderRequest) {
			r.forwardTCP(req, app, opts.InboundDialTimeout)
		}).HandlePacket)
	wire.Stack.SetTransportProtocolHandler(udp.ProtocolNumber,
		udp.NewForwarder(wire.Stack, func(req *udp.ForwarderRequest) bool {
			return r.forwardUDP(req, app)
		}).HandlePacket)
	// Outbound: from the application to the network.
	app.Stack.SetTransportProtocolHandler(tcp.ProtocolNumber,
		tcp.NewForwarder(app.Stack, 0, maxInFlight, func(req *tcp.ForwarderRequest) {
			r.forwardTCP(req, wire, opts.OutboundDialTimeout)
		}).HandlePacket)
	app.Stack.SetTransportProtocolHandler(udp.ProtocolNumber,
		udp.NewForwarder(app.Stack, func(req *udp.ForwarderRequest) bool {
			return r.forwardUDP(req, wire)
		}).HandlePacket)
	return r, nil
}

// Stats returns the live counters.
func (r *Relay) Stats() *Stats { return &r.stats }

// Close stops accepting new relays and closes every live one.
func (r *Relay) Close() {
	r.closing.Store(true)
	r.conns.closeAll()
}
