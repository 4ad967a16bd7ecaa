// SPDX-License-Identifier: Apache-2.0

package netpolicy

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// ClusterNetworkPolicy is policy.networking.k8s.io/v1beta1
// ClusterNetworkPolicy (sigs.k8s.io/network-policy-api), its standard
// channel's fields and the experimental ones: destinationNamedPort, which
// the compiler implements, and those it must see to refuse (nodes,
// domainNames).
type ClusterNetworkPolicy struct {
	Metadata ObjectMeta               `json:"metadata"`
	Spec     ClusterNetworkPolicySpec `json:"spec"`
	// Unknown are the spec's fields this agent does not know (a newer
	// API's), as the watch found them: reported, and the rules they sit
	// in fail closed.
	Unknown []string `json:"-"`
	// Generation is the object's metadata.generation: the version of its
	// spec, which a status condition observes.
	Generation int64 `json:"-"`
	// Implemented is the object's ImplementedCondition as its status
	// holds it; nil: none yet. It is not the policy: a change of it alone
	// changes no pod's policy (ClusterPolicyChange).
	Implemented *ClusterPolicyCondition `json:"-"`
}

// ImplementedCondition is the type of the condition the agents report on
// each ClusterNetworkPolicy's status: whether cni-usernet implements all
// of it. Domain-prefixed: other implementations report on the same object
// under their own types.
const ImplementedCondition = "cni-usernet.io/Implemented"

// ClusterPolicyCondition is a metav1.Condition of a ClusterNetworkPolicy's
// status, its type aside.
type ClusterPolicyCondition struct {
	Status, Reason, Message string
	ObservedGeneration      int64
	LastTransitionTime      time.Time
}

// ClusterNetworkPolicySpec is v1beta1 ClusterNetworkPolicySpec. Tier is
// Admin or Baseline; Priority 0 (first) to 1000.
type ClusterNetworkPolicySpec struct {
	Tier     string                            `json:"tier"`
	Priority int32                             `json:"priority"`
	Subject  ClusterNetworkPolicySubject       `json:"subject"`
	Ingress  []ClusterNetworkPolicyIngressRule `json:"ingress,omitempty"`
	Egress   []ClusterNetworkPolicyEgressRule  `json:"egress,omitempty"`
}

// ClusterNetworkPolicySubject is v1beta1 ClusterNetworkPolicySubject:
// exactly one of its fields.
type ClusterNetworkPolicySubject struct {
	Namespaces *LabelSelector `json:"namespaces,omitempty"`
	Pods       *NamespacedPod `json:"pods,omitempty"`
}

// NamespacedPod is v1beta1 NamespacedPod.
type NamespacedPod struct {
	NamespaceSelector LabelSelector `json:"namespaceSelector"`
	PodSelector       LabelSelector `json:"podSelector"`
}

// ClusterNetworkPolicyIngressRule is v1beta1 ClusterNetworkPolicyIngressRule.
type ClusterNetworkPolicyIngressRule struct {
	Name      string                         `json:"name,omitempty"`
	Action    string                         `json:"action"`
	From      []ClusterNetworkPolicyPeer     `json:"from"`
	Protocols []ClusterNetworkPolicyProtocol `json:"protocols,omitempty"`
}

// ClusterNetworkPolicyEgressRule is v1beta1 ClusterNetworkPolicyEgressRule.
type ClusterNetworkPolicyEgressRule struct {
	Name      string                         `json:"name,omitempty"`
	Action    string                         `json:"action"`
	To        []ClusterNetworkPolicyPeer     `json:"to"`
	Protocols []ClusterNetworkPolicyProtocol `json:"protocols,omitempty"`
}

