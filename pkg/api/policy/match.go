package policy

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Dir is a direction of the pod's traffic.
type Dir uint8

const (
	// Ingress is traffic from the network to the pod; its peer is the
	// source.
	Ingress Dir = iota
	// Egress is traffic from the pod's applications to the network; its
	// peer is the destination.
	Egress
)

func (d Dir) String() string {
	if d == Ingress {
		return "ingress"
	}
	return "egress"
}

// IP protocol numbers a verdict is asked for. Other protocols (ICMP
// included) have no ports and are allowed only by rules without ports.
const (
	ProtoICMP   uint8 = 1
	ProtoTCP    uint8 = 6
	ProtoUDP    uint8 = 17
	ProtoICMPv6 uint8 = 58
	ProtoSCTP   uint8 = 132
)

// Matcher is a PodPolicy compiled for lookups: per direction, the addresses
// every rule without ports allows, and per protocol the addresses each
// port or port range allows, each a sorted table of address spans (CIDRs
// less their excepts, merged). A verdict costs a map lookup and a few
// binary searches however many rules there are. A Matcher never changes
// once compiled; it is safe for concurrent use.
type Matcher struct {
	gen  uint64
	dirs [2]dirMatcher
	node []netip.Addr
	// services maps a Service's VIP to the backends the egress rules
	// allow, decided at compile time.
	services map[serviceKey][]netip.AddrPort
	// sink records the denials; set by the holder that attaches m (nil:
	// not recorded).
	sink DenialSink
	// layers counts the policies per layer, for the status.
	layers *LayerCounts
}

// DenialSink records the denials a Matcher counts, with the label of the
// direction's isolating policies and the matcher's generation: the
// stack's enforcer keeps the recent ones and logs them.
type DenialSink interface {
	Denied(at time.Time, f Flow, why Reason, label string, gen uint64)
}

// Attach gives m its denial counter for each isolated direction (counter
// returns the one for a direction's label) and the sink of its denials.
// Called once, before m is shared.
//
// A ClusterNetworkPolicy's denials count under its tier and name
// ("Admin:name", "Baseline:name"), a NetworkPolicy denial under the
// isolating policies' label.
func (m *Matcher) Attach(counter func(d Dir, label string) *atomic.Uint64, sink DenialSink) {
	for d := range m.dirs {
		dm := &m.dirs[d]
		if dm.npIsolated {
			dm.denied = counter(Dir(d), dm.label)
		}
		for tier, rules := range map[Tier][]tierMatcher{TierAdmin: dm.admin, TierBaseline: dm.baseline} {
			for i := range rules {
				if rules[i].action == Deny {
					rules[i].denied = counter(Dir(d), string(tier)+":"+rules[i].label)
				}
			}
		}
	}
	m.sink = sink
}

type serviceKey struct {
	proto uint8
	vip   netip.AddrPort
}

type dirMatcher struct {
	// isolated: anything can be denied (NetworkPolicy isolates the
	// direction, or ClusterNetworkPolicy rules apply to it).
	isolated bool
	// npIsolated: NetworkPolicy isolates the direction.
	npIsolated bool
	// admin and baseline are the ClusterNetworkPolicy tiers' rules, in
	// the order they are asked.
	admin, baseline []tierMatcher
	// label is the isolating policies joined with ",": the label of the
	// direction's denial counter.
	label string
	// anyProto is what rules without ports allow.
	anyProto *addrSet
	// ports is what rules with ports allow, per protocol (portIndex).
	ports [3]portTable
	// denied counts this direction's denials; set by Attach (nil: not
	// counted).
	denied *atomic.Uint64
}

// portTable is one protocol's rules with ports.
type portTable struct {
	allPorts *addrSet            // ranges with First 0; nil: none
	exact    map[uint16]*addrSet // ranges of one port
	// ranges are the longer ranges sorted by first port; maxLast[i] is the
	// highest last port among ranges[:i+1], so that a lookup walks back
	// only over ranges that can still hold the port.
	ranges  []portSpan
	maxLast []uint16
}

type portSpan struct {
	first, last uint16
	peers       *addrSet
}

