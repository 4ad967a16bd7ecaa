package netpolicy

import (
	"maps"
	"net/netip"
	"reflect"
	"slices"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// Deps is what one local pod's policy was compiled from, besides the pod
// itself: the policies that can select it (its namespace and labels), the
// peers their rules select, where their egress named ports resolve, and
// the Services it carries with the rules that decided it. A Change of the
// cluster tells from it whether the pod must be compiled again, so that
// the agent compiles again exactly the pods whose inputs changed, and no
// other.
//
// Deps is read-only once CompilePod returned it; it shares what it holds
// with the Compiler's results.
type Deps struct {
	ns     string
	labels map[string]string
	// peers are the selector peers of the rules of the policies that
	// select the pod, those that select nothing now included.
	peers []peerDep
	seen  map[string]bool // peers' keys
	// namedAll and namedBlocks are where egress named ports resolve
	// besides the selected pods: on every pod, on the pods in blocks.
	namedAll    bool
	namedBlocks []policy.Peer
	// egress is the pod's egress rules as its stack matches them; nil
	// when egress is not isolated (no Service carried).
	egress *policy.Matcher
	// node is the node's addresses the node ports were resolved on.
	node []netip.Addr
	// services are the Services carried ("namespace/name"), deny
	// entries included.
	services map[string]bool
	// cnp: ClusterNetworkPolicies were compiled, whose subjects select by
	// the pod's namespace's labels.
	cnp bool
}

type peerDep struct {
	ns  string // the policy's: a podSelector alone selects in it
	sel peerSelectors
}

func newDeps(pod *Pod) *Deps {
	return &Deps{ns: pod.Metadata.Namespace, labels: pod.Metadata.Labels, seen: map[string]bool{}}
}

func (d *Deps) addPolicy(b *policyBody) {
	d.addPeers(b.peers)
	d.namedAll = d.namedAll || b.namedAll
	d.namedBlocks = append(d.namedBlocks, b.namedBlocks...)
}

func (d *Deps) addPeers(peers []*peerSet) {
	for _, ps := range peers {
		for _, sel := range ps.sels {
			k := sel.key
			if sel.ns == nil {
				k = ps.ns + k
			}
			if !d.seen[k] {
				d.seen[k] = true
				d.peers = append(d.peers, peerDep{ns: ps.ns, sel: sel})
			}
		}
	}
}

// Change is one change of a watched object, prepared once and then
// checked against every local pod's Deps.
type Change interface {
	// Affects reports whether the change can change the policy compiled
	// with d (of a pod other than the changed object: a local pod's own
	// change always can).
	Affects(d *Deps) bool
}

// PolicyChange is a NetworkPolicy added (old nil), changed or deleted
// (new nil); nil when its spec did not change. It affects the pods its
// old or new podSelector selects: a policy's rules reach only those.
func PolicyChange(old, new *NetworkPolicy) Change {
	if old != nil && new != nil && reflect.DeepEqual(old.Spec, new.Spec) && old.Metadata.Namespace == new.Metadata.Namespace {
		return nil
	}
	var c policyChange
	for _, np := range []*NetworkPolicy{old, new} {
		if np == nil {
			continue
		}
		sel, _ := newSelector(&np.Spec.PodSelector) // a bad one selects nothing
		c = append(c, policySel{np.Metadata.Namespace, sel})
	}
	return c
}

type policySel struct {
	ns  string
	sel selector
}

type policyChange []policySel

func (c policyChange) Affects(d *Deps) bool {
	for _, p := range c {
		if p.ns == d.ns && p.sel.matches(d.labels) {
			return true
		}
	}
	return false
}

// peerView is a pod as the peers see it: nil for one that cannot be a
// peer.
type peerView struct {
	ns, name   string
	labels     map[string]string
	nsLabels   map[string]string
	addrs      []netip.Addr
	containers []Container
}

func viewOf(pod *Pod, nsLabels func(string) map[string]string) *peerView {
	if pod == nil || !peerEligible(pod) {
		return nil
	}
	var addrs []netip.Addr
	for _, ip := range pod.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			addrs = append(addrs, a)
		}
	}
	if addrs = cleanAddrs(addrs); len(addrs) == 0 {
		return nil
	}
	ns := pod.Metadata.Namespace
	return &peerView{ns: ns, name: pod.Metadata.Name, labels: pod.Metadata.Labels,
		nsLabels: namespaceLabels(ns, nsLabels(ns)), addrs: addrs, containers: pod.Spec.Containers}
}

