package policy

import (
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// Flow is a new connection or flow a verdict is taken on.
type Flow struct {
	Dir Dir
	// Proto is the IP protocol number (ProtoTCP, ...).
	Proto uint8
	// Peer is the other end: the source of ingress, the destination of
	// egress.
	Peer netip.Addr
	// Port is the pod's port for ingress, the peer's for egress; 0 for a
	// protocol without ports.
	Port uint16
	// Local is the pod's address; zero when the verdict site does not
	// know it.
	Local netip.Addr
}

// Reason says why a flow was denied. A denial is never one rule's doing:
// rules only allow, so what decides is that none of the isolating
// policies' rules admits the flow (NoRuleAdmits), or that it cannot be
// judged at all.
type Reason uint8

const (
	// NoRuleAdmits: the direction is isolated and no rule of the
	// policies that isolate it allows the peer, protocol and port.
	NoRuleAdmits Reason = iota
	// NoAllowedBackend: the destination is a Service whose backends the
	// egress rules all deny.
	NoAllowedBackend
	// TinyFragment: a first fragment too short to carry the ports
	// (RFC 1858), which the verdict needs.
	TinyFragment
	// TooManyHeaders: an IPv6 packet with more extension headers than the
	// verdict walks to find its transport header.
	TooManyHeaders
)

func (r Reason) String() string {
	switch r {
	case NoRuleAdmits:
		return "no rule admits"
	case NoAllowedBackend:
		return "no allowed backend"
	case TinyFragment:
		return "first fragment without ports"
	case TooManyHeaders:
		return "too many extension headers"
	}
	return "reason " + strconv.Itoa(int(r))
}

// ProtoName names IP protocol p as Kubernetes and the status do: TCP,
// UDP, SCTP, ICMP, ICMPv6, else its number.
func ProtoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return string(TCP)
	case ProtoUDP:
		return string(UDP)
	case ProtoSCTP:
		return string(SCTP)
	case ProtoICMP:
		return "ICMP"
	case ProtoICMPv6:
		return "ICMPv6"
	}
	return strconv.Itoa(int(p))
}

// Denial is one denied connection or flow, as the status reports it.
type Denial struct {
	Time      time.Time `json:"time"`
	Direction string    `json:"direction"`
	Protocol  string    `json:"protocol"`
	// Peer is the source of an ingress denial, the destination of an
	// egress one; Port the pod's port for ingress, the peer's for egress
	// (none for ICMP); Local the pod's address.
	Peer  netip.Addr `json:"peer,omitzero"`
	Port  uint16     `json:"port,omitempty"`
	Local netip.Addr `json:"local,omitzero"`
	// Policies are the policies that isolate the pod in Direction
	// ("namespace/name", joined with ","): none of their rules admitted
	// the flow. "(pending)" before the agent's first push.
	Policies string `json:"policies"`
	// Reason is Reason's text: "no rule admits" for a flow the rules
	// simply do not allow.
	Reason string `json:"reason"`
	// Generation is the policy's in force.
	Generation uint64 `json:"generation"`
}

// RecentDenials is how many denials a stack keeps for its status: the
// last ones, to see why a connection failed just now. The per-direction
// counters count all of them.
const RecentDenials = 64

// Denial log lines: at most denialLogLines per denialLogWindow; the
// denials beyond get none, and the next line that is written says how
// many did not (a flood from a denied peer must not fill the stack's log).
const (
	denialLogLines  = 10
	denialLogWindow = time.Second
)

// denial is a record of the ring: plain values, so that recording one
// allocates nothing (the label is the matcher's string).
type denial struct {
	at    time.Time
	flow  Flow
	why   Reason
	label string
	gen   uint64
}

// denialLog keeps the recent denials of an Enforcer and logs them through
// a rate limit. Safe for concurrent use: denials are rare next to
// packets, even a flood's next to the work each of its packets costs, so
// a mutex serves.
type denialLog struct {
	mu sync.Mutex // guards everything below
	// ring holds the last RecentDenials; allocated at the first denial,
	// so that a stack that denies nothing pays nothing for it.
	ring   *[RecentDenials]denial
	next   int // where the next record goes
	held   int // records in ring
	limit  logLimit
	logger *slog.Logger // nil: no log lines
}

// add records a denial at now and writes its log line if the rate limit
// lets it.
func (l *denialLog) add(now time.Time, f Flow, why Reason, label string, gen uint64) {
	l.mu.Lock()
	if l.ring == nil {
		l.ring = new([RecentDenials]denial)
	}
	l.ring[l.next] = denial{at: now, flow: f, why: why, label: label, gen: gen}
	l.next = (l.next + 1) % RecentDenials
	l.held = min(l.held+1, RecentDenials)
	logger := l.logger
	var (
		write      bool
		suppressed uint64
	)
	if logger != nil {
		write, suppressed = l.limit.take(now)
	}
	l.mu.Unlock()
	if !write {
		return
	}
	attrs := []any{"direction", f.Dir.String(), "protocol", ProtoName(f.Proto), "peer", f.Peer,
		"port", f.Port, "local", f.Local, "policies", label, "reason", why.String(), "generation", gen}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	logger.Info("network policy denied", attrs...)
}

// recent returns the records held, oldest first.
func (l *denialLog) recent() (out []Denial, suppressed uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == 0 {
		return nil, l.limit.total
	}
	out = make([]Denial, 0, l.held)
	for i := range l.held {
		d := &l.ring[(l.next-l.held+i+RecentDenials)%RecentDenials]
		out = append(out, Denial{
			Time: d.at, Direction: d.flow.Dir.String(), Protocol: ProtoName(d.flow.Proto),
			Peer: d.flow.Peer, Port: d.flow.Port, Local: d.flow.Local,
			Policies: d.label, Reason: d.why.String(), Generation: d.gen,
		})
	}
	return out, l.limit.total
}

// logLimit lets denialLogLines lines through per denialLogWindow. Not
// safe for concurrent use (denialLog guards it).
type logLimit struct {
	window time.Time // when the current window began
	lines  int       // lines written in it
	// pending counts the denials without a line since the last line;
	// total all of them.
	pending, total uint64
}

// take reports whether a denial at now gets a log line, and if so how
// many went without one since the last line.
func (l *logLimit) take(now time.Time) (write bool, suppressed uint64) {
	if now.Sub(l.window) >= denialLogWindow || now.Before(l.window) {
		l.window, l.lines = now, 0
	}
	if l.lines >= denialLogLines {
		l.pending++
		l.total++
		return false, 0
	}
	l.lines++
	suppressed, l.pending = l.pending, 0
	return true, suppressed
}
