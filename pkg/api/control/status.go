package control

import (
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
// left to the netpoller, Polls its non-blocking polls.
type BusyPollStatus struct {
	Window   string `json:"window"`
	Windows  uint64 `json:"windows"`
	Handoffs uint64 `json:"handoffs"`
	Polls    uint64 `json:"polls"`
}

// LegStatus is the wire leg's counters.
type LegStatus struct {
	LinkCounters
	TCPRetransmits        uint64 `json:"tcpRetransmits"`
	DroppedPackets        uint64 `json:"droppedPackets"`
	TCPCurrentEstablished uint64 `json:"tcpEstablished"`
	// SocketDrops counts frames the kernel dropped at the packet socket
	// because the stack did not read them in time.
	SocketDrops uint64 `json:"socketDrops"`
	// SynSocketDrops counts SYNs the kernel dropped at the SYN socket
	// (packetsock.NewSYNSocket) because the stack read them too slowly: what a
	// flood beyond the SYN path's speed costs (a real client retransmits).
	SynSocketDrops uint64 `json:"synSocketDrops"`
	// FragSocketDrops counts IP fragments the kernel dropped at the
	// fragment socket (packetsock.OpenFragments) because the stack's
	// fragment path, which takes a bounded share of its time, read them
	// too slowly: a fragment flood's excess, as the kernel drops beyond
	// its reassembly limit.
	FragSocketDrops uint64 `json:"fragSocketDrops"`
	// SynCookiesSent counts SYNs the mirrored listeners answered with a
	// SYN cookie (their handshake backlog was full: a flood, most likely),
	// SynCookiesValid the handshakes completed with one, SynCookiesInvalid
	// ACKs with a cookie that did not verify; ListenSynDrops and
	// ListenAckDrops count SYNs and ACKs dropped because a listener's
	// accept queue was full.
	SynCookiesSent    uint64 `json:"synCookiesSent"`
	SynCookiesValid   uint64 `json:"synCookiesValid"`
	SynCookiesInvalid uint64 `json:"synCookiesInvalid"`
	ListenSynDrops    uint64 `json:"listenSynDrops"`
	ListenAckDrops    uint64 `json:"listenAckDrops"`
	// Errors netstack counted on the wire leg: malformed IP packets
	// received, IP packets it failed to send, TCP segments dropped as
	// invalid or with a bad checksum (the node's metrics export them).
	IPMalformed        uint64 `json:"ipMalformed"`
	IPOutgoingErrors   uint64 `json:"ipOutgoingErrors"`
	TCPInvalidSegments uint64 `json:"tcpInvalidSegments"`
	TCPChecksumErrors  uint64 `json:"tcpChecksumErrors"`
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

// RelayCounters are the relay's counters (the stack's relay.Stats).
type RelayCounters struct {
	TCPActive            int64 `json:"tcpActive"`
	TCPTotal             int64 `json:"tcpTotal"`
	TCPRefused           int64 `json:"tcpRefused"`
	TCPLimitHit          int64 `json:"tcpLimitHit"`
	TCPResets            int64 `json:"tcpResets"`
	TCPSyns              int64 `json:"tcpSyns"`
	TCPPending           int64 `json:"tcpPending"`
	TCPPendingEvicted    int64 `json:"tcpPendingEvicted"`
	TCPHandshakeFirst    int64 `json:"tcpHandshakeFirst"`
	TCPHandshakeTimeouts int64 `json:"tcpHandshakeTimeouts"`
	UDPActive            int64 `json:"udpActive"`
	UDPTotal             int64 `json:"udpTotal"`
	UDPLimitHit          int64 `json:"udpLimitHit"`
	UDPEvicted           int64 `json:"udpEvicted"`
	UDPDropped           int64 `json:"udpDropped"`
	ICMPEchoes           int64 `json:"icmpEchoes"`
	ICMPEchoFailed       int64 `json:"icmpEchoFailed"`
	TCPOutboundDropped   int64 `json:"tcpOutboundDropped"`
	PodDropped           int64 `json:"podDropped"`
	PodSpoofed           int64 `json:"podSpoofed"`
	TCPMirrored          int64 `json:"tcpMirrored"`
	TCPMirrorChanges     int64 `json:"tcpMirrorChanges"`
	TCPCookieFast        int64 `json:"tcpCookieFast"`
	TCPCookieFastErrors  int64 `json:"tcpCookieFastErrors"`
	TCPCookieFastDirect  int64 `json:"tcpCookieFastDirect"`
	ToAppBytes           int64 `json:"toAppBytes"`
	FromAppBytes         int64 `json:"fromAppBytes"`
}

// LinkCounters are the wire leg's link counters (the stack's podstack.LinkStats).
type LinkCounters struct {
	TxPackets    uint64 `json:"txPackets"`
	TxBytes      uint64 `json:"txBytes"`
	TxGSOBatches uint64 `json:"txGSOBatches"`
	TxErrors     uint64 `json:"txErrors"`
	RxPackets    uint64 `json:"rxPackets"`
	RxBytes      uint64 `json:"rxBytes"`
	RxSynShed    uint64 `json:"rxSynShed"`
	RxSynCookied uint64 `json:"rxSynCookied"`
	// TxQueueWaits counts packets that found the wire queue full and
	// waited for room (back-pressure, not loss); TxQueueDrops those
	// dropped because the link stalled (wirequeue.StallTime).
	TxQueueWaits uint64 `json:"txQueueWaits"`
	TxQueueDrops uint64 `json:"txQueueDrops"`
	// RxFragments counts the IP fragments received, each handed to
	// netstack's reassembly in a buffer of its own size.
	RxFragments uint64 `json:"rxFragments"`
	// RxFragmentsShared counts those among them that arrived through the
	// link's socket, queued with the other traffic, rather than through
	// the fragment socket (fragPath): all of them without one, IPv6
	// fragments behind other extension headers with one.
	RxFragmentsShared uint64 `json:"rxFragmentsShared"`
	// FragmentTurns counts how often the fragment path stopped at its
	// budget with fragments still queued, to let the rest of the stack
	// run (fragPath): how often a flood kept it busy.
	FragmentTurns uint64 `json:"fragmentTurns"`
}