// ClusterNetworkPolicyPeer is v1beta1 ClusterNetworkPolicyEgressPeer, whose
// fields include the ingress peer's: exactly one of them. Networks is
// egress only; Nodes and DomainNames are experimental, not implemented.
type ClusterNetworkPolicyPeer struct {
	Namespaces  *LabelSelector `json:"namespaces,omitempty"`
	Pods        *NamespacedPod `json:"pods,omitempty"`
	Networks    []string       `json:"networks,omitempty"`
	Nodes       *LabelSelector `json:"nodes,omitempty"`
	DomainNames []string       `json:"domainNames,omitempty"`
}

// ClusterNetworkPolicyProtocol is v1beta1 ClusterNetworkPolicyProtocol:
// exactly one of its fields. DestinationNamedPort (experimental) is a
// port of the destination pod by its name, whatever its protocol: the
// subject pod's for ingress, each peer pod's for egress.
type ClusterNetworkPolicyProtocol struct {
	TCP                  *ClusterNetworkPolicyPorts `json:"tcp,omitempty"`
	UDP                  *ClusterNetworkPolicyPorts `json:"udp,omitempty"`
	SCTP                 *ClusterNetworkPolicyPorts `json:"sctp,omitempty"`
	DestinationNamedPort string                     `json:"destinationNamedPort,omitempty"`
}

// ClusterNetworkPolicyPorts is v1beta1 ClusterNetworkPolicyProtocolTCP
// (UDP, SCTP): DestinationPort nil is every port.
type ClusterNetworkPolicyPorts struct {
	DestinationPort *ClusterNetworkPolicyPort `json:"destinationPort,omitempty"`
}

// ClusterNetworkPolicyPort is v1beta1 Port: a number or a range.
type ClusterNetworkPolicyPort struct {
	Number int32                          `json:"number,omitempty"`
	Range  *ClusterNetworkPolicyPortRange `json:"range,omitempty"`
}

// ClusterNetworkPolicyPortRange is v1beta1 PortRange.
type ClusterNetworkPolicyPortRange struct {
	Start int32 `json:"start"`
	End   int32 `json:"end"`
}

// The tiers of a ClusterNetworkPolicy.
const (
	tierAdmin    = "Admin"
	tierBaseline = "Baseline"
)

// parsedCNP is one ClusterNetworkPolicy: its subject checked for every
// pod, its rules resolved once, when it first selects a pod (they do not
// depend on the pod).
type parsedCNP struct {
	cnp      *ClusterNetworkPolicy
	name     string
	admin    bool
	priority int32
	// nsSel and podSel are the subject: the pods podSel selects in the
	// namespaces nsSel selects (podSel nil: every pod).
	nsSel, podSel *selector
	warnings      []Warning

	once sync.Once
	body *cnpBody
}

type cnpBody struct {
	ingress []cnpIngressRule
	egress  []policy.TierRule
	peers   []*peerSet
	// namedBlocks are the networks whose pods' named ports an egress
	// rule resolves (Deps).
	namedBlocks []policy.Peer
	warnings    []Warning
}

// cnpIngressRule is an ingress rule with its named ports left to resolve
// on each pod it is compiled for (the subject pod's ports).
type cnpIngressRule struct {
	rule  policy.TierRule
	named []namedPort
}

// on is r for a pod whose containers are containers: false when it
// matches nothing there (it names only ports the pod does not declare).
func (r *cnpIngressRule) on(containers []Container) (policy.TierRule, bool) {
	if len(r.named) == 0 {
		return r.rule, true
	}
	tr := r.rule
	if tr.Ports = withNamedPorts(r.rule.Ports, r.named, containers); len(tr.Ports) == 0 {
		return policy.TierRule{}, false
	}
	return tr, true
}

