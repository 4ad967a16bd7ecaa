// Package attack holds what a hostile pod tries against the network it is
// given, and the victim-side observers that tell whether it worked.
//
// The attacks run in the calling thread's network namespace (the pod's),
// as whatever user and capabilities the process has: a root container with
// the runtime's default CAP_NET_RAW, or with CAP_NET_ADMIN added. Each
// attempt is reported as an Outcome: what was tried, through which link or
// socket, whether it could be sent, and what the attacker itself saw come
// of it. Every packet carries a marker in its payload, so that whoever
// watches the victim (a Recorder in its namespace, a Watch on its link
// seen from the node) can tell whether that very packet arrived. The
// design's rule is that every attack here fails: nothing arrives, nothing
// is learnt, nothing is seen, nothing is possible (docs/architecture.md,
// DESIGN.md "The threat model and where the wire lives").
package attack

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// The attacks Run knows, in the order it runs them when Spec.Attacks is
// empty.
const (
	// Self reports the attacker's own confinement: user, capabilities,
	// namespaces, and which of Spec.Hidden it can see.
	Self = "self"
	// Links lists the links the pod sees: anything but loopback and a TUN
	// is a link to the wire, which a packet socket can read and write.
	Links = "links"
	// Egress sends UDP datagrams and TCP SYNs from the pod's own
	// addresses to Victim, which the pod's egress policy denies: through
	// a packet socket on every link and through a raw IP socket.
	Egress = "egress"
	// Spoof sends to Guarded, an ingress-isolated pod, from the addresses
	// of Peer, the one it admits: through a packet socket on every link, a
	// raw IP socket (IP_HDRINCL, IPV6_HDRINCL) and a transparent socket
	// bound to Peer's address.
	Spoof = "spoof"
	// Node sends to the node's own address on ports the pod's egress
	// policy denies, through a packet socket on every link and a raw IP
	// socket.
	Node = "node"
	// Neigh claims Victim's addresses with ARP and NDP (replies,
	// gratuitous announcements, and requests to the node that carry the
	// claimed address as their source), one message per outcome.
	Neigh = "neigh"
	// NewLink (CAP_NET_ADMIN) creates a veth pair, and a macvlan and an
	// ipvlan on every link the pod sees, and sends a datagram to Victim
	// through each.
	NewLink = "newlink"
	// Move (CAP_NET_ADMIN) creates a link (dummy or ifb) and tries to move
	// it into every other network namespace the pod can name: by the pid
	// of every process it sees, by the namespace files it can open. Run it
	// confined only: on a host, those are the host's namespaces.
	Move = "move"
	// Foreign (CAP_NET_ADMIN) uses the ids the pod's namespace holds for
	// other namespaces (a veth peer's) to list, and with
	// Spec.ForeignWrites create, links there.
	Foreign = "foreign"
	// TUN (CAP_NET_ADMIN) tries to attach a queue to every TUN the pod
	// sees, which would take packets meant for the stack.
	TUN = "tun"
	// Sniff reads every link with packet sockets for Spec.SniffFor and
	// reports the markers it saw; the caller has traffic that the pod's
	// ingress policy denies sent to it meanwhile. Its first outcome (Case
	// "listening") says the sockets are open.
	Sniff = "sniff"
)

// All is every attack, in the order Run takes them.
var All = []string{Self, Links, Egress, Spoof, Node, Neigh, NewLink, Move, Foreign, TUN, Sniff}

// Pair is a pod's (or the node's) IPv4 and IPv6 address; either may be
// invalid (a single-stack cluster).
type Pair struct {
	V4 netip.Addr `json:"v4,omitzero"`
	V6 netip.Addr `json:"v6,omitzero"`
}

func (p Pair) of(family int) netip.Addr {
	if family == 6 {
		return p.V6
	}
	return p.V4
}

