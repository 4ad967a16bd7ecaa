package wirelink

import (
	"net/netip"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// gate is the wire leg's link endpoint as netstack's NIC sees it: it
// counts what crosses the link, and keeps from netstack what the ingress
// policy denies and the SYNs beyond the cap, and copies each IP fragment
// into a buffer of its own size (fragments.go) before netstack's
// reassembly holds it.
type gate struct {
	nested.Endpoint
	stats *LinkStats
	// syn caps and answers the SYNs among the frames the link delivers;
	// nil: none (a link socket whose SYNs synPath reads still carries the
	// few its filter lets by: IPv6 ones behind extension headers).
	syn *synGate
	// answerSYN answers, with a SYN cookie, a SYN the gate turns away
	// from netstack (relay.AnswerSYN); nil: such SYNs are dropped.
	answerSYN func(ipPacket []byte, from tcpip.LinkAddress) bool
	// policy takes the ingress verdict on the packets that open
	// connections (ingress.go). Never nil.
	policy *enforce.Enforcer
	// own are the pod's own addresses (Options.PodAddrs), unmapped: no
	// packet from the wire carries one as its source (fromOwnAddr).
	// Read-only.
	own []netip.Addr
}

var (
	_ tcpipstack.LinkEndpoint      = (*gate)(nil)
	_ tcpipstack.NetworkDispatcher = (*gate)(nil)
)

func newGate(child tcpipstack.LinkEndpoint, stats *LinkStats) *gate {
	g := &gate{stats: stats}
	g.Endpoint.Init(child, g)
	return g
}

// DeliverNetworkPacket counts and passes the packet to netstack.
func (g *gate) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *tcpipstack.PacketBuffer) {
	if !g.admit(proto, pkt) {
		return
	}
	if c := g.stats.fragments.compactFragment(proto, pkt); c != nil {
		g.stats.fragments.shared.Add(1)
		g.Endpoint.DeliverNetworkPacket(proto, c)
		c.DecRef()
		return
	}
	g.Endpoint.DeliverNetworkPacket(proto, pkt)
}

// admit counts a received packet and reports whether it may go on to
// netstack: not from the pod's own address, then the ingress policy's
// verdict, then the SYN gate's.
func (g *gate) admit(proto tcpip.NetworkProtocolNumber, pkt *tcpipstack.PacketBuffer) bool {
	g.stats.RxPackets.Add(1)
	g.stats.RxBytes.Add(uint64(pkt.Size()))
	if fromOwnAddr(g, proto, pktHeaders{pkt}) {
		return false
	}
	// Before the SYN gate and its cookies: a denied peer gets nothing.
	if m := g.policy.For(policy.Ingress); m != nil && !admitIngress(m, proto, pktHeaders{pkt}) {
		return false
	}
	if g.syn != nil && isSYN(proto, pkt) {
		var answer func() bool
		if g.answerSYN != nil {
			answer = func() bool { return g.cookie(pkt) }
		}
		if g.stats.turnedAway(g.syn.admit(time.Now(), answer)) {
			return false
		}
	}
	return true
}

// turnedAway counts a SYN the gate kept from netstack, and reports
// whether it did.
func (s *LinkStats) turnedAway(v synVerdict) bool {
	switch v {
	case synCookied:
		s.RxSynCookied.Add(1)
	case synShed:
		s.RxSynShed.Add(1)
	default:
		return false
	}
	return true
}

// cookie hands a SYN the gate turned away from netstack to answerSYN.
func (g *gate) cookie(pkt *tcpipstack.PacketBuffer) bool {
	eth := pkt.LinkHeader().Slice()
	if len(eth) < header.EthernetMinimumSize {
		return false
	}
	ip, ok := pkt.Data().PullUp(pkt.Data().Size())
	if !ok {
		return false
	}
	return g.answerSYN(ip, header.Ethernet(eth).SourceAddress())
}
