package netpolicy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// Warning is a part of the cluster's objects the compiler could not use (an
// unknown selector operator, a malformed CIDR, an unknown protocol): it was
// skipped, and what it would have allowed stays closed.
type Warning struct {
	// Object is the NetworkPolicy or Service ("namespace/name").
	Object  string
	Message string
}

func (w Warning) String() string { return w.Object + ": " + w.Message }

// Compile compiles pod's policy against snap: the one-pod form of
// Compiler.Compile, without its warnings. An agent compiling several pods
// against the same snapshot uses one Compiler, which shares the work.
func Compile(snap *Snapshot, pod LocalPod, node []netip.Addr, generation uint64) *policy.PodPolicy {
	p, _ := NewCompiler(snap, []LocalPod{pod}).Compile(pod, node, generation)
	return p
}

// Compiler compiles local pods' policies against one Snapshot. It compiles
// each NetworkPolicy once, the first time it selects a pod, and shares the
// pods a selector selects between the policies that use it, so that
// compiling every local pod after a change costs little more than
// compiling the policies that select them. It is safe for concurrent use.
//
// The snapshot must not change while a Compiler reads it: the agent makes a
// new Compiler after each batch of changes, compiles every local pod and
// pushes the policies that are not policy.Equal to the one the stack has.
type Compiler struct {
	// nsLabels are the namespaces' labels, with the API server's
	// kubernetes.io/metadata.name label added where the object lacks it,
	// also for namespaces known only from their pods.
	nsLabels map[string]map[string]string
	nsNames  []string // sorted
	// pods are the pods a peer can select, by key and by namespace.
	pods     []*peerPod
	podsByNs map[string][]*peerPod
	// policies are the policies of each namespace, sorted by name.
	policies map[string][]*compiledPolicy
	snap     *Snapshot

	mu sync.Mutex // guards the three below
	// podSets are the pods a peer's selectors select, by the selectors'
	// canonical form; peerSets a rule's peers, resolved; namedGroups an
	// egress rule's named ports resolved on its peers. Policies often
	// repeat the same peers: each is resolved once.
	podSets     map[string][]*peerPod
	peerSets    map[string]*peerSet
	namedGroups map[string][]portGroup

	servicesOnce     sync.Once
	services         []policy.Service
	servicesWarnings []Warning
}

// peerPod is a pod that a peer can select: one with addresses that is
// neither on the host's network, finished, nor being deleted.
type peerPod struct {
	key        string
	ns         string
	labels     map[string]string
	addrs      []netip.Addr // sorted
	containers []Container
}

// compiledPolicy is one NetworkPolicy: what it selects is checked for every
// pod; its rules are compiled once, when it first selects a pod.
type compiledPolicy struct {
	np      *NetworkPolicy
	name    string // "namespace/name"
	sel     selector
	ingress bool
	egress  bool
	// warnings are the spec's own (selector, policyTypes).
	warnings []Warning

	once sync.Once
	body *policyBody
}

type policyBody struct {
	ingress []ingressRule
	// egress is final: named ports resolve on the destination pods, which
	// do not depend on the pod compiled.
	egress   []policy.Rule
	warnings []Warning
}

// ingressRule is an ingress rule with its peers resolved and its named
// ports left to resolve on each pod it is compiled for.
type ingressRule struct {
	peers    []policy.Peer // nil: every address
	allPorts bool
	ports    []policy.PortRange
	named    []namedPort
}

type namedPort struct {
	name     string
	protocol policy.Protocol
}

