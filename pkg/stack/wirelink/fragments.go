package wirelink

import (
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// IP fragments are held by netstack's reassembly until their datagram
// completes, the reassembly times out or the memory limit evicts it. That
// limit (fragmentation.HighFragThreshold, 4 MiB like the kernel's
// ipfrag_high_thresh, then eviction down to 3 MiB) counts what a fragment
// carries, its frame's length plus a PacketBuffer, but a fragment keeps
// the whole buffer the link read it into alive: the link reader's 2 KiB
// view for an MTU frame, fdbased's views for its. A flood of the smallest
// first fragments (hping3 --udp -x -d 0 --rand-source) was counted at a
// fraction of what each held, and the stack's RSS grew far beyond the
// limit (test/hostile TestFragmentFlood; docs/reliability/hostile.md,
// "Fragments at full speed", holds the runs). So each fragment is copied
// into a buffer of its own size before netstack sees it; what reassembly
// holds is then within about twice what it counts (the reassembler and
// its map entry are not counted), which stack.ReassemblyBound allows for.

// reassemblyCharge is added to what netstack's reassembly counts for each
// fragment, as headroom reserved in front of the copy (counted by
// PacketBuffer.MemSize, the only measure the limit reads): what a held
// fragment costs beyond its bytes and one PacketBuffer (a second
// PacketBuffer for a first fragment, the reassembler, its holes and map
// entry, 700-800 bytes) is not counted, so the smallest fragments held
// several times what netstack counted. Charging 1 KiB more each, about
// what the kernel's truesize charges such a fragment beyond its bytes,
// netstack holds a third as many, within stack.ReassemblyBound for the
// smallest fragments and MTU-sized ones alike
// (TestFragmentFloodHeldAsCounted; docs/reliability/hostile.md,
// "Fragments at full speed"). A power of two: the reservation takes a
// buffer chunk of exactly its size.
const reassemblyCharge = 1024

// Reassembly timeouts of netstack's IPv4 and IPv6 (ipv4.ReassembleTimeout,
// ipv6.ReassembleTimeout): a fragment is held at most this long.
const (
	reassemblyTimeout4 = 30 * time.Second
	reassemblyTimeout6 = 60 * time.Second
)

// fragmentLedger counts the fragments the link delivered and remembers
// when the last of each family arrived, so that the stack knows until
// when reassembly may still hold memory.
type fragmentLedger struct {
	count atomic.Uint64
	// shared counts the fragments that came through the link's socket,
	// turns the fragment path's yields (LinkSnapshot).
	shared, turns atomic.Uint64
	last4, last6  atomic.Int64 // UnixNano of the last fragment; 0: none
}

// heldUntil is when the last reassembly that a fragment received so far
// may have opened times out; the zero time if none arrived.
func (l *fragmentLedger) heldUntil() time.Time {
	var until time.Time
	if n := l.last4.Load(); n != 0 {
		until = time.Unix(0, n).Add(reassemblyTimeout4)
	}
	if n := l.last6.Load(); n != 0 {
		if t := time.Unix(0, n).Add(reassemblyTimeout6); t.After(until) {
			until = t
		}
	}
	return until
}

// compactFragment returns a copy of pkt in a buffer of its own size if pkt
// is an IP fragment (the caller then delivers and releases the copy), or
// nil if it is not.
func (l *fragmentLedger) compactFragment(proto tcpip.NetworkProtocolNumber, pkt *tcpipstack.PacketBuffer) *tcpipstack.PacketBuffer {
	if !l.note(proto, pkt) {
		return nil
	}
	// ToView copies into a view whose chunk is the smallest that fits
	// (64 bytes and up, powers of two).
	link := len(pkt.LinkHeader().Slice())
	c := tcpipstack.NewPacketBuffer(tcpipstack.PacketBufferOptions{ReserveHeaderBytes: reassemblyCharge, Payload: buffer.MakeWithView(pkt.ToView())})
	c.LinkHeader().Consume(link)
	c.NetworkProtocolNumber = pkt.NetworkProtocolNumber
	c.PktType = pkt.PktType
	c.RXChecksumValidated = pkt.RXChecksumValidated
	return c
}

// note counts pkt and remembers when it came if it is an IP fragment, and
// reports whether it is.
func (l *fragmentLedger) note(proto tcpip.NetworkProtocolNumber, pkt *tcpipstack.PacketBuffer) bool {
	switch proto {
	case header.IPv4ProtocolNumber:
		h, ok := pkt.Data().PullUp(header.IPv4MinimumSize)
		if !ok || !isIPv4Fragment(h) {
			return false
		}
		l.last4.Store(time.Now().UnixNano())
	case header.IPv6ProtocolNumber:
		h, ok := pkt.Data().PullUp(header.IPv6MinimumSize)
		if !ok {
			return false
		}
		// Only a packet with extension headers needs the longer look;
		// every other IPv6 packet of a flow stops at its fixed header.
		if header.IPv6(h).NextHeader() != uint8(header.IPv6FragmentExtHdrIdentifier) && !isIPv6ExtensionHeader(header.IPv6(h).NextHeader()) {
			return false
		}
		if h, ok = pkt.Data().PullUp(min(pkt.Data().Size(), ipv6FragmentSearch)); !ok || !isIPv6Fragment(h) {
			return false
		}
		l.last6.Store(time.Now().UnixNano())
	default:
		return false
	}
	l.count.Add(1)
	return true
}

// isIPv4Fragment: more fragments follow, or this is not the first.
func isIPv4Fragment(h []byte) bool {
	ip := header.IPv4(h)
	return ip.More() || ip.FragmentOffset() != 0
}

// ipv6FragmentSearch is how far into an IPv6 packet isIPv6Fragment looks
// for a fragment header: behind the fixed header and the extension
// headers that may precede it (RFC 8200, 4.1), as far as they fit.
const ipv6FragmentSearch = 256

// isIPv6Fragment reports whether the packet h begins carries a fragment
// header, behind hop-by-hop, routing or destination options headers.
func isIPv6Fragment(h []byte) bool {
	if len(h) < header.IPv6MinimumSize {
		return false
	}
	next, off := header.IPv6(h).NextHeader(), header.IPv6MinimumSize
	for {
		switch {
		case next == uint8(header.IPv6FragmentExtHdrIdentifier):
			return true
		case isIPv6ExtensionHeader(next):
			if off+2 > len(h) {
				// Too deep to look: netstack parses it as it would
				// without this copy.
				return false
			}
			next, off = h[off], off+(int(h[off+1])+1)*8
		default:
			return false
		}
	}
}

// isIPv6ExtensionHeader: next is a header isIPv6Fragment looks behind.
func isIPv6ExtensionHeader(next uint8) bool {
	switch header.IPv6ExtensionHeaderIdentifier(next) {
	case header.IPv6HopByHopOptionsExtHdrIdentifier, header.IPv6RoutingExtHdrIdentifier, header.IPv6DestinationOptionsExtHdrIdentifier:
		return true
	}
	return false
}
