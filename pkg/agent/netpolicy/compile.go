package netpolicy

import (
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
	// podView is the pods a peer can select, by namespace, and the
	// namespaces' labels (with the API server's kubernetes.io/metadata.name
	// label added where the object lacks it, also for namespaces known
	// only from their pods).
	*podView
	// policies are the policies of each namespace, sorted by name.
	policies map[string][]*parsedPolicy
	// cnps are the ClusterNetworkPolicies in the order a connection
	// meets them (clusterPolicies).
	cnps []*parsedCNP
	snap *Snapshot

	mu sync.Mutex // guards the three below
	// podSets are the pods a peer's selectors select, by the selectors'
	// canonical form; peerSets a rule's peers, resolved; namedGroups an
	// egress rule's named ports resolved on its peers. Policies often
	// repeat the same peers: each is resolved once.
	podSets     map[string][]*peerPod
	peerSets    map[string]*peerSet
	namedGroups map[string][]portGroup

	servicesOnce sync.Once
	services     *serviceTable
	tables       *ServiceTables // nil: the table is the Compiler's own
	// egressOf is the egress matcher and Services of each set of
	// egress-isolating policies (a pod's egress rules are its policies',
	// whatever the pod): replicas share them. Guarded by mu.
	egressOf map[string]*egressResult
}

type egressResult struct {
	once     sync.Once
	matcher  *policy.Matcher
	err      error
	services []policy.Service
	carried  map[string]bool
}

// peerPod is a pod that a peer can select: one with addresses that is
// neither on the host's network nor finished. A pod being deleted stays a
// peer while it keeps its addresses: it still talks during its grace
// period (a server draining its connections, a client finishing its
// requests), and its address is not handed to another pod before it is
// released (Calico keeps such pods' addresses in its rules the same way).
type peerPod struct {
	key        string
	ns         string
	labels     map[string]string
	addrs      []netip.Addr // sorted
	containers []Container
}

// NewCompiler indexes snap. local are the node's pods: their addresses as
// their attachments have them are added to the API's, so that a pod the API
// does not show an address for yet (during its ADD) is already a peer.
func NewCompiler(snap *Snapshot, local []LocalPod) *Compiler {
	if snap == nil {
		snap = &Snapshot{}
	}
	return NewIndexedCompiler(Indexes{Pods: indexOf(snap)}, snap, local)
}

// Indexes are what an agent's compilations share, kept from one to the
// next rather than made anew from each snapshot.
type Indexes struct {
	// Pods are the cluster's pods and namespaces, kept up to date by
	// the caller.
	Pods *PodIndex
	// Services, when set, keeps the service table between compilations
	// of the same Services and EndpointSlices.
	Services *ServiceTables
}

// NewIndexedCompiler is NewCompiler with the pods and namespaces taken from
// idx.Pods rather than from snap (whose Pods and Namespaces it does not
// read): an agent's rounds then share the index of the cluster's pods
// instead of making it anew.
func NewIndexedCompiler(idx Indexes, snap *Snapshot, local []LocalPod) *Compiler {
	c := &Compiler{
		podView:     idx.Pods.view().withLocal(local),
		tables:      idx.Services,
		policies:    make(map[string][]*parsedPolicy),
		podSets:     make(map[string][]*peerPod),
		peerSets:    make(map[string]*peerSet),
		namedGroups: make(map[string][]portGroup),
		egressOf:    make(map[string]*egressResult),
		snap:        snap,
	}
	for key, np := range snap.Policies {
		if np == nil {
			continue
		}
		cp := parsePolicy(np, key)
		ns := np.Metadata.Namespace
		c.policies[ns] = append(c.policies[ns], cp)
	}
	for _, ps := range c.policies {
		slices.SortFunc(ps, func(a, b *parsedPolicy) int { return strings.Compare(a.name, b.name) })
	}
	c.cnps = clusterPolicies(snap)
	return c
}

// egress is the matcher and Services of egress d (its rules those of
// d.Policies), made once per Compiler for each set of policies.
//
// The ClusterNetworkPolicies' rules do not depend on the pod they apply
// to: tiers, the names of the ClusterNetworkPolicies whose egress rules
// d holds, in order, tell d's tiers apart.
func (c *Compiler) egress(d policy.Direction, tiers []string, node []netip.Addr) *egressResult {
	key := fmt.Sprintf("%q %q %v", d.Policies, tiers, node)
	c.mu.Lock()
	e := c.egressOf[key]
	if e == nil {
		e = &egressResult{}
		c.egressOf[key] = e
	}
	c.mu.Unlock()
	e.once.Do(func() {
		e.matcher, e.err = policy.Compile(&policy.PodPolicy{Version: policy.FormatVersion, Egress: d})
		if e.err == nil {
			e.services, e.carried = c.serviceTable().forPod(e.matcher, admitting(d), node)
		}
	})
	return e
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

// newPeerPod is pod as a peer, with extra addresses besides the API's;
// nil when it cannot be one.
func newPeerPod(key string, pod *Pod, extra []netip.Addr) *peerPod {
	if !peerEligible(pod) {
		return nil
	}
	var addrs []netip.Addr
	for _, ip := range pod.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			addrs = append(addrs, a)
		}
	}
	addrs = cleanAddrs(append(addrs, extra...))
	if len(addrs) == 0 {
		return nil
	}
	return &peerPod{
		key:        key,
		ns:         pod.Metadata.Namespace,
		labels:     pod.Metadata.Labels,
		addrs:      addrs,
		containers: pod.Spec.Containers,
	}
}