// NewCompiler indexes snap. local are the node's pods: their addresses as
// their attachments have them are added to the API's, so that a pod the API
// does not show an address for yet (during its ADD) is already a peer.
func NewCompiler(snap *Snapshot, local []LocalPod) *Compiler {
	if snap == nil {
		snap = &Snapshot{}
	}
	c := &Compiler{
		nsLabels:    make(map[string]map[string]string),
		podsByNs:    make(map[string][]*peerPod),
		policies:    make(map[string][]*compiledPolicy),
		podSets:     make(map[string][]*peerPod),
		peerSets:    make(map[string]*peerSet),
		namedGroups: make(map[string][]portGroup),
		snap:        snap,
	}
	for key, ns := range snap.Namespaces {
		if ns == nil {
			continue
		}
		name := cmp.Or(ns.Metadata.Name, key)
		c.nsLabels[name] = namespaceLabels(name, ns.Metadata.Labels)
	}

	localIPs := make(map[string][]netip.Addr, len(local))
	for _, lp := range local {
		if lp.Pod != nil {
			localIPs[objectKey(lp.Pod.Metadata, "")] = lp.IPs
		}
	}
	seen := make(map[string]bool, len(snap.Pods))
	for key, pod := range snap.Pods {
		if pod == nil {
			continue
		}
		k := objectKey(pod.Metadata, key)
		seen[k] = true
		c.addPeerPod(k, pod, localIPs[k])
	}
	for _, lp := range local {
		if lp.Pod == nil {
			continue
		}
		if k := objectKey(lp.Pod.Metadata, ""); !seen[k] {
			seen[k] = true
			c.addPeerPod(k, lp.Pod, lp.IPs)
		}
	}
	slices.SortFunc(c.pods, func(a, b *peerPod) int { return strings.Compare(a.key, b.key) })
	for _, p := range c.pods {
		c.podsByNs[p.ns] = append(c.podsByNs[p.ns], p)
		if c.nsLabels[p.ns] == nil {
			c.nsLabels[p.ns] = namespaceLabels(p.ns, nil)
		}
	}
	for name := range c.nsLabels {
		c.nsNames = append(c.nsNames, name)
	}
	slices.Sort(c.nsNames)

	for key, np := range snap.Policies {
		if np == nil {
			continue
		}
		cp := newCompiledPolicy(np, key)
		ns := np.Metadata.Namespace
		c.policies[ns] = append(c.policies[ns], cp)
	}
	for _, ps := range c.policies {
		slices.SortFunc(ps, func(a, b *compiledPolicy) int { return strings.Compare(a.name, b.name) })
	}
	return c
}

// namespaceLabelKey is the label the API server gives every namespace: its
// name.
const namespaceLabelKey = "kubernetes.io/metadata.name"

func namespaceLabels(name string, labels map[string]string) map[string]string {
	if _, ok := labels[namespaceLabelKey]; ok {
		return labels
	}
	l := make(map[string]string, len(labels)+1)
	for k, v := range labels {
		l[k] = v
	}
	l[namespaceLabelKey] = name
	return l
}

func objectKey(m ObjectMeta, fallback string) string {
	if m.Name == "" {
		return fallback
	}
	return m.Namespace + "/" + m.Name
}

func (c *Compiler) addPeerPod(key string, pod *Pod, extra []netip.Addr) {
	if pod.Spec.HostNetwork || pod.Metadata.DeletionTimestamp != nil ||
		pod.Status.Phase == "Succeeded" || pod.Status.Phase == "Failed" {
		return
	}
	var addrs []netip.Addr
	for _, ip := range pod.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			addrs = append(addrs, a)
		}
	}
	addrs = cleanAddrs(append(addrs, extra...))
	if len(addrs) == 0 {
		return
	}
	c.pods = append(c.pods, &peerPod{
		key:        key,
		ns:         pod.Metadata.Namespace,
		labels:     pod.Metadata.Labels,
		addrs:      addrs,
		containers: pod.Spec.Containers,
	})
}

// cleanAddrs makes addrs comparable (no zone, no IPv4-mapped form), sorted
// and without duplicates or invalid entries.
func cleanAddrs(addrs []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if a.IsValid() {
			out = append(out, a.Unmap().WithZone(""))
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

func newCompiledPolicy(np *NetworkPolicy, key string) *compiledPolicy {
	cp := &compiledPolicy{np: np, name: objectKey(np.Metadata, key)}
	var err error
	cp.sel, err = newSelector(&np.Spec.PodSelector)
	if err != nil {
		cp.warn("spec.podSelector selects no pod: %v", err)
	}
	known := false
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case "Ingress":
			cp.ingress, known = true, true
		case "Egress":
			cp.egress, known = true, true
		default:
			cp.warn("unknown policy type %q ignored", t)
		}
	}
	if !known {
		// The API's defaulting: Ingress always, Egress when there are
		// egress rules.
		cp.ingress, cp.egress = true, len(np.Spec.Egress) > 0
	}
	return cp
}

func (cp *compiledPolicy) warn(format string, args ...any) {
	cp.warnings = append(cp.warnings, Warning{Object: cp.name, Message: fmt.Sprintf(format, args...)})
}

