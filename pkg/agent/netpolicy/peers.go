package netpolicy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// peerSet is a rule's from or to, resolved. Rules that name the same
// peers share one (read-only).
type peerSet struct {
	// all: the rule names no peer, every address is one.
	all bool
	// key identifies the peers, for sharing what is resolved from them.
	key string
	// prefixes are the ipBlocks and the selected pods' addresses, sorted;
	// nil when all.
	prefixes []policy.Peer
	// pods and blocks are what prefixes came from, for resolving egress
	// named ports on the destination pods.
	pods   []*peerPod
	blocks []policy.Peer
	// ns and sels are the policy's namespace and the selector peers,
	// for telling which pods' changes can change pods (Deps).
	ns   string
	sels []peerSelectors
}

// allPeers is a rule without peers. Its key is the only empty one: the
// others start with the policy's namespace's.
var allPeers = &peerSet{all: true}

// peerSelectors is a selector peer, checked.
type peerSelectors struct {
	pod selector
	ns  *selector // nil: the policy's namespace
	// key is the selectors' canonical form.
	key string
}

func (c *Compiler) resolvePeers(ns string, peers []NetworkPolicyPeer, where string, warn func(string, ...any)) *peerSet {
	if len(peers) == 0 {
		return allPeers
	}
	// Check every peer first (each warns on its own), then resolve what
	// is left, once for all the rules that name the same.
	var blocks []policy.Peer
	var sels []peerSelectors
	var key strings.Builder
	key.WriteString("n" + ns)
	for i, p := range peers {
		switch {
		case p.IPBlock != nil:
			if p.PodSelector != nil || p.NamespaceSelector != nil {
				warn("%s peer %d: ipBlock together with a selector, skipped", where, i)
				continue
			}
			blk, err := parseBlock(p.IPBlock)
			if err != nil {
				warn("%s peer %d: %v, skipped", where, i, err)
				continue
			}
			blocks = append(blocks, blk)
			fmt.Fprintf(&key, "\x00b%s%v", blk.CIDR, blk.Except)
		case p.PodSelector == nil && p.NamespaceSelector == nil:
			warn("%s peer %d: neither a selector nor an ipBlock, skipped", where, i)
		default:
			var ps peerSelectors
			if p.PodSelector != nil {
				var err error
				if ps.pod, err = newSelector(p.PodSelector); err != nil {
					warn("%s peer %d: podSelector selects no pod: %v", where, i, err)
				}
			}
			if p.NamespaceSelector != nil {
				nsel, err := newSelector(p.NamespaceSelector)
				if err != nil {
					warn("%s peer %d: namespaceSelector selects no namespace: %v", where, i, err)
				}
				ps.ns = &nsel
			}
			if ps.pod.nothing || ps.ns != nil && ps.ns.nothing {
				continue
			}
			ps.key = "\x00p" + ps.pod.canonical()
			if ps.ns != nil {
				ps.key += "\x00n" + ps.ns.canonical()
			}
			sels = append(sels, ps)
			key.WriteString(ps.key)
		}
	}
	k := key.String()
	c.mu.Lock()
	s, ok := c.peerSets[k]
	c.mu.Unlock()
	if ok {
		return s
	}

	s = &peerSet{key: k, blocks: blocks, ns: ns, sels: sels}
	for _, ps := range sels {
		s.pods = append(s.pods, c.selectPods(ns, ps)...)
	}
	if len(sels) > 1 {
		slices.SortFunc(s.pods, func(a, b *peerPod) int { return strings.Compare(a.key, b.key) })
		s.pods = slices.Compact(s.pods)
	}
	n := len(blocks)
	for _, p := range s.pods {
		n += len(p.addrs)
	}
	prefixes := append(make([]policy.Peer, 0, n), blocks...)
	for _, p := range s.pods {
		for _, a := range p.addrs {
			prefixes = append(prefixes, hostPeer(a))
		}
	}
	s.prefixes = policy.Aggregate(prefixes)
	c.mu.Lock()
	c.peerSets[k] = s
	c.mu.Unlock()
	return s
}

// selectPods is the pods a peer's selectors select, sorted: podSelector
// alone, in the policy's namespace; namespaceSelector alone, every pod of
// the namespaces it selects; both, the pods of those namespaces that
// podSelector selects.
func (c *Compiler) selectPods(ns string, ps peerSelectors) []*peerPod {
	key := ps.key
	if ps.ns == nil {
		key = ns + key
	}
	c.mu.Lock()
	pods, ok := c.podSets[key]
	c.mu.Unlock()
	if ok {
		return pods
	}
	pick := func(candidates []*peerPod) {
		for _, p := range candidates {
			if ps.pod.matches(p.labels) {
				pods = append(pods, p)
			}
		}
	}
	if ps.ns == nil {
		pick(c.byNs[ns])
	} else {
		for _, name := range c.nsNames {
			if ps.ns.matches(c.nsLabels[name]) {
				pick(c.byNs[name])
			}
		}
		slices.SortFunc(pods, func(a, b *peerPod) int { return strings.Compare(a.key, b.key) })
	}
	c.mu.Lock()
	c.podSets[key] = pods
	c.mu.Unlock()
	return pods
}