func portIndex(proto uint8) int {
	switch proto {
	case ProtoTCP:
		return 0
	case ProtoUDP:
		return 1
	case ProtoSCTP:
		return 2
	}
	return -1
}

// Compile validates p and compiles it.
func Compile(p *PodPolicy) (*Matcher, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	m := &Matcher{gen: p.Generation, node: make([]netip.Addr, 0, len(p.Node)), layers: layersOf(p)}
	for _, a := range p.Node {
		m.node = append(m.node, a.Unmap())
	}
	m.dirs[Ingress] = compileDir(&p.Ingress)
	m.dirs[Egress] = compileDir(&p.Egress)
	if m.dirs[Egress].isolated && len(p.Services) > 0 {
		m.services = make(map[serviceKey][]netip.AddrPort, len(p.Services))
		for _, s := range p.Services {
			proto := s.Protocol.Number()
			var allowed []netip.AddrPort
			for _, b := range s.Backends {
				be := netip.AddrPortFrom(b.Addr.Addr().Unmap(), b.Addr.Port())
				if ok, _ := m.Allow(Egress, be.Addr(), proto, be.Port()); ok {
					allowed = append(allowed, be)
				}
			}
			k := serviceKey{proto, netip.AddrPortFrom(s.VIP.Addr().Unmap(), s.VIP.Port())}
			m.services[k] = append(m.services[k], allowed...)
		}
	}
	return m, nil
}

type portKey struct {
	proto       uint8
	first, last uint16
}

func compileDir(d *Direction) dirMatcher {
	dm := dirMatcher{isolated: d.Isolated || d.HasTiers(), npIsolated: d.Isolated, label: strings.Join(d.Policies, ",")}
	dm.admin, dm.baseline = compileTier(d.Admin), compileTier(d.Baseline)
	if !d.Isolated {
		return dm
	}
	var anyProto addrSetBuilder
	byPorts := make(map[portKey]*addrSetBuilder)
	for i := range d.Rules {
		r := &d.Rules[i]
		if len(r.Ports) == 0 {
			anyProto.addPeers(r.Peers)
			continue
		}
		for _, pr := range r.Ports {
			k := portKey{pr.Protocol.Number(), pr.First, pr.Last}
			if k.last == 0 {
				k.last = k.first
			}
			b := byPorts[k]
			if b == nil {
				b = new(addrSetBuilder)
				byPorts[k] = b
			}
			b.addPeers(r.Peers)
		}
	}
	dm.anyProto = anyProto.build()
	for k, b := range byPorts {
		t := &dm.ports[portIndex(k.proto)]
		set := b.build()
		switch {
		case k.first == 0:
			t.allPorts = set
		case k.first == k.last:
			if t.exact == nil {
				t.exact = make(map[uint16]*addrSet)
			}
			t.exact[k.first] = set
		default:
			t.ranges = append(t.ranges, portSpan{k.first, k.last, set})
		}
	}
	for i := range dm.ports {
		t := &dm.ports[i]
		slices.SortFunc(t.ranges, func(a, b portSpan) int {
			return cmp.Or(cmp.Compare(a.first, b.first), cmp.Compare(a.last, b.last))
		})
		var hi uint16
		for _, r := range t.ranges {
			hi = max(hi, r.last)
			t.maxLast = append(t.maxLast, hi)
		}
	}
	return dm
}

// Generation is the compiled policy's PodPolicy.Generation.
func (m *Matcher) Generation() uint64 { return m.gen }

// Isolated reports whether d is isolated: whether anything is denied.
func (m *Matcher) Isolated(d Dir) bool { return m.dirs[d].isolated }

// Allow is the verdict on a new connection or flow with peer (the source
// of ingress, the destination of egress), of IP protocol proto, to port
// (of the pod for ingress, of the peer for egress; 0 for a protocol
// without ports). When denied, policy is the label of the direction's
// denial counter: its isolating policies joined with ",".
//
// The layers are asked in order: the Admin tier's rules, NetworkPolicy
// (which decides whenever it isolates d), the Baseline tier's rules, then
// the default, which allows. The node's addresses are let in before any
// layer is asked.
func (m *Matcher) Allow(d Dir, peer netip.Addr, proto uint8, port uint16) (allowed bool, policy string) {
	ok, v := m.verdict(d, peer, proto, port)
	return ok, v.label
}

