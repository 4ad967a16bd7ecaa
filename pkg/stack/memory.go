package stack

import (
	"github.com/cni-usernet/cni-usernet/pkg/stack/podstack"
	"github.com/cni-usernet/cni-usernet/pkg/stack/relay"
)

// MemoryLoad is the legitimate load a memory bound allows for; whatever the
// network sends on top of it is bounded by the configuration alone.
type MemoryLoad struct {
	// BulkTCP counts relayed TCP connections moving data as fast as they
	// can (each may fill its netstack buffers and hold the relay's copy
	// buffers; what it queues in the pod's kernel is not the stack's).
	BulkTCP int
	// AnsweredUDP counts UDP flows the pod answers (each may fill its
	// netstack receive queue and its socket's in the pod's kernel).
	AnsweredUDP int
}

// Per-item costs behind MemoryBound, from docs/reliability/hostile.md,
// rounded up from measurements.
const (
	// memBase is an idle stack (binary, runtime, netstack's buffer pools;
	// docs/performance.md, "What a pod's stack costs", holds its RSS) with
	// room for what grows with the packet rate rather than with state: the
	// buffer pools (the UDP relay's 64 KiB datagram buffers, netstack's
	// chunks) and the garbage collector's headroom (GOGC 100: up to twice
	// the live heap).
	memBase = 64 << 20
	// memPerPending is one inbound connection not yet established: a
	// forwarder goroutine, a netstack endpoint in SYN-RCVD, for a few an
	// app-leg endpoint too.
	memPerPending = 32 << 10
	// memPerUDPFlow is one UDP flow without queued data: two endpoints,
	// two goroutines, a timer.
	memPerUDPFlow = 32 << 10
	// memUDPQueues is what one flow's receive queues may hold: netstack's
	// 32 KiB default on each leg.
	memUDPQueues = 2 * 32 << 10
	// memFragments is IPv4 and IPv6 reassembly, ReassemblyBound each.
	memFragments = 2 * ReassemblyBound
)

// ReassemblyBound is what a flood of one family's fragments may add to the
// stack's RSS: netstack evicts beyond 4 MiB counted
// (fragmentation.HighFragThreshold, the kernel's ipfrag_high_thresh, not
// configurable), which with the stack's charge per fragment
// (wirelink.reassemblyCharge) is at most 6 MiB live, twice that with the
// garbage collector's headroom (docs/reliability/hostile.md, "Fragments").
const ReassemblyBound = 12 << 20

// MemoryBound is the documented bound on the stack process's RSS under
// load l plus anything the network sends (docs/reliability/hostile.md):
//
//	base + BulkTCP × 4 × TCP buffer
//	     + MaxPendingInbound × per-pending
//	     + (MaxUDPUnreplied + AnsweredUDP) × (per-flow + its queues)
//	     + reassembly
//
// The kernel drops what the stack cannot read in time at the AF_PACKET
// socket and the TUN, outside the process, and the links' FIFO queues hold
// references to data already counted in the TCP buffers.
func MemoryBound(l MemoryLoad) int64 {
	tcpBuf := int64(podstack.DefaultTCPBufferBytes)
	udpFlows := int64(relay.DefaultMaxUDPUnreplied + l.AnsweredUDP)
	return memBase +
		int64(l.BulkTCP)*4*tcpBuf +
		relay.DefaultMaxPendingInbound*memPerPending +
		udpFlows*(memPerUDPFlow+memUDPQueues) +
		memFragments
}