// namedEgress resolves an egress rule's named ports on each destination pod
// (Kubernetes: a named port is the destination pod's): one rule per port
// number, whose peers are the pods that name that port so. The destinations
// are the pods the rule's selectors select, the pods whose addresses its
// ipBlocks hold (those addresses only), or every pod when the rule names no
// peer; an address that is no pod's has no named port, and matches none.
func (c *Compiler) namedEgress(name string, peers *peerSet, named []namedPort) []policy.Rule {
	key := fmt.Sprintf("%s\x00%v", peers.key, named)
	c.mu.Lock()
	groups, ok := c.namedGroups[key]
	c.mu.Unlock()
	if !ok {
		groups = c.resolveNamed(peers, named)
		c.mu.Lock()
		c.namedGroups[key] = groups
		c.mu.Unlock()
	}
	rules := make([]policy.Rule, len(groups))
	for i, g := range groups {
		rules[i] = policy.Rule{Policy: name, Peers: g.peers, Ports: g.ports}
	}
	return rules
}

// portGroup is the destinations that resolve a rule's named ports to the
// same port.
type portGroup struct {
	peers []policy.Peer
	ports []policy.PortRange // one
}

func (c *Compiler) resolveNamed(peers *peerSet, named []namedPort) []portGroup {
	byPort := make(map[policy.PortRange][]netip.Addr)
	add := func(p *peerPod, addrs []netip.Addr) {
		for _, n := range named {
			if pr, ok := containerPort(p.containers, n); ok {
				byPort[pr] = append(byPort[pr], addrs...)
			}
		}
	}
	if peers.all {
		c.eachPod(func(p *peerPod) { add(p, p.addrs) })
	} else {
		for _, p := range peers.pods {
			add(p, p.addrs)
		}
		if len(peers.blocks) > 0 {
			c.eachPod(func(p *peerPod) {
				var in []netip.Addr
				for _, a := range p.addrs {
					if slices.ContainsFunc(peers.blocks, func(b policy.Peer) bool { return peerContains(b, a) }) {
						in = append(in, a)
					}
				}
				if len(in) > 0 {
					add(p, in)
				}
			})
		}
	}
	ports := make([]policy.PortRange, 0, len(byPort))
	for pr := range byPort {
		ports = append(ports, pr)
	}
	slices.SortFunc(ports, comparePorts)
	groups := make([]portGroup, 0, len(ports))
	for _, pr := range ports {
		ps := make([]policy.Peer, 0, len(byPort[pr]))
		for _, a := range byPort[pr] {
			ps = append(ps, hostPeer(a))
		}
		groups = append(groups, portGroup{peers: policy.Aggregate(ps), ports: []policy.PortRange{pr}})
	}
	return groups
}

// parseBlock reads an ipBlock. A malformed except makes the whole block
// unusable (skipping the except alone would open what it closes); an
// except of the other address family excludes nothing and is dropped.
func parseBlock(b *IPBlock) (policy.Peer, error) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return policy.Peer{}, fmt.Errorf("ipBlock cidr %q: %w", b.CIDR, err)
	}
	peer := policy.Peer{CIDR: cidr.Masked()}
	for _, e := range b.Except {
		ep, err := netip.ParsePrefix(e)
		if err != nil {
			return policy.Peer{}, fmt.Errorf("ipBlock %s except %q: %w", b.CIDR, e, err)
		}
		if ep.Addr().Is4() == cidr.Addr().Is4() {
			peer.Except = append(peer.Except, ep.Masked())
		}
	}
	slices.SortFunc(peer.Except, comparePrefixes)
	peer.Except = slices.Compact(peer.Except)
	return peer, nil
}

func peerContains(p policy.Peer, a netip.Addr) bool {
	if !p.CIDR.Contains(a) {
		return false
	}
	return !slices.ContainsFunc(p.Except, func(e netip.Prefix) bool { return e.Contains(a) })
}

func hostPeer(a netip.Addr) policy.Peer {
	return policy.Peer{CIDR: netip.PrefixFrom(a, a.BitLen())}
}

func comparePrefixes(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

func comparePorts(a, b policy.PortRange) int {
	return cmp.Or(strings.Compare(string(a.Protocol), string(b.Protocol)), cmp.Compare(a.First, b.First), cmp.Compare(a.Last, b.Last))
}

func sortPorts(ps []policy.PortRange) []policy.PortRange {
	slices.SortFunc(ps, comparePorts)
	return slices.Compact(ps)
}
