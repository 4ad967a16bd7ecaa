package podstack

import (
	"sync/atomic"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirequeue"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// LinkStats counts what crosses one leg's link endpoint.
type LinkStats struct {
	TxPackets atomic.Uint64
	TxBytes   atomic.Uint64
	// TxGSOBatches counts packets handed to the link as one GSO burst larger
	// than a segment (hardware: split by the kernel; software: by netstack).
	TxGSOBatches atomic.Uint64
	TxErrors     atomic.Uint64
	RxPackets    atomic.Uint64
	RxBytes      atomic.Uint64
	// RxSynShed counts SYNs dropped before netstack beyond the new
	// connection rate cap (see synRate).
	RxSynShed atomic.Uint64
	// RxSynCookied counts SYNs beyond the cap answered with a SYN cookie
	// instead (relay.AnswerSYN).
	RxSynCookied atomic.Uint64
	// Queue counts the wire queue's waits for room and its drops.
	Queue wirequeue.Stats
	// fragments counts the IP fragments received (fragments.go).
	fragments fragmentLedger
}

// Snapshot reads every counter.
func (s *LinkStats) Snapshot() control.LinkCounters {
	return control.LinkCounters{
		TxPackets: s.TxPackets.Load(), TxBytes: s.TxBytes.Load(), TxGSOBatches: s.TxGSOBatches.Load(),
		TxErrors: s.TxErrors.Load(), RxPackets: s.RxPackets.Load(), RxBytes: s.RxBytes.Load(),
		RxSynShed: s.RxSynShed.Load(), RxSynCookied: s.RxSynCookied.Load(),
		TxQueueWaits: s.Queue.Waits.Load(), TxQueueDrops: s.Queue.Drops.Load(),
		RxFragments: s.fragments.count.Load(), RxFragmentsShared: s.fragments.shared.Load(),
		FragmentTurns: s.fragments.turns.Load(),
	}
}

// countingLink wraps the wire leg's link endpoint to count traffic.
type countingLink struct {
	nested.Endpoint
	stats *LinkStats
	// gate caps and answers the SYNs among the frames the link delivers;
	// nil: none (a link socket whose SYNs synPath reads still carries the
	// few its filter lets by: IPv6 ones behind extension headers).
	gate *synGate
	// answerSYN answers, with a SYN cookie, a SYN the gate turns away
	// from netstack (relay.AnswerSYN); nil: such SYNs are dropped.
	answerSYN func(ipPacket []byte, from tcpip.LinkAddress) bool
	// policy takes the ingress verdict on the packets that open
	// connections (policy.go). Never nil.
	policy *enforce.Enforcer
}

var (
	_ stack.LinkEndpoint      = (*countingLink)(nil)
	_ stack.NetworkDispatcher = (*countingLink)(nil)
)

func newCountingLink(child stack.LinkEndpoint, stats *LinkStats) *countingLink {
	l := &countingLink{stats: stats}
	l.Endpoint.Init(child, l)
	return l
}

// WritePackets counts before handing the batch on.
func (l *countingLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	// Summed first: one atomic add per batch, not per packet.
	var bytes, batches uint64
	for _, pkt := range pkts.AsSlice() {
		bytes += uint64(pkt.Size())
		if pkt.GSOOptions.Type != stack.GSONone && pkt.Data().Size() > int(pkt.GSOOptions.MSS) {
			batches++
		}
	}
	l.stats.TxBytes.Add(bytes)
	if batches > 0 {
		l.stats.TxGSOBatches.Add(batches)
	}
	n, err := l.Endpoint.WritePackets(pkts)
	l.stats.TxPackets.Add(uint64(n))
	if err != nil {
		l.stats.TxErrors.Add(1)
	}
	return n, err
}

// DeliverNetworkPacket counts and passes the packet to netstack.
func (l *countingLink) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	if !l.admit(proto, pkt) {
		return
	}
	if c := l.stats.fragments.compactFragment(proto, pkt); c != nil {
		l.stats.fragments.shared.Add(1)
		l.Endpoint.DeliverNetworkPacket(proto, c)
		c.DecRef()
		return
	}
	l.Endpoint.DeliverNetworkPacket(proto, pkt)
}

// admit counts a received packet and reports whether it may go on to
// netstack: the ingress policy's verdict, then the SYN gate's.
func (l *countingLink) admit(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) bool {
	l.stats.RxPackets.Add(1)
	l.stats.RxBytes.Add(uint64(pkt.Size()))
	// Before the SYN gate and its cookies: a denied peer gets nothing.
	if m := l.policy.For(policy.Ingress); m != nil && !admitIngress(m, proto, pktHeaders{pkt}) {
		return false
	}
	if l.gate != nil && isSYN(proto, pkt) {
		var answer func() bool
		if l.answerSYN != nil {
			answer = func() bool { return l.cookie(pkt) }
		}
		if l.stats.turnedAway(l.gate.admit(time.Now(), answer)) {
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
func (l *countingLink) cookie(pkt *stack.PacketBuffer) bool {
	eth := pkt.LinkHeader().Slice()
	if len(eth) < header.EthernetMinimumSize {
		return false
	}
	ip, ok := pkt.Data().PullUp(pkt.Data().Size())
	if !ok {
		return false
	}
	return l.answerSYN(ip, header.Ethernet(eth).SourceAddress())
}
