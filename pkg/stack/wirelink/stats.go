package wirelink

import (
	"sync/atomic"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirelink/wirequeue"
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
	// RxOwnSource counts packets dropped before netstack because their
	// source is one of the pod's own addresses (fromOwnAddr).
	RxOwnSource atomic.Uint64
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
		RxSynShed: s.RxSynShed.Load(), RxSynCookied: s.RxSynCookied.Load(), RxOwnSource: s.RxOwnSource.Load(),
		TxQueueWaits: s.Queue.Waits.Load(), TxQueueDrops: s.Queue.Drops.Load(),
		RxFragments: s.fragments.count.Load(), RxFragmentsShared: s.fragments.shared.Load(),
		FragmentTurns: s.fragments.turns.Load(),
	}
}

// ReassemblyHeldUntil is when the reassemblies the fragments received so
// far may have opened have all timed out: until then netstack may hold
// their memory. The zero time if no fragment arrived.
func (s *LinkStats) ReassemblyHeldUntil() time.Time { return s.fragments.heldUntil() }