// Compile returns pod's policy, and the warnings of the policies that
// select it (and of the Services, when its egress is isolated): each names
// a part that was skipped and allows nothing. A pod without its API object
// gets policy.Closed.
//
// The result shares its Services and rules' peers with the other pods'
// results of c: read them, do not change them.
func (c *Compiler) Compile(pod LocalPod, node []netip.Addr, generation uint64) (*policy.PodPolicy, []Warning) {
	nodeAddrs := cleanAddrs(slices.Clone(node))
	if pod.Pod == nil {
		p := policy.Closed(nodeAddrs)
		p.Generation = generation
		return p, []Warning{{Object: "(pod)", Message: "no pod object to compile: closed"}}
	}
	out := &policy.PodPolicy{Version: policy.FormatVersion, Generation: generation}
	if len(nodeAddrs) > 0 {
		out.Node = nodeAddrs
	}
	var warnings []Warning
	labels := pod.Pod.Metadata.Labels
	for _, cp := range c.policies[pod.Pod.Metadata.Namespace] {
		if !cp.sel.matches(labels) || !cp.ingress && !cp.egress {
			continue
		}
		b := cp.compiled(c)
		warnings = append(warnings, cp.warnings...)
		warnings = append(warnings, b.warnings...)
		if cp.ingress {
			out.Ingress.Isolated = true
			out.Ingress.Policies = append(out.Ingress.Policies, cp.name)
			for i := range b.ingress {
				if r, ok := b.ingress[i].on(pod.Pod.Spec.Containers, cp.name); ok {
					out.Ingress.Rules = append(out.Ingress.Rules, r)
				}
			}
		}
		if cp.egress {
			out.Egress.Isolated = true
			out.Egress.Policies = append(out.Egress.Policies, cp.name)
			out.Egress.Rules = append(out.Egress.Rules, b.egress...)
		}
	}
	if out.Egress.Isolated {
		svcs, w := c.serviceList()
		out.Services = svcs
		warnings = append(warnings, w...)
	}
	return out, warnings
}

// on is r for a pod whose containers are containers: false when it allows
// nothing (every port it names is a named port the pod does not declare).
func (r *ingressRule) on(containers []Container, name string) (policy.Rule, bool) {
	rule := policy.Rule{Policy: name, Peers: r.peers}
	if r.allPorts {
		return rule, true
	}
	ports := r.ports
	if len(r.named) > 0 {
		ports = slices.Clone(ports)
		for _, n := range r.named {
			if pr, ok := containerPort(containers, n); ok {
				ports = append(ports, pr)
			}
		}
		ports = sortPorts(ports)
	}
	if len(ports) == 0 {
		return policy.Rule{}, false
	}
	rule.Ports = ports
	return rule, true
}

// containerPort resolves a named port on a pod's containers: the port of
// that name and protocol.
func containerPort(containers []Container, n namedPort) (policy.PortRange, bool) {
	for _, ctr := range containers {
		for _, p := range ctr.Ports {
			proto := policy.Protocol(cmp.Or(p.Protocol, string(policy.TCP)))
			if p.Name == n.name && proto == n.protocol && p.ContainerPort > 0 && p.ContainerPort <= 65535 {
				port := uint16(p.ContainerPort)
				return policy.PortRange{Protocol: proto, First: port, Last: port}, true
			}
		}
	}
	return policy.PortRange{}, false
}

func (cp *compiledPolicy) compiled(c *Compiler) *policyBody {
	cp.once.Do(func() { cp.body = c.compileBody(cp) })
	return cp.body
}