// peerEligible says whether pod can be a peer at all (the addresses
// aside): never on the host's network (its address is the node's) nor
// finished (its addresses are released).
func peerEligible(pod *Pod) bool {
	return !pod.Spec.HostNetwork && pod.Status.Phase != "Succeeded" && pod.Status.Phase != "Failed"
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

// Compile returns pod's policy, and the warnings of the policies that
// select it (and of the Services, when its egress can deny): each names
// a part that was skipped and allows nothing. A pod without its API object
// gets policy.Closed.
//
// The result shares its Services and rules' peers with the other pods'
// results of c: read them, do not change them.
func (c *Compiler) Compile(pod LocalPod, node []netip.Addr, generation uint64) (*policy.PodPolicy, []Warning) {
	r := c.CompilePod(pod, node, generation)
	return r.Policy, r.Warnings
}

// Compiled is one pod's compilation: its policy, the warnings of the
// policies that select it, and what the policy was made from.
type Compiled struct {
	Policy   *policy.PodPolicy
	Warnings []Warning
	// Deps tells which changes of the cluster can change Policy; nil
	// for a pod without its API object (nothing but its own arrival
	// changes policy.Closed).
	Deps *Deps
}

// CompilePod is Compile with what the policy depends on.
func (c *Compiler) CompilePod(pod LocalPod, node []netip.Addr, generation uint64) Compiled {
	nodeAddrs := cleanAddrs(slices.Clone(node))
	if pod.Pod == nil {
		p := policy.Closed(nodeAddrs)
		p.Generation = generation
		return Compiled{Policy: p, Warnings: []Warning{{Object: "(pod)", Message: "no pod object to compile: closed"}}}
	}
	out := &policy.PodPolicy{Generation: generation}
	if len(nodeAddrs) > 0 {
		out.Node = nodeAddrs
	}
	var warnings []Warning
	deps := newDeps(pod.Pod)
	labels := pod.Pod.Metadata.Labels
	for _, cp := range c.policies[pod.Pod.Metadata.Namespace] {
		if !cp.sel.matches(labels) || !cp.ingress && !cp.egress {
			continue
		}
		b := cp.resolved(c)
		deps.addPolicy(b)
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
	var egressTiers []string
	nsLabels := namespaceLabels(pod.Pod.Metadata.Namespace, c.nsLabels[pod.Pod.Metadata.Namespace])
	for _, cp := range c.cnps {
		deps.cnp = true
		if !cp.selects(labels, nsLabels) {
			continue
		}
		b := cp.resolved(c)
		deps.addPeers(b.peers)
		deps.namedBlocks = append(deps.namedBlocks, b.namedBlocks...)
		warnings = append(warnings, cp.warnings...)
		warnings = append(warnings, b.warnings...)
		in, eg := &out.Ingress.Baseline, &out.Egress.Baseline
		if cp.admin {
			in, eg = &out.Ingress.Admin, &out.Egress.Admin
		}
		for i := range b.ingress {
			if r, ok := b.ingress[i].on(pod.Pod.Spec.Containers); ok {
				*in = append(*in, r)
			}
		}
		*eg = append(*eg, b.egress...)
		if len(b.egress) > 0 {
			egressTiers = append(egressTiers, cp.name)
		}
	}
	out.Version = out.NeededVersion()
	if out.Egress.Isolated || out.Egress.HasTiers() {
		t := c.serviceTable()
		warnings = append(warnings, t.warnings...)
		// The stack's own matcher decides which backends the rules
		// admit, so that what is carried is what the stack would pick
		// from, exactly.
		e := c.egress(out.Egress, egressTiers, nodeAddrs)
		if e.err != nil {
			// Cannot happen (the compiler's rules are valid); carry
			// nothing rather than guess: the stack refuses the policy
			// the same way.
			warnings = append(warnings, Warning{Object: "(pod)", Message: fmt.Sprintf("egress rules invalid: %v", e.err)})
		} else {
			out.Services, deps.services = e.services, e.carried
			deps.egress, deps.node = e.matcher, nodeAddrs
		}
	}
	return Compiled{Policy: out, Warnings: warnings, Deps: deps}
}

// admitting is what can admit a connection in egress d, as rules: every
// address when no NetworkPolicy isolates d (the default, the Baseline
// tier's Accept); else the NetworkPolicies' rules and the Admin tier's
// Accept rules. Only the Services with a backend or address among them
// can be carried.
func admitting(d policy.Direction) []policy.Rule {
	if !d.Isolated {
		return []policy.Rule{{}}
	}
	rules := d.Rules
	for _, r := range d.Admin {
		if r.Action == policy.Accept {
			rules = append(slices.Clip(rules), policy.Rule{Policy: r.Policy, Peers: r.Peers, Ports: r.Ports})
		}
	}
	return rules
}