func parseCNP(cnp *ClusterNetworkPolicy, key string) *parsedCNP {
	p := &parsedCNP{cnp: cnp, name: cmp.Or(cnp.Metadata.Name, key), priority: cnp.Spec.Priority}
	for _, f := range cnp.Unknown {
		p.warn("unknown field %s: the rules that hold it fail closed", f)
	}
	switch cnp.Spec.Tier {
	case tierAdmin:
		p.admin = true
	case tierBaseline:
	default:
		// A tier this agent does not know is enforced as the Admin tier:
		// its Deny rules then deny whatever the other layers say, rather
		// than nothing.
		p.admin = true
		p.warn("unknown tier %q, enforced as the Admin tier", cnp.Spec.Tier)
	}
	nothing := &selector{nothing: true}
	sub := cnp.Spec.Subject
	switch {
	case sub.Namespaces != nil && sub.Pods == nil:
		s, err := newSelector(sub.Namespaces)
		if err != nil {
			p.warn("subject.namespaces selects no namespace: %v", err)
		}
		p.nsSel = &s
	case sub.Pods != nil && sub.Namespaces == nil:
		ns, err := newSelector(&sub.Pods.NamespaceSelector)
		if err != nil {
			p.warn("subject.pods.namespaceSelector selects no namespace: %v", err)
		}
		pod, err := newSelector(&sub.Pods.PodSelector)
		if err != nil {
			p.warn("subject.pods.podSelector selects no pod: %v", err)
		}
		p.nsSel, p.podSel = &ns, &pod
	default:
		p.warn("subject needs exactly one of namespaces and pods: selects no pod")
		p.nsSel = nothing
	}
	return p
}

func (p *parsedCNP) warn(format string, args ...any) {
	p.warnings = append(p.warnings, Warning{Object: "clusternetworkpolicy/" + p.name, Message: fmt.Sprintf(format, args...)})
}

// selects says whether the policy applies to a pod with labels in a
// namespace with nsLabels.
func (p *parsedCNP) selects(labels, nsLabels map[string]string) bool {
	return p.nsSel.matches(nsLabels) && (p.podSel == nil || p.podSel.matches(labels))
}

func (p *parsedCNP) resolved(c *Compiler) *cnpBody {
	p.once.Do(func() { p.body = c.resolveCNP(p) })
	return p.body
}

func (c *Compiler) resolveCNP(p *parsedCNP) *cnpBody {
	b := &cnpBody{}
	warn := func(format string, args ...any) {
		b.warnings = append(b.warnings, Warning{Object: "clusternetworkpolicy/" + p.name, Message: fmt.Sprintf(format, args...)})
	}
	for i, r := range p.cnp.Spec.Ingress {
		where := fmt.Sprintf("ingress rule %d", i)
		if tr, named, _, ok := c.cnpRule(p.name, r.Name, r.Action, r.From, r.Protocols, false, where, warn, b); ok {
			b.ingress = append(b.ingress, cnpIngressRule{rule: tr, named: named})
		}
	}
	for i, r := range p.cnp.Spec.Egress {
		where := fmt.Sprintf("egress rule %d", i)
		tr, named, peers, ok := c.cnpRule(p.name, r.Name, r.Action, r.To, r.Protocols, true, where, warn, b)
		switch {
		case !ok:
		case len(named) == 0:
			b.egress = append(b.egress, tr)
		default:
			// The rule's numbered ports as one rule, its named ports
			// as one rule per port number they resolve to on the
			// peers: in a row and with the same action, they match
			// what the one rule matches.
			if len(tr.Ports) > 0 {
				b.egress = append(b.egress, tr)
			}
			for _, g := range c.namedEgress(p.name, peers, named) {
				b.egress = append(b.egress, policy.TierRule{Policy: tr.Policy, Name: tr.Name, Action: tr.Action, Peers: g.Peers, Ports: g.Ports})
			}
			b.namedBlocks = append(b.namedBlocks, peers.blocks...)
		}
	}
	return b
}

