package control

import (
	"sync/atomic"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// Status is what the control socket reports.
type Status struct {
	// Protocol is the control protocol's version (control.Protocol);
	// Build the stack binary's source revision; SpecVersion and
	// ConfigVersion the newest spec and configuration formats it
	// understands. A reader of another release tells from them what it
	// talks to.
	Protocol      int    `json:"protocol"`
	Build         string `json:"build,omitempty"`
	SpecVersion   int    `json:"specVersion"`
	ConfigVersion int    `json:"configVersion"`
	// Healthy is Daemon.Healthy's verdict, Problem its reason.
	Healthy   bool      `json:"healthy"`
	Problem   string    `json:"problem,omitempty"`
	PID       int       `json:"pid"`
	StartTime time.Time `json:"startTime"`
	IfName    string    `json:"ifName"`
	TUNName   string    `json:"tunName"`
	// WireNetns is the stack's own namespace, which holds the pod's link
	// IfName; empty: the link shares the pod's namespace (an attachment
	// made by an earlier release, until the pod is recreated).
	WireNetns string           `json:"wireNetns,omitempty"`
	Spec      *podnet.Spec     `json:"spec"`
	GSO       offload.Decision `json:"gso"`
	Wire      LegStatus        `json:"wire"`
	Relay     RelayCounters    `json:"relay"`
	// Policy is the network policy in force and its denials; absent when
	// the stack does not enforce policy.
	Policy *policy.Status `json:"policy,omitempty"`
	// BusyPoll is what busy polling did; absent when it is off.
	BusyPoll *BusyPollStatus `json:"busyPoll,omitempty"`
	// Threads is how many threads run the stack's Go code.
	Threads ThreadsStatus `json:"threads"`
}

// BusyPollStatus is busypoll.Stats with its window: Windows counts the
// windows traffic opened, Handoffs the events the poller saw waiting and
// left to the netpoller, Polls its non-blocking polls. Auto says the
// window is governed: the stack's governor switches it by the node's idle
// CPU and CPU pressure (pkg/stack/governor), as it does the default
// window and a pod annotation's (Window says which length); false for
// the conflist's window, which polls always. On says whether it is on
// now, and Enabled how many times the governor turned it on.
type BusyPollStatus struct {
	Window   string `json:"window"`
	Auto     bool   `json:"auto"`
	On       bool   `json:"on"`
	Enabled  uint64 `json:"enabled,omitempty"`
	Windows  uint64 `json:"windows"`
	Handoffs uint64 `json:"handoffs"`
	Polls    uint64 `json:"polls"`
}

// LegStatus is the wire leg's counters. The tags of each field say what
// it counts (help) and, when the node agent exports it, as which metric
// (see RelayCountersOf).
type LegStatus struct {
	LinkCounters
	TCPRetransmits        uint64 `json:"tcpRetransmits" metric:"tcp_retransmitted_segments_total" help:"TCP segments the pod's wire stack retransmitted."`
	DroppedPackets        uint64 `json:"droppedPackets" metric:"dropped_packets_total{reason=netstack}" help:"Packets netstack dropped on the wire leg."`
	TCPCurrentEstablished uint64 `json:"tcpEstablished" help:"TCP connections of the wire leg in the established state now."`
	SocketDrops           uint64 `json:"socketDrops" metric:"dropped_packets_total{reason=packet_socket}" help:"Frames the kernel dropped at the packet socket because the stack did not read them in time."`
	// SynSocketDrops: the SYN socket is packetsock.NewSYNSocket's; what a
	// flood beyond the SYN path's speed costs (a real client retransmits).
	SynSocketDrops uint64 `json:"synSocketDrops" metric:"dropped_packets_total{reason=syn_socket}" help:"SYNs the kernel dropped at the SYN socket because the stack read them too slowly."`
	// FragSocketDrops: the fragment socket is packetsock.OpenFragments';
	// the fragment path takes a bounded share of the stack's time, so this
	// is a fragment flood's excess, as the kernel drops beyond its
	// reassembly limit.
	FragSocketDrops uint64 `json:"fragSocketDrops" metric:"dropped_packets_total{reason=fragment_socket}" help:"IP fragments the kernel dropped at the fragment socket because the stack's fragment path read them too slowly."`
	// A mirrored listener answers SYNs with a cookie when its handshake
	// backlog is full: a flood, most likely.
	SynCookiesSent    uint64 `json:"synCookiesSent" metric:"syn_cookies_total{result=sent}" help:"SYNs the mirrored listeners answered with a SYN cookie."`
	SynCookiesValid   uint64 `json:"synCookiesValid" metric:"syn_cookies_total{result=valid}" help:"Handshakes the mirrored listeners completed with a SYN cookie."`
	SynCookiesInvalid uint64 `json:"synCookiesInvalid" metric:"syn_cookies_total{result=invalid}" help:"ACKs to the mirrored listeners with a SYN cookie that did not verify."`
	ListenSynDrops    uint64 `json:"listenSynDrops" metric:"dropped_packets_total{reason=listen_syn_queue}" help:"SYNs dropped because a mirrored listener's accept queue was full."`
	ListenAckDrops    uint64 `json:"listenAckDrops" metric:"dropped_packets_total{reason=listen_ack_queue}" help:"ACKs dropped because a mirrored listener's accept queue was full."`
	// Errors netstack counted on the wire leg.
	IPMalformed        uint64 `json:"ipMalformed" metric:"errors_total{kind=ip_malformed}" help:"Malformed IP packets the wire leg received."`
	IPOutgoingErrors   uint64 `json:"ipOutgoingErrors" metric:"errors_total{kind=ip_outgoing}" help:"IP packets the wire leg failed to send."`
	TCPInvalidSegments uint64 `json:"tcpInvalidSegments" metric:"errors_total{kind=tcp_invalid_segment}" help:"TCP segments the wire leg dropped as invalid."`
	TCPChecksumErrors  uint64 `json:"tcpChecksumErrors" metric:"errors_total{kind=tcp_checksum}" help:"TCP segments the wire leg dropped for a bad checksum."`
}

// ThreadsStatus is the thread count (GOMAXPROCS) and, when it follows the
// load (Adaptive), the most it may be and how often it was raised and
// lowered.
type ThreadsStatus struct {
	Threads  int    `json:"threads"`
	Max      int    `json:"max"`
	Adaptive bool   `json:"adaptive"`
	Raised   uint64 `json:"raised,omitempty"`
	Lowered  uint64 `json:"lowered,omitempty"`
}

// RelayCountersOf are the relay's counters, defined once for both of
// their forms: RelayCounters, the snapshot the control socket reports, and
// LiveRelayCounters, the atomics the relay counts into (relay.Stats), which
// Snapshot reads. Each field's tags say what it counts (help, required)
// and, when the node agent exports it, as which metric: metric is the
// name after cni_usernet_pod_, kind "gauge" when it is not a counter, and
// a name with labels ("bytes_total{leg=app,direction=ingress}") is one
// series of a family the agent defines, whose help text covers all of
// them. Names and help texts are the metrics' public interface: change
// them only with docs/metrics.md.
type RelayCountersOf[T int64 | atomic.Int64] struct {
	TCPActive   T `json:"tcpActive" metric:"tcp_connections" kind:"gauge" help:"TCP connections the pod's stack relays now."`
	TCPTotal    T `json:"tcpTotal" metric:"tcp_connections_total" help:"TCP connections the pod's stack has relayed."`
	TCPRefused  T `json:"tcpRefused" metric:"tcp_connections_refused_total" help:"TCP connections refused by the other end (the application or the remote), passed on as a reset."`
	TCPLimitHit T `json:"tcpLimitHit" metric:"tcp_connections_over_limit_total" help:"TCP connections reset because the pod's stack relayed maxTCP connections already."`
	TCPResets   T `json:"tcpResets" metric:"tcp_resets_total" help:"Relayed TCP connections ended by a reset or an error rather than a close."`

	TCPSyns              T `json:"tcpSyns" help:"SYNs from the network offered to the relay."`
	TCPPending           T `json:"tcpPending" help:"Connections from the network not yet established (the application being dialled, or the peer's final ACK awaited)."`
	TCPPendingEvicted    T `json:"tcpPendingEvicted" help:"Pending connections from the network evicted by a newer one (Options.MaxPendingInbound)."`
	TCPHandshakeFirst    T `json:"tcpHandshakeFirst" help:"Connections from the network whose handshake completed before the application was dialled, the pending set being under pressure."`
	TCPHandshakeTimeouts T `json:"tcpHandshakeTimeouts" help:"Connections from the network dropped because the peer never sent the final ACK of its handshake."`

	UDPActive   T `json:"udpActive" metric:"udp_flows" kind:"gauge" help:"UDP flows the pod's stack relays now."`
	UDPTotal    T `json:"udpTotal" metric:"udp_flows_total" help:"UDP flows the pod's stack has relayed."`
	UDPLimitHit T `json:"udpLimitHit" metric:"udp_flows_over_limit_total" help:"UDP flows refused because the pod's stack relayed maxUDP flows already."`
	UDPEvicted  T `json:"udpEvicted" help:"UDP flows from the network evicted, never answered, to make room for a new one."`
	UDPDropped  T `json:"udpDropped" metric:"dropped_packets_total{reason=udp}" help:"UDP datagrams the relay could not deliver."`

	ICMPEchoes     T `json:"icmpEchoes" metric:"icmp_echoes_total" help:"ICMP echo requests the pod's applications sent that the stack relayed."`
	ICMPEchoFailed T `json:"icmpEchoFailed" metric:"icmp_echo_failures_total" help:"ICMP echo requests of the pod's applications that the stack could not relay."`

	TCPOutboundDropped T `json:"tcpOutboundDropped" help:"Applications' SYNs dropped and dials given up because Options.MaxOutboundPending connections were being dialled."`
	PodDropped         T `json:"podDropped" metric:"dropped_packets_total{reason=app_protocol}" help:"Packets from the applications the relay does not carry: protocols other than TCP, UDP and ICMP echo, the kernel's own IPv6 neighbour discovery on the TUN, what reaches its listeners from loopback."`
	PodSpoofed         T `json:"podSpoofed" metric:"spoofed_dropped_total{where=stack}" help:"Packets, connections and datagrams from the applications' leg whose source is none of the pod's addresses, dropped."`

	TCPMirrored      T `json:"tcpMirrored" help:"Applications' listeners the wire leg mirrors now."`
	TCPMirrorChanges T `json:"tcpMirrorChanges" help:"Mirrored listeners opened and closed."`
	TCPMirrorOverCap T `json:"tcpMirrorOverCap" help:"Applications' listeners the wire leg does not mirror now because it mirrors the most it may (relay's maxMirrored); connections to them go through the forwarder."`

	TCPCookieFast       T `json:"tcpCookieFast" help:"SYNs the fast path answered with a SYN cookie (relay.AnswerSYN)."`
	TCPCookieFastErrors T `json:"tcpCookieFastErrors" metric:"errors_total{kind=syn_cookie_answer}" help:"Fast-path SYN cookie answers the NIC's queue refused."`
	TCPCookieFastDirect T `json:"tcpCookieFastDirect" help:"Fast-path SYN cookie answers written past the NIC's full queue (relay.Leg.WriteDirect)."`

	// The app leg's traffic has bytes but no packets of the stack's own:
	// the kernel segments it.
	ToAppBytes   T `json:"toAppBytes" metric:"bytes_total{leg=app,direction=ingress}" help:"Payload the relay wrote to the applications' sockets (TCP streams and UDP datagrams)."`
	FromAppBytes T `json:"fromAppBytes" metric:"bytes_total{leg=app,direction=egress}" help:"Payload the relay read from the applications' sockets (TCP streams and UDP datagrams)."`
}

// RelayCounters are the relay's counters as the control socket reports
// them.
type RelayCounters = RelayCountersOf[int64]

// LiveRelayCounters are the relay's counters as it counts them; read them
// with Snapshot.
type LiveRelayCounters = RelayCountersOf[atomic.Int64]

// LinkCounters are the wire leg's link counters (the stack's
// podstack.LinkStats). Tags as in RelayCountersOf.
type LinkCounters struct {
	TxPackets    uint64 `json:"txPackets" metric:"packets_total{leg=wire,direction=egress}" help:"Frames the wire leg sent; a GSO batch counts once."`
	TxBytes      uint64 `json:"txBytes" metric:"bytes_total{leg=wire,direction=egress}" help:"Bytes of the frames the wire leg sent."`
	TxGSOBatches uint64 `json:"txGSOBatches" metric:"gso_batches_total" help:"Frames the wire leg handed to the link as one GSO batch larger than a segment."`
	TxErrors     uint64 `json:"txErrors" metric:"errors_total{kind=transmit}" help:"Frames the link failed to write."`
	RxPackets    uint64 `json:"rxPackets" metric:"packets_total{leg=wire,direction=ingress}" help:"Frames the wire leg received."`
	RxBytes      uint64 `json:"rxBytes" metric:"bytes_total{leg=wire,direction=ingress}" help:"Bytes of the frames the wire leg received."`
	RxSynShed    uint64 `json:"rxSynShed" metric:"dropped_packets_total{reason=syn_rate_limit}" help:"SYNs dropped before netstack beyond the new-connection admission cap."`
	RxSynCookied uint64 `json:"rxSynCookied" metric:"syn_cookies_total{result=fast_path}" help:"SYNs beyond the admission cap the link answered with the listener's SYN cookie itself."`
	RxOwnSource  uint64 `json:"rxOwnSource" metric:"dropped_packets_total{reason=own_source}" help:"Packets from the network dropped before netstack because their source was one of the pod's own addresses (a martian)."`
	// Waiting for room is back-pressure, not loss.
	TxQueueWaits uint64 `json:"txQueueWaits" help:"Packets that found the wire queue full and waited for room."`
	TxQueueDrops uint64 `json:"txQueueDrops" metric:"dropped_packets_total{reason=wire_queue}" help:"Packets the wire queue dropped because the link stalled (wirequeue.StallTime)."`
	RxFragments  uint64 `json:"rxFragments" help:"IP fragments received, each handed to netstack's reassembly in a buffer of its own size."`
	// The fragment socket is fragPath's: without one every fragment
	// arrives on the link's socket; with one, IPv6 fragments behind other
	// extension headers still do.
	RxFragmentsShared uint64 `json:"rxFragmentsShared" help:"IP fragments that arrived through the link's socket, queued with the other traffic, rather than through the fragment socket."`
	FragmentTurns     uint64 `json:"fragmentTurns" help:"Times the fragment path stopped at its budget with fragments still queued, to let the rest of the stack run: how often a flood kept it busy."`
}