func (v *peerView) equal(w *peerView) bool {
	if v == nil || w == nil {
		return v == w
	}
	return v.ns == w.ns && v.name == w.name && maps.Equal(v.labels, w.labels) && slices.Equal(v.addrs, w.addrs) &&
		reflect.DeepEqual(v.containers, w.containers)
}

// PodChange is a pod added (old nil), changed or deleted (new nil), as a
// peer of the local pods; nil when nothing a peer is made of changed (its
// labels, addresses, container ports, whether it can be a peer: not its
// conditions, nor its deletion while it keeps its addresses). nsLabels
// gives a namespace's labels as cached (nil: none cached). A local pod's
// own change is not in it: it always changes the pod's policy.
func PodChange(old, new *Pod, nsLabels func(string) map[string]string) Change {
	vo, vn := viewOf(old, nsLabels), viewOf(new, nsLabels)
	if vo.equal(vn) {
		return nil
	}
	var c podChange
	for _, v := range []*peerView{vo, vn} {
		if v != nil {
			c = append(c, v)
		}
	}
	return c
}

type podChange []*peerView

func (c podChange) Affects(d *Deps) bool {
	for _, v := range c {
		for _, p := range d.peers {
			if !p.sel.pod.matches(v.labels) {
				continue
			}
			if p.sel.ns == nil && p.ns == v.ns || p.sel.ns != nil && p.sel.ns.matches(v.nsLabels) {
				return true
			}
		}
		if d.namedAll && hasNamedPort(v.containers) {
			return true
		}
		for _, b := range d.namedBlocks {
			if slices.ContainsFunc(v.addrs, func(a netip.Addr) bool { return peerContains(b, a) }) {
				return true
			}
		}
	}
	return false
}

func hasNamedPort(cs []Container) bool {
	for _, c := range cs {
		for _, p := range c.Ports {
			if p.Name != "" {
				return true
			}
		}
	}
	return false
}

// NamespaceChange is a Namespace added, relabelled or deleted; nil when
// its labels (with the name label every namespace has) did not change.
// It affects the pods whose peers' namespaceSelectors select it before or
// after: its pods join or leave those peers.
//
// It also affects the namespace's own pods when ClusterNetworkPolicies
// were compiled: their subjects select by the namespace's labels.
func NamespaceChange(old, new *Namespace) Change {
	var c namespaceChange
	for _, ns := range []*Namespace{old, new} {
		if ns != nil {
			c.name = ns.Metadata.Name
			c.labels = append(c.labels, namespaceLabels(ns.Metadata.Name, ns.Metadata.Labels))
		}
	}
	if len(c.labels) == 2 && maps.Equal(c.labels[0], c.labels[1]) {
		return nil
	}
	return c
}

type namespaceChange struct {
	name   string
	labels []map[string]string
}

func (c namespaceChange) Affects(d *Deps) bool {
	if d.cnp && d.ns == c.name {
		return true
	}
	for _, p := range d.peers {
		if p.sel.ns == nil {
			continue
		}
		for _, l := range c.labels {
			if p.sel.ns.matches(l) {
				return true
			}
		}
	}
	return false
}

// ServiceChange is a Service added, changed or deleted, with the
// EndpointSlices of its name now; nil when its addresses and ports did
// not change. It affects the egress-isolated pods that carry it, and
// those that would carry it now: a backend or one of its addresses their
// egress rules admit.
func ServiceChange(old, new *Service, eps []*EndpointSlice) Change {
	if old != nil && new != nil && reflect.DeepEqual(old.Spec, new.Spec) && reflect.DeepEqual(old.Status, new.Status) {
		return nil
	}
	c := &serviceChange{}
	for _, svc := range []*Service{old, new} {
		if svc == nil {
			continue
		}
		c.key = svc.Metadata.Namespace + "/" + svc.Metadata.Name
		t := &serviceTable{}
		t.addService(c.key, svc, eps)
		c.bad = c.bad || len(t.warnings) > 0
		if svc == new {
			c.now = t.entries
		}
	}
	return c
}