func (c *Compiler) compileBody(cp *compiledPolicy) *policyBody {
	b := &policyBody{}
	warn := func(format string, args ...any) {
		b.warnings = append(b.warnings, Warning{Object: cp.name, Message: fmt.Sprintf(format, args...)})
	}
	ns := cp.np.Metadata.Namespace
	if cp.ingress {
		for i, rule := range cp.np.Spec.Ingress {
			where := fmt.Sprintf("ingress rule %d", i)
			peers := c.resolvePeers(ns, rule.From, where, warn)
			if !peers.all && len(peers.prefixes) == 0 {
				continue
			}
			ports, named, all := resolvePorts(rule.Ports, where, warn)
			if !all && len(ports) == 0 && len(named) == 0 {
				continue
			}
			b.ingress = append(b.ingress, ingressRule{peers: peers.prefixes, allPorts: all, ports: ports, named: named})
		}
	}
	if cp.egress {
		for i, rule := range cp.np.Spec.Egress {
			where := fmt.Sprintf("egress rule %d", i)
			peers := c.resolvePeers(ns, rule.To, where, warn)
			ports, named, all := resolvePorts(rule.Ports, where, warn)
			if peers.all || len(peers.prefixes) > 0 {
				switch {
				case all:
					b.egress = append(b.egress, policy.Rule{Policy: cp.name, Peers: peers.prefixes})
				case len(ports) > 0:
					b.egress = append(b.egress, policy.Rule{Policy: cp.name, Peers: peers.prefixes, Ports: ports})
				}
			}
			if len(named) > 0 {
				b.egress = append(b.egress, c.namedEgress(cp.name, peers, named)...)
			}
		}
	}
	return b
}

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

	s = &peerSet{key: k, blocks: blocks}
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
	s.prefixes = sortPeers(prefixes)
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
		pick(c.podsByNs[ns])
	} else {
		for _, name := range c.nsNames {
			if ps.ns.matches(c.nsLabels[name]) {
				pick(c.podsByNs[name])
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
		for _, p := range c.pods {
			add(p, p.addrs)
		}
	} else {
		for _, p := range peers.pods {
			add(p, p.addrs)
		}
		if len(peers.blocks) > 0 {
			for _, p := range c.pods {
				var in []netip.Addr
				for _, a := range p.addrs {
					if slices.ContainsFunc(peers.blocks, func(b policy.Peer) bool { return peerContains(b, a) }) {
						in = append(in, a)
					}
				}
				if len(in) > 0 {
					add(p, in)
				}
			}
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
		groups = append(groups, portGroup{peers: sortPeers(ps), ports: []policy.PortRange{pr}})
	}
	return groups
}

// resolvePorts reads a rule's ports: all when it names none; else the
// numeric ranges and the named ports. An entry the API would refuse
// matches nothing; the others still apply.
func resolvePorts(ports []NetworkPolicyPort, where string, warn func(string, ...any)) (ranges []policy.PortRange, named []namedPort, all bool) {
	if len(ports) == 0 {
		return nil, nil, true
	}
	for i, p := range ports {
		proto := policy.TCP
		if p.Protocol != nil {
			proto = policy.Protocol(*p.Protocol)
		}
		if proto.Number() == 0 {
			warn("%s port %d: unknown protocol %q, matches nothing", where, i, proto)
			continue
		}
		switch {
		case p.Port == nil:
			if p.EndPort != nil {
				warn("%s port %d: endPort without port, matches nothing", where, i)
				continue
			}
			ranges = append(ranges, policy.PortRange{Protocol: proto})
		case p.Port.IsString:
			if p.EndPort != nil || p.Port.Str == "" {
				warn("%s port %d: named port %q with endPort or empty, matches nothing", where, i, p.Port.Str)
				continue
			}
			named = append(named, namedPort{name: p.Port.Str, protocol: proto})
		default:
			first, last := p.Port.Int, p.Port.Int
			if p.EndPort != nil {
				last = *p.EndPort
			}
			if first < 1 || last > 65535 || last < first {
				warn("%s port %d: port range %d-%d out of 1-65535, matches nothing", where, i, first, last)
				continue
			}
			ranges = append(ranges, policy.PortRange{Protocol: proto, First: uint16(first), Last: uint16(last)})
		}
	}
	slices.SortFunc(named, func(a, b namedPort) int {
		return cmp.Or(strings.Compare(a.name, b.name), strings.Compare(string(a.protocol), string(b.protocol)))
	})
	return sortPorts(ranges), slices.Compact(named), false
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

func sortPeers(ps []policy.Peer) []policy.Peer {
	slices.SortFunc(ps, func(a, b policy.Peer) int {
		return cmp.Or(comparePrefixes(a.CIDR, b.CIDR), slices.CompareFunc(a.Except, b.Except, comparePrefixes))
	})
	return slices.CompactFunc(ps, func(a, b policy.Peer) bool {
		return a.CIDR == b.CIDR && slices.Equal(a.Except, b.Except)
	})
}

func comparePorts(a, b policy.PortRange) int {
	return cmp.Or(strings.Compare(string(a.Protocol), string(b.Protocol)), cmp.Compare(a.First, b.First), cmp.Compare(a.Last, b.Last))
}

func sortPorts(ps []policy.PortRange) []policy.PortRange {
	slices.SortFunc(ps, comparePorts)
	return slices.Compact(ps)
}
