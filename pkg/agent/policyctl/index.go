package policyctl

import (
	"maps"
	"reflect"
	"sync"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
)

// index tells which local pods a change of the cluster can affect, from
// what each one's last compile depended on (netpolicy.Deps, recorded by
// the compiler), and collects them for the next round: a round compiles
// the pods whose inputs changed, and no other.
//
// A round compiles against a snapshot taken after it began (begin); the
// changes that arrive while it runs are checked against the Deps it
// records too (end), so that a change the snapshot missed is never
// checked only against Deps older than the policy it would change.
type index struct {
	// nsLabels gives a namespace's cached labels.
	nsLabels func(ns string) map[string]string
	// kick asks for a round.
	kick func()

	mu sync.Mutex // guards the fields below
	// deps are the local pods' last compiles' dependencies, by pod key
	// ("namespace/name").
	deps map[string]*netpolicy.Deps
	// dirty are the pods the next round compiles; full: every local
	// pod.
	dirty map[string]bool
	full  bool
	// inRound is set between begin and end; during are the changes
	// seen meanwhile.
	inRound bool
	during  []netpolicy.Change
	// slicesOf are the EndpointSlices of each Service ("namespace/name"),
	// by slice key, for telling what a Service's change reaches.
	slicesOf map[string]map[string]*netpolicy.EndpointSlice
}

func newIndex(nsLabels func(string) map[string]string, kick func()) *index {
	return &index{
		nsLabels: nsLabels, kick: kick,
		deps: map[string]*netpolicy.Deps{}, dirty: map[string]bool{}, full: true,
		slicesOf: map[string]map[string]*netpolicy.EndpointSlice{},
	}
}

var _ changes = (*index)(nil)

// apply marks the local pods ch affects, and self (a local pod's own
// change) when set; it asks for a round when it marked any.
func (x *index) apply(ch netpolicy.Change, self string) {
	x.mu.Lock()
	marked := false
	if self != "" && x.deps[self] != nil && !x.dirty[self] {
		x.dirty[self], marked = true, true
	}
	if ch != nil {
		for k, d := range x.deps {
			if !x.dirty[k] && ch.Affects(d) {
				x.dirty[k], marked = true, true
			}
		}
		if x.inRound {
			x.during = append(x.during, ch)
		}
	}
	x.mu.Unlock()
	if marked {
		x.kick()
	}
}

func (x *index) policy(old, new *netpolicy.NetworkPolicy) {
	if ch := netpolicy.PolicyChange(old, new); ch != nil {
		x.apply(ch, "")
	}
}

func (x *index) clusterPolicy(old, new *netpolicy.ClusterNetworkPolicy) {
	if ch := netpolicy.ClusterPolicyChange(old, new); ch != nil {
		x.apply(ch, "")
	}
}

func (x *index) pod(old, new *netpolicy.Pod) {
	ch := netpolicy.PodChange(old, new, x.nsLabels)
	self := ""
	if selfChanged(old, new) {
		self = podKeyOf(old, new)
	}
	if ch != nil || self != "" {
		x.apply(ch, self)
	}
}

// selfChanged says whether a pod's change can change its own policy: the
// policies that select it (its labels) and its named ports.
func selfChanged(old, new *netpolicy.Pod) bool {
	if old == nil || new == nil {
		return true
	}
	return !maps.Equal(old.Metadata.Labels, new.Metadata.Labels) || !reflect.DeepEqual(old.Spec.Containers, new.Spec.Containers)
}

func podKeyOf(old, new *netpolicy.Pod) string {
	p := new
	if p == nil {
		p = old
	}
	return p.Metadata.Namespace + "/" + p.Metadata.Name
}

func (x *index) namespace(old, new *netpolicy.Namespace) {
	if ch := netpolicy.NamespaceChange(old, new); ch != nil {
		x.apply(ch, "")
	}
}

func (x *index) service(old, new *netpolicy.Service) {
	svc := new
	if svc == nil {
		svc = old
	}
	x.mu.Lock()
	var eps []*netpolicy.EndpointSlice
	for _, es := range x.slicesOf[svc.Metadata.Namespace+"/"+svc.Metadata.Name] {
		eps = append(eps, es)
	}
	x.mu.Unlock()
	if ch := netpolicy.ServiceChange(old, new, eps); ch != nil {
		x.apply(ch, "")
	}
}

func (x *index) slice(old, new *netpolicy.EndpointSlice) {
	x.mu.Lock()
	if k := netpolicy.ServiceKeyOfSlice(old); k != "" {
		delete(x.slicesOf[k], old.Metadata.Namespace+"/"+old.Metadata.Name)
		if len(x.slicesOf[k]) == 0 {
			delete(x.slicesOf, k)
		}
	}
	if k := netpolicy.ServiceKeyOfSlice(new); k != "" {
		if x.slicesOf[k] == nil {
			x.slicesOf[k] = map[string]*netpolicy.EndpointSlice{}
		}
		x.slicesOf[k][new.Metadata.Namespace+"/"+new.Metadata.Name] = new
	}
	x.mu.Unlock()
	if ch := netpolicy.SliceChange(old, new); ch != nil {
		x.apply(ch, "")
	}
}

// markPod makes the next round compile the local pod key.
func (x *index) markPod(key string) {
	x.mu.Lock()
	x.dirty[key] = true
	x.mu.Unlock()
	x.kick()
}

// markAll makes the next round compile every local pod.
func (x *index) markAll() {
	x.mu.Lock()
	x.full = true
	x.mu.Unlock()
	x.kick()
}

// begin starts a round: it returns the pods to compile (all: every local
// pod) and starts collecting the changes that arrive meanwhile.
func (x *index) begin() (all bool, dirty map[string]bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	all, dirty = x.full, x.dirty
	x.full, x.dirty = false, map[string]bool{}
	x.inRound, x.during = true, nil
	return all, dirty
}

// end records the round's compiles (a nil Deps: the pod is not compiled
// from the cluster, forget it), forgets the pods that are not local any
// more (live: the local pods' keys), and checks the changes seen during
// the round against the new Deps.
func (x *index) end(compiled map[string]*netpolicy.Deps, live map[string]bool) {
	x.mu.Lock()
	marked := false
	for k, d := range compiled {
		if d == nil {
			delete(x.deps, k)
			continue
		}
		x.deps[k] = d
		for _, ch := range x.during {
			if !x.dirty[k] && ch.Affects(d) {
				x.dirty[k], marked = true, true
			}
		}
	}
	for k := range x.deps {
		if !live[k] {
			delete(x.deps, k)
			delete(x.dirty, k)
		}
	}
	x.inRound, x.during = false, nil
	x.mu.Unlock()
	if marked {
		x.kick()
	}
}