// Spec is what an attacker knows of its surroundings and what it should
// try. The zero value of a port or address skips the cases that need it.
type Spec struct {
	// Attacks are the attacks to run, from All, in order. Empty: all but
	// Sniff.
	Attacks []string `json:"attacks,omitempty"`
	// Marker begins every payload, unique to a run; each case appends its
	// own name (Outcome.Marker). Only MarkerChars.
	Marker string `json:"marker"`
	// Self is the pod's own addresses.
	Self Pair `json:"self"`
	// NodeAddr is the node's address the attacks to the node go to; ARP
	// and NDP resolve the node's link-layer address through it.
	NodeAddr Pair `json:"node"`
	// NodeUDP and NodeTCP are ports the node serves and the pod's egress
	// policy denies.
	NodeUDP uint16 `json:"nodeUDP,omitempty"`
	NodeTCP uint16 `json:"nodeTCP,omitempty"`
	// Victim is a pod the pod's egress policy denies; VictimUDP and
	// VictimTCP are ports it serves (and whose ingress admits the pod, so
	// that only the attacker's own egress policy stands in the way).
	Victim    Pair   `json:"victim"`
	VictimUDP uint16 `json:"victimUDP,omitempty"`
	VictimTCP uint16 `json:"victimTCP,omitempty"`
	// Guarded is an ingress-isolated pod that admits Peer and not the
	// attacker on GuardedUDP and GuardedTCP (best where the attacker's
	// egress policy lets it reach them: a spoofed source is then the one
	// way in).
	Guarded    Pair   `json:"guarded"`
	GuardedUDP uint16 `json:"guardedUDP,omitempty"`
	GuardedTCP uint16 `json:"guardedTCP,omitempty"`
	Peer       Pair   `json:"peer"`
	// NeighCase, when set, limits Neigh to the one message of that name
	// (Outcome.Case without the link), so that a caller can tell which
	// message taught the node what.
	NeighCase string `json:"neighCase,omitempty"`
	// NeighMAC, when set, is the link-layer address Neigh claims (else
	// the link's own), so that a caller that cannot clear the node's
	// table between claims tells them apart.
	NeighMAC string `json:"neighMAC,omitempty"`
	// SniffFor is how long Sniff reads. Zero: 3 s.
	SniffFor Duration `json:"sniffFor,omitzero"`
	// Wait is how long the sending attacks read their links for answers
	// after sending. Zero: 1 s.
	Wait Duration `json:"wait,omitzero"`
	// ForeignWrites lets Foreign create (and remove again) a dummy link in
	// another namespace it can name. Only for a caller that owns every
	// namespace the pod could reach (a test's own node namespace), never
	// on a real node.
	ForeignWrites bool `json:"foreignWrites,omitempty"`
	// LinkPrefix begins the names of the links the attacks create. Empty:
	// "atk".
	LinkPrefix string `json:"linkPrefix,omitempty"`
	// Hidden are paths the attacker must not see (Self reports the ones
	// it can).
	Hidden []string `json:"hidden,omitempty"`
}

// Duration is a time.Duration that reads and writes as "1.5s" in JSON.
type Duration time.Duration

func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

func (d Duration) or(def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return time.Duration(d)
}

// Outcome is one attempt.
type Outcome struct {
	// Attack is its name (All); Case says what it tried, e.g.
	// "eth0/udp4" or "rawsock/syn6".
	Attack string `json:"attack"`
	Case   string `json:"case"`
	// Link is the link it went through, if any.
	Link string `json:"link,omitempty"`
	// Src and Dst are the packet's addresses, if it is one.
	Src netip.AddrPort `json:"src,omitzero"`
	Dst netip.AddrPort `json:"dst,omitzero"`
	// Marker is the payload it carried, for the victim-side check.
	Marker string `json:"marker,omitempty"`
	// Claimed and MAC are a neighbour message's claim: Claimed is at MAC.
	Claimed netip.Addr `json:"claimed,omitzero"`
	MAC     string     `json:"mac,omitempty"`
	// Sent: the packet left the socket, or the action was carried out.
	Sent bool `json:"sent"`
	// Err is why not.
	Err string `json:"err,omitempty"`
	// Reached is what the attacker itself holds as proof that the attack
	// worked: an answer read back, a link to the wire it sees, a link it
	// moved out, a namespace it reached. Empty for an attack that failed
	// (as far as the attacker can tell: the victim's side has the rest).
	Reached []string `json:"reached,omitempty"`
	// Seen are the markers Sniff read, each as "marker@link".
	Seen []string `json:"seen,omitempty"`
	// Detail is anything else worth a log line.
	Detail string `json:"detail,omitempty"`
	// Self is the Self attack's report.
	Self *Confinement `json:"self,omitempty"`
}