// cnpRule resolves one rule; false when it matches nothing. Its named
// ports are left to resolve on the destination pods, where the rule then
// matches on them and on tr.Ports (none: only on them). A part the agent
// does not implement fails closed as the API asks: an Accept rule does
// not match through it, a Deny or Pass rule becomes a Deny of
// everything.
func (c *Compiler) cnpRule(pol, name, action string, peers []ClusterNetworkPolicyPeer, protos []ClusterNetworkPolicyProtocol,
	egress bool, where string, warn func(string, ...any), b *cnpBody) (tr policy.TierRule, named []namedPort, ps *peerSet, ok bool) {
	if name != "" {
		where += " (" + name + ")"
	}
	tr = policy.TierRule{Policy: pol, Name: name, Action: policy.Action(action)}
	switch tr.Action {
	case policy.Accept, policy.Deny, policy.Pass:
	default:
		warn("%s: unknown action %q, enforced as Deny of everything", where, action)
		return policy.TierRule{Policy: pol, Name: name, Action: policy.Deny}, nil, nil, true
	}
	failClosed := func(why string) (policy.TierRule, []namedPort, *peerSet, bool) {
		if tr.Action == policy.Accept {
			warn("%s: %s, matches nothing", where, why)
			return tr, nil, nil, false
		}
		warn("%s: %s, enforced as Deny of everything", where, why)
		return policy.TierRule{Policy: pol, Name: name, Action: policy.Deny}, nil, nil, true
	}
	if len(peers) == 0 {
		return failClosed("no peer")
	}
	var npPeers []NetworkPolicyPeer
	for i, pe := range peers {
		set := 0
		for _, b := range []bool{pe.Namespaces != nil, pe.Pods != nil, len(pe.Networks) > 0, pe.Nodes != nil, len(pe.DomainNames) > 0} {
			if b {
				set++
			}
		}
		switch {
		case set != 1:
			return failClosed(fmt.Sprintf("peer %d has %d fields, wants exactly one", i, set))
		case pe.Nodes != nil:
			return failClosed(fmt.Sprintf("peer %d: nodes (experimental) is not implemented", i))
		case len(pe.DomainNames) > 0:
			return failClosed(fmt.Sprintf("peer %d: domainNames (experimental) is not implemented", i))
		case len(pe.Networks) > 0 && !egress:
			return failClosed(fmt.Sprintf("peer %d: networks is an egress peer", i))
		case pe.Namespaces != nil:
			npPeers = append(npPeers, NetworkPolicyPeer{NamespaceSelector: pe.Namespaces, PodSelector: &LabelSelector{}})
		case pe.Pods != nil:
			npPeers = append(npPeers, NetworkPolicyPeer{NamespaceSelector: &pe.Pods.NamespaceSelector, PodSelector: &pe.Pods.PodSelector})
		default:
			for _, n := range pe.Networks {
				npPeers = append(npPeers, NetworkPolicyPeer{IPBlock: &IPBlock{CIDR: n}})
			}
		}
	}
	for i, pr := range protos {
		set := 0
		for _, b := range []bool{pr.TCP != nil, pr.UDP != nil, pr.SCTP != nil, pr.DestinationNamedPort != ""} {
			if b {
				set++
			}
		}
		switch {
		case set != 1:
			return failClosed(fmt.Sprintf("protocol %d has %d fields, wants exactly one", i, set))
		case pr.DestinationNamedPort != "":
			// Whatever the protocol the pod declares it with.
			named = append(named, namedPort{name: pr.DestinationNamedPort})
			continue
		}
		proto, ports := policy.TCP, pr.TCP
		switch {
		case pr.UDP != nil:
			proto, ports = policy.UDP, pr.UDP
		case pr.SCTP != nil:
			proto, ports = policy.SCTP, pr.SCTP
		}
		if ports.DestinationPort == nil {
			tr.Ports = append(tr.Ports, policy.PortRange{Protocol: proto})
			continue
		}
		first, last := ports.DestinationPort.Number, ports.DestinationPort.Number
		if rg := ports.DestinationPort.Range; rg != nil {
			if first != 0 {
				return failClosed(fmt.Sprintf("protocol %d: both a port number and a range", i))
			}
			first, last = rg.Start, rg.End
		}
		if first < 1 || last > 65535 || last < first {
			return failClosed(fmt.Sprintf("protocol %d: port range %d-%d out of 1-65535", i, first, last))
		}
		tr.Ports = append(tr.Ports, policy.PortRange{Protocol: proto, First: uint16(first), Last: uint16(last)})
	}
	tr.Ports = sortPorts(tr.Ports)
	slices.SortFunc(named, func(a, b namedPort) int { return strings.Compare(a.name, b.name) })
	named = slices.Compact(named)
	// The peers as NetworkPolicy peers: a selector or a CIDR the API would
	// refuse selects nothing (resolvePeers warns), which for a Deny rule
	// leaves open what it would have closed: fail closed.
	before := len(b.warnings)
	ps = c.resolvePeers("", npPeers, where, func(f string, a ...any) { warn(f, a...) })
	b.peers = append(b.peers, ps)
	if len(b.warnings) > before && tr.Action != policy.Accept {
		return failClosed("a peer the API would refuse")
	}
	if len(ps.prefixes) == 0 {
		return tr, nil, nil, false // selects no pod now: matches nothing
	}
	tr.Peers = ps.prefixes
	return tr, named, ps, true
}