type serviceChange struct {
	key string
	// now are the Service's entries as the change leaves them.
	now []serviceEntry
	// bad: the Service gave or gives warnings, which every pod whose
	// egress is isolated carries.
	bad bool
}

func (c *serviceChange) Affects(d *Deps) bool {
	if d.egress == nil {
		return false
	}
	if d.services[c.key] || c.bad {
		return true
	}
	allows := func(a netip.AddrPort, proto policy.Protocol) bool {
		ok, _ := d.egress.Allow(policy.Egress, a.Addr(), proto.Number(), a.Port())
		return ok
	}
	for _, e := range c.now {
		for _, b := range e.backends {
			if allows(b.Addr, e.proto) {
				return true
			}
		}
		if e.vip.Addr().IsValid() {
			if allows(e.vip, e.proto) {
				return true
			}
			continue
		}
		for _, a := range d.node {
			if a.Is4() == e.v4 && allows(netip.AddrPortFrom(a, e.vip.Port()), e.proto) {
				return true
			}
		}
	}
	return false
}

// SliceChange is an EndpointSlice added, changed or deleted; nil when its
// ready endpoints, their ports and its Service are what they were. It
// affects the egress-isolated pods whose egress rules admit one of the
// backends that came or went: the others carry none of them, before or
// after.
func SliceChange(old, new *EndpointSlice) Change {
	before, after := sliceBackends(old), sliceBackends(new)
	if ServiceKeyOfSlice(old) != ServiceKeyOfSlice(new) {
		return sliceChange(append(before, after...))
	}
	// A backend is in before or after, or in both: what is in one only
	// changed.
	in := make(map[sliceBackend]int, len(before)+len(after))
	for _, b := range before {
		in[b] |= 1
	}
	for _, b := range after {
		in[b] |= 2
	}
	var c sliceChange
	for b, where := range in {
		if where != 3 {
			c = append(c, b)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c
}

type sliceBackend struct {
	addr  netip.AddrPort
	proto uint8
}

type sliceChange []sliceBackend

// sliceBackends are es's ready endpoints on each of its ports.
func sliceBackends(es *EndpointSlice) []sliceBackend {
	if es == nil || es.AddressType != "" && es.AddressType != "IPv4" && es.AddressType != "IPv6" {
		return nil
	}
	var out []sliceBackend
	for _, e := range es.Endpoints {
		if e.Conditions.Ready != nil && !*e.Conditions.Ready {
			continue
		}
		for _, s := range e.Addresses {
			a, err := netip.ParseAddr(s)
			if err != nil {
				continue
			}
			for _, p := range es.Ports {
				if p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
					continue
				}
				proto := policy.TCP
				if p.Protocol != nil {
					proto = policy.Protocol(*p.Protocol)
				}
				out = append(out, sliceBackend{netip.AddrPortFrom(a.Unmap().WithZone(""), uint16(*p.Port)), proto.Number()})
			}
		}
	}
	return out
}

func (c sliceChange) Affects(d *Deps) bool {
	if d.egress == nil {
		return false
	}
	for _, b := range c {
		if ok, _ := d.egress.Allow(policy.Egress, b.addr.Addr(), b.proto, b.addr.Port()); ok {
			return true
		}
	}
	return false
}

// ClusterPolicyChange is a ClusterNetworkPolicy added (old nil), changed
// or deleted (new nil); nil when its spec did not change. Its subject
// selects by namespace labels, which Deps does not keep: it affects every
// pod (ClusterNetworkPolicies are few and change seldom).
func ClusterPolicyChange(old, new *ClusterNetworkPolicy) Change {
	if old != nil && new != nil && reflect.DeepEqual(old.Spec, new.Spec) && slices.Equal(old.Unknown, new.Unknown) {
		return nil
	}
	return everyPod{}
}

type everyPod struct{}

func (everyPod) Affects(*Deps) bool { return true }
