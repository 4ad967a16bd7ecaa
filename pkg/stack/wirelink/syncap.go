package wirelink

import (
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// synRate and synBurst cap the SYNs (new connections) the wire leg hands
// netstack: a token bucket, refilled at synRate per second, holding at
// most synBurst. netstack queues segments without payload to a listener
// however long its queue grows, so a SYN flood faster than the listener
// path (SYN cookie included) grows the stack's memory without bound, as
// one hping3 does (docs/reliability/hostile.md, "A SYN flood at full
// speed", holds the profile and the memory). 30,000 new connections per
// second per pod is below what the listener path serves when the stack
// has a core, and far above what a pod's clients open; established
// connections, ARP and NDP are never capped. Beyond it a SYN to a
// mirrored listener is answered with a SYN cookie by the fast path
// (relay.AnswerSYN, counted in LinkStats.RxSynCookied); any other is
// dropped and counted (LinkStats.RxSynShed), and a real client's SYN
// retransmission gets in.
const (
	synRate  = 30000
	synBurst = 3000
)

// synBucket is the token bucket. Not safe for concurrent use (synGate
// guards it).
type synBucket struct {
	tokens float64
	last   time.Time
}

// take reports whether a SYN may pass now.
func (b *synBucket) take(now time.Time) bool {
	if b.last.IsZero() {
		b.tokens = synBurst
	} else {
		b.tokens = min(synBurst, b.tokens+now.Sub(b.last).Seconds()*synRate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// isSYN reports whether pkt (from the link, network header first) is a
// TCP SYN without ACK: a new connection.
func isSYN(proto tcpip.NetworkProtocolNumber, pkt *tcpipstack.PacketBuffer) bool {
	var ipLen int
	switch proto {
	case header.IPv4ProtocolNumber:
		h, ok := pkt.Data().PullUp(header.IPv4MinimumSize)
		if !ok || header.IPv4(h).TransportProtocol() != header.TCPProtocolNumber || header.IPv4(h).FragmentOffset() != 0 {
			return false
		}
		ipLen = int(header.IPv4(h).HeaderLength())
	case header.IPv6ProtocolNumber:
		h, ok := pkt.Data().PullUp(header.IPv6MinimumSize)
		if !ok || header.IPv6(h).TransportProtocol() != header.TCPProtocolNumber {
			return false
		}
		ipLen = header.IPv6MinimumSize
	default:
		return false
	}
	h, ok := pkt.Data().PullUp(ipLen + header.TCPMinimumSize)
	if !ok {
		return false
	}
	f := header.TCP(h[ipLen:]).Flags()
	return f&(header.TCPFlagSyn|header.TCPFlagAck) == header.TCPFlagSyn
}

// synPressure says whether a mirrored listener is answering SYNs with
// cookies, i.e. its handshake backlog is full: then every SYN to a
// mirrored port takes the cookie fast path (relay.AnswerSYN), which sends
// the SYN-ACK netstack would have sent without netstack's path. It reads
// netstack's cookie count at most every pressureCheck and stays on for
// pressureHold after the count last grew, and for as long after that as
// SYNs keep arriving at pressureSYNRate or faster: the fast path's own
// cookies do not count, and letting a flood back into netstack each time
// its count stalled would cost netstack's path a burst of SYNs per hold.
// Not safe for concurrent use (synGate guards it).
type synPressure struct {
	checked, grew time.Time
	last          uint64
	syns          int // SYNs seen since checked
}

const (
	pressureCheck = 100 * time.Millisecond
	pressureHold  = time.Second
	// pressureSYNRate is far above what a pod's clients open and far
	// below a flood (tens of thousands per second).
	pressureSYNRate = 5000
)

func (p *synPressure) on(now time.Time, cookiesSent func() uint64) bool {
	if cookiesSent == nil {
		return false
	}
	p.syns++
	if elapsed := now.Sub(p.checked); elapsed >= pressureCheck {
		active := !p.grew.IsZero() && now.Sub(p.grew) < pressureHold
		if n := cookiesSent(); n != p.last {
			p.last, p.grew = n, now
		} else if active && float64(p.syns) >= pressureSYNRate*elapsed.Seconds() {
			p.grew = now
		}
		p.checked, p.syns = now, 0
	}
	return !p.grew.IsZero() && now.Sub(p.grew) < pressureHold
}

// synGate decides the fate of each SYN from the wire: handed to netstack,
// answered with a cookie by the fast path, or shed. The link's receiving
// goroutine asks it for the SYNs its socket gets and synPath's for the
// rest, hence the lock (uncontended but for the moments both read SYNs).
type synGate struct {
	// cookiesSent reads netstack's count of SYN cookies its listeners
	// sent: a listener answers with one only when its handshake backlog
	// is full, a flood, most likely; nil: never under pressure.
	cookiesSent func() uint64
	mu          sync.Mutex
	bucket      synBucket
	pressure    synPressure
}

type synVerdict int

const (
	synPass    synVerdict = iota // to netstack
	synCookied                   // answered by the fast path
	synShed                      // dropped
)

// admit decides for one SYN arriving at now. answer, when not nil, tries
// to answer it with a cookie and reports whether it did: under pressure
// every SYN to a mirrored port is (netstack's listener would send the same
// cookie, for ten times the CPU); beyond the cap, every SYN that can be.
func (g *synGate) admit(now time.Time, answer func() bool) synVerdict {
	g.mu.Lock()
	under := answer != nil && g.pressure.on(now, g.cookiesSent)
	g.mu.Unlock()
	if under && answer() {
		return synCookied
	}
	g.mu.Lock()
	pass := g.bucket.take(now)
	g.mu.Unlock()
	switch {
	case pass:
		return synPass
	case answer != nil && answer():
		return synCookied
	}
	return synShed
}