// denier is the layer that denied a flow: the label its denial carries,
// why, and its counter.
type denier struct {
	label  string
	why    Reason
	denied *atomic.Uint64
}

func (m *Matcher) verdict(d Dir, peer netip.Addr, proto uint8, port uint16) (bool, denier) {
	dm := &m.dirs[d]
	if !dm.isolated {
		return true, denier{}
	}
	peer = peer.Unmap()
	if d == Ingress && slices.Contains(m.node, peer) {
		return true, denier{}
	}
	if decided, ok, by := tierVerdict(dm.admin, peer, proto, port); decided {
		if ok {
			return true, denier{}
		}
		return false, denier{by.label, AdminDeny, by.denied}
	}
	if dm.npIsolated {
		if dm.anyProto.contains(peer) {
			return true, denier{}
		}
		if i := portIndex(proto); i >= 0 && dm.ports[i].allows(peer, port) {
			return true, denier{}
		}
		return false, denier{dm.label, NoRuleAdmits, dm.denied}
	}
	if decided, ok, by := tierVerdict(dm.baseline, peer, proto, port); decided && !ok {
		return false, denier{by.label, BaselineDeny, by.denied}
	}
	return true, denier{}
}

func (t *portTable) allows(peer netip.Addr, port uint16) bool {
	if t.allPorts != nil && t.allPorts.contains(peer) {
		return true
	}
	if s := t.exact[port]; s != nil && s.contains(peer) {
		return true
	}
	// The ranges that start at or below port, walked back while one of
	// them can still reach it.
	n, _ := slices.BinarySearchFunc(t.ranges, port, func(r portSpan, p uint16) int {
		if r.first <= p {
			return -1
		}
		return 1
	})
	for i := n - 1; i >= 0 && t.maxLast[i] >= port; i-- {
		if r := &t.ranges[i]; r.last >= port && r.peers.contains(peer) {
			return true
		}
	}
	return false
}

// Check is Allow that also counts and records a denial.
func (m *Matcher) Check(d Dir, peer netip.Addr, proto uint8, port uint16) bool {
	return m.CheckFlow(Flow{Dir: d, Proto: proto, Peer: peer, Port: port})
}

// CheckFlow is Check of f, whose Local goes into the denial's record.
func (m *Matcher) CheckFlow(f Flow) bool {
	ok, v := m.verdict(f.Dir, f.Peer, f.Proto, f.Port)
	if !ok {
		m.record(f, v)
	}
	return ok
}

// Deny counts a denial of f for why and hands it to m's sink, for a
// verdict site that denies without Allow's say.
func (m *Matcher) Deny(f Flow, why Reason) {
	dm := &m.dirs[f.Dir]
	v := denier{label: dm.label, why: why, denied: dm.denied}
	if !dm.npIsolated {
		// Only ClusterNetworkPolicy rules apply to the direction: no
		// NetworkPolicy's counter to count it under.
		v.label, v.denied = "", nil
	}
	m.record(f, v)
}

func (m *Matcher) record(f Flow, v denier) {
	if v.denied != nil {
		v.denied.Add(1)
	}
	if m.sink != nil {
		m.sink.Denied(time.Now(), f, v.why, v.label, m.gen)
	}
}

// ResolveService picks the backend a new connection or flow of protocol
// proto to vip reaches, when egress is isolated and vip is a Service's
// virtual address and port: one of the backends the egress rules allow,
// the same for the same flowHash. isService reports whether vip is one;
// ok false means it is and no backend is allowed (deny). When vip is no
// Service's (or egress is not isolated), it returns vip, false, true and
// the caller takes the verdict on vip itself.
func (m *Matcher) ResolveService(vip netip.AddrPort, proto uint8, flowHash uint32) (backend netip.AddrPort, isService, ok bool) {
	if m.services == nil {
		return vip, false, true
	}
	allowed, found := m.services[serviceKey{proto, netip.AddrPortFrom(vip.Addr().Unmap(), vip.Port())}]
	if !found {
		return vip, false, true
	}
	if len(allowed) == 0 {
		return netip.AddrPort{}, true, false
	}
	return allowed[flowHash%uint32(len(allowed))], true, true
}