// clusterPolicies are the snapshot's ClusterNetworkPolicies in the order
// a connection meets them: the Admin tier, then the Baseline tier, each
// by priority, then by name (the API leaves the order of equal
// priorities to the implementation: by name, it is the same on every
// node).
func clusterPolicies(snap *Snapshot) []*parsedCNP {
	out := make([]*parsedCNP, 0, len(snap.ClusterPolicies))
	for key, cnp := range snap.ClusterPolicies {
		if cnp != nil {
			out = append(out, parseCNP(cnp, key))
		}
	}
	slices.SortFunc(out, func(a, b *parsedCNP) int {
		ta, tb := 0, 0
		if !a.admin {
			ta = 1
		}
		if !b.admin {
			tb = 1
		}
		return cmp.Or(cmp.Compare(ta, tb), cmp.Compare(a.priority, b.priority), strings.Compare(a.name, b.name))
	})
	return out
}

// TierCounts are how many ClusterNetworkPolicies of each tier a
// compilation saw, for the agent's status.
func (c *Compiler) TierCounts() (admin, baseline int) {
	for _, p := range c.cnps {
		if p.admin {
			admin++
		} else {
			baseline++
		}
	}
	return admin, baseline
}

// Unsupported are the parts of p the compiler does not implement or does
// not know, each with where it is: the rules that hold them fail closed.
// Selectors and CIDRs the API would refuse are not among them (the
// compiler's warnings tell of those, per pod).
func (p *ClusterNetworkPolicy) Unsupported() []string {
	out := slices.Clone(p.Unknown)
	if p.Spec.Tier != tierAdmin && p.Spec.Tier != tierBaseline {
		out = append(out, fmt.Sprintf("spec.tier %q", p.Spec.Tier))
	}
	check := func(where, action string, peers []ClusterNetworkPolicyPeer) {
		switch policy.Action(action) {
		case policy.Accept, policy.Deny, policy.Pass:
		default:
			out = append(out, fmt.Sprintf("%s.action %q", where, action))
		}
		for i, pe := range peers {
			if pe.Nodes != nil {
				out = append(out, fmt.Sprintf("%s peer %d: nodes", where, i))
			}
			if len(pe.DomainNames) > 0 {
				out = append(out, fmt.Sprintf("%s peer %d: domainNames", where, i))
			}
		}
	}
	for i, r := range p.Spec.Ingress {
		check(fmt.Sprintf("spec.ingress[%d]", i), r.Action, r.From)
	}
	for i, r := range p.Spec.Egress {
		check(fmt.Sprintf("spec.egress[%d]", i), r.Action, r.To)
	}
	return out
}