func (o Outcome) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", o.Attack, o.Case)
	if o.Src.IsValid() || o.Dst.IsValid() {
		fmt.Fprintf(&b, " %s -> %s", o.Src, o.Dst)
	}
	if o.Claimed.IsValid() {
		fmt.Fprintf(&b, " claiming %s at %s", o.Claimed, o.MAC)
	}
	if o.Sent {
		b.WriteString(": sent")
	} else {
		b.WriteString(": not sent")
	}
	if o.Err != "" {
		fmt.Fprintf(&b, " (%s)", o.Err)
	}
	if len(o.Reached) > 0 {
		fmt.Fprintf(&b, "; reached: %s", strings.Join(o.Reached, "; "))
	}
	if len(o.Seen) > 0 {
		fmt.Fprintf(&b, "; seen: %s", strings.Join(o.Seen, ", "))
	}
	if o.Detail != "" {
		fmt.Fprintf(&b, "; %s", o.Detail)
	}
	return b.String()
}

// Run runs the spec's attacks in order and hands each outcome to emit: the
// sending attacks' (Egress, Spoof, Node, NewLink) once their answers had
// Spec.Wait to come, one wait for all of them; Sniff's "listening" before
// it reads. It fails only on a spec it cannot run; an attack that fails is
// an outcome.
func Run(s Spec, emit func(Outcome)) error {
	if err := s.validate(); err != nil {
		return err
	}
	names := s.Attacks
	if len(names) == 0 {
		names = slices.DeleteFunc(slices.Clone(All), func(n string) bool { return n == Sniff })
	}
	r := &runner{s: s, emit: emit}
	for _, n := range names {
		switch n {
		case Self:
			r.self()
		case Links:
			r.links()
		case Egress:
			r.egress()
		case Spoof:
			r.spoof()
		case Node:
			r.node()
		case Neigh:
			r.neigh()
		case NewLink:
			r.newLink()
		case Move:
			r.move()
		case Foreign:
			r.foreign()
		case TUN:
			r.tun()
		case Sniff:
			// Not while the attacks' own packets and answers are about.
			r.flush()
			r.sniff()
		}
	}
	r.flush()
	return nil
}

func (s Spec) validate() error {
	for _, n := range s.Attacks {
		if !slices.Contains(All, n) {
			return fmt.Errorf("unknown attack %q (known: %s)", n, strings.Join(All, ", "))
		}
	}
	if s.Marker == "" {
		return fmt.Errorf("no marker")
	}
	for _, c := range []byte(s.Marker) {
		if !isMarkerChar(c) {
			return fmt.Errorf("marker %q: only [A-Za-z0-9._-] and /", s.Marker)
		}
	}
	if s.NeighMAC != "" {
		if mac, err := net.ParseMAC(s.NeighMAC); err != nil || len(mac) != 6 {
			return fmt.Errorf("neighMAC %q: not an Ethernet address", s.NeighMAC)
		}
	}
	return nil
}

// runner carries a run's spec and emit.
type runner struct {
	s    Spec
	emit func(Outcome)
	// ports are the source ports the run's cases took (fresh).
	ports map[uint16]bool
	// batches are the sending attacks waiting for answers (flush).
	batches []*batch
}

func (r *runner) prefix() string {
	if r.s.LinkPrefix != "" {
		return r.s.LinkPrefix
	}
	return "atk"
}

// marker is the payload of one case.
func (r *runner) marker(attack, c string) string {
	return r.s.Marker + "/" + attack + "/" + c
}

// MarkerChars are the bytes a marker is made of; Markers reads one up to
// the first byte outside them.
const MarkerChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-/"

func isMarkerChar(c byte) bool { return strings.IndexByte(MarkerChars, c) >= 0 }

// Markers returns the markers beginning with base that b holds, each once.
func Markers(b []byte, base string) []string {
	var out []string
	for {
		i := bytes.Index(b, []byte(base))
		if i < 0 {
			return out
		}
		j := i + len(base)
		for j < len(b) && isMarkerChar(b[j]) {
			j++
		}
		if m := string(b[i:j]); !slices.Contains(out, m) {
			out = append(out, m)
		}
		b = b[j:]
	}
}

// Encode writes o as one line of JSON, the form podtool and the tests'
// helper print outcomes in.
func Encode(o Outcome) []byte {
	b, err := json.Marshal(o)
	if err != nil {
		b, _ = json.Marshal(Outcome{Attack: o.Attack, Case: o.Case, Err: "encoding the outcome: " + err.Error()})
	}
	return append(b, '\n')
}

// Decode reads the outcomes Encode wrote, one a line; other lines (a
// runtime's warnings) are returned apart.
func Decode(out []byte) (outcomes []Outcome, other []string) {
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		var o Outcome
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &o) != nil || o.Attack == "" {
			other = append(other, line)
			continue
		}
		outcomes = append(outcomes, o)
	}
	return outcomes, other
}
