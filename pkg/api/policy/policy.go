// Package policy is a pod's compiled network policy: the plain rules the
// node agent computes from the Kubernetes API (pkg/agent/netpolicy) and the
// pod's stack enforces on its wire leg, with nothing of Kubernetes left in
// them (no selectors, no named ports, no namespaces): addresses, protocols
// and port ranges only.
//
// The agent hands a PodPolicy to the stack over its control socket (PUT
// /policy) and keeps a copy beside the stack's spec (File), which a
// restarted stack loads before its link is up, so that it comes back closed
// where it was closed.
package policy

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
)

// FormatVersion is the version of PodPolicy's JSON encoding. A stack refuses
// a policy of a version it does not know (the agent is newer than the
// stack), and says so: the agent then restarts the stack with its own
// binary rather than leave a pod open.
//
// Version 2 added the ClusterNetworkPolicy tiers (Direction.Admin and
// Baseline), which a stack that reads version 1 would skip, leaving open
// what an Admin tier denies. The agent writes version 1 for a policy
// without them (Version), so that stacks that read only version 1 keep
// taking the policies they can enforce.
const FormatVersion = 2

// tierlessVersion is the version of a policy without ClusterNetworkPolicy
// rules: what version-1 stacks read.
const tierlessVersion = 1

// NeededVersion is the format version p needs: FormatVersion when it holds
// ClusterNetworkPolicy rules, 1 otherwise.
func (p *PodPolicy) NeededVersion() int {
	if p.Ingress.HasTiers() || p.Egress.HasTiers() {
		return FormatVersion
	}
	return tierlessVersion
}

// Protocol is an IP protocol number as Kubernetes names them.
type Protocol string

// The protocols a rule's port can name. ICMP has no ports: it is allowed by
// a rule that names no ports, as with the kernel-based implementations.
const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// Number is p's IP protocol number; 0 for an unknown one.
func (p Protocol) Number() uint8 {
	switch p {
	case TCP:
		return 6
	case UDP:
		return 17
	case SCTP:
		return 132
	}
	return 0
}

// PortRange is one protocol's ports First..Last (inclusive). First 0 is
// every port of the protocol (a NetworkPolicyPort without a port).
type PortRange struct {
	Protocol Protocol `json:"protocol"`
	First    uint16   `json:"first,omitempty"`
	Last     uint16   `json:"last,omitempty"`
}

// Peer is a block of addresses less the blocks in Except.
type Peer struct {
	CIDR   netip.Prefix   `json:"cidr"`
	Except []netip.Prefix `json:"except,omitempty"`
}

// Rule allows traffic between the pod and any of Peers on any of Ports.
// An empty Peers is every address; an empty Ports is every protocol and
// port, ICMP included.
type Rule struct {
	// Policy is the NetworkPolicy the rule came from ("namespace/name"),
	// for logs and counters.
	Policy string      `json:"policy"`
	Peers  []Peer      `json:"peers,omitempty"`
	Ports  []PortRange `json:"ports,omitempty"`
}

// Direction is the policy of one direction of the pod's traffic.
type Direction struct {
	// Isolated is whether any policy selects the pod for this direction.
	// A direction that is not isolated allows everything, Rules or not.
	Isolated bool `json:"isolated,omitempty"`
	// Policies names the policies that isolate the pod in this direction
	// ("namespace/name", sorted): the label of a denial's counter.
	Policies []string `json:"policies,omitempty"`
	// Rules is the union of what those policies allow.
	Rules []Rule `json:"rules,omitempty"`
	// Admin and Baseline are the ClusterNetworkPolicy rules of the pod in
	// this direction, each tier's in the order they are asked (by the
	// policy's priority, then its name, then the rule's place in it). A
	// connection meets the Admin tier, then NetworkPolicy (Isolated,
	// Rules), then the Baseline tier, then the default, which allows:
	// the first rule that matches in a tier decides (Accept, Deny) or
	// hands over to the next layer (Pass); a tier where no rule matches
	// hands over too. NetworkPolicy decides for every connection of a
	// direction it isolates.
	Admin    []TierRule `json:"admin,omitempty"`
	Baseline []TierRule `json:"baseline,omitempty"`
}

// Backend is one endpoint a Service port leads to.
type Backend struct {
	Addr netip.AddrPort `json:"addr"`
}

// Service is a Service's virtual address and port, and the endpoints
// behind it. A stack whose egress is isolated resolves a connection to
// VIP itself, to a backend its egress rules allow, so that the verdict is
// taken for the backend actually reached (kube-proxy would pick one after
// the packet left the stack, unseen).
type Service struct {
	// Name is "namespace/name:port-name", for logs.
	Name     string         `json:"name,omitempty"`
	Protocol Protocol       `json:"protocol"`
	VIP      netip.AddrPort `json:"vip"`
	Backends []Backend      `json:"backends,omitempty"`
}

// PodPolicy is everything a pod's stack needs to enforce the pod's policy.
// The zero value allows everything (no policy selects the pod).
type PodPolicy struct {
	// Version is FormatVersion of the agent that made it.
	Version int `json:"version"`
	// Generation increases with every change the agent makes to any pod's
	// policy on the node; a stack ignores a push older than what it has.
	Generation uint64    `json:"generation"`
	Ingress    Direction `json:"ingress"`
	Egress     Direction `json:"egress"`
	// Node is the node's own addresses: connections from them are always
	// allowed in (kubelet's probes, hostNetwork pods), as Kubernetes
	// requires, whatever Ingress says.
	Node []netip.Addr `json:"node,omitempty"`
	// Services are the cluster's Service VIPs with their backends, sent
	// only when Egress can deny (isolated, or ClusterNetworkPolicy rules).
	Services []Service `json:"services,omitempty"`
}

// Closed is the policy of a pod whose own policy is not known yet: both
// directions isolated, nothing allowed but the node. A stack started with
// policy enforcement on holds it until the agent's first push.
func Closed(node []netip.Addr) *PodPolicy {
	return &PodPolicy{
		Version: FormatVersion,
		Ingress: Direction{Isolated: true, Policies: []string{"(pending)"}},
		Egress:  Direction{Isolated: true, Policies: []string{"(pending)"}},
		Node:    node,
	}
}

// Validate reports the first problem with p.
func (p *PodPolicy) Validate() error {
	if p.Version != FormatVersion && p.Version != tierlessVersion {
		return fmt.Errorf("policy format version %d, this stack reads %d and %d", p.Version, tierlessVersion, FormatVersion)
	}
	if p.Version < p.NeededVersion() {
		return fmt.Errorf("policy format version %d holds ClusterNetworkPolicy rules, which need version %d", p.Version, p.NeededVersion())
	}
	for _, d := range []struct {
		name string
		d    *Direction
	}{{"ingress", &p.Ingress}, {"egress", &p.Egress}} {
		for i, r := range d.d.Rules {
			if err := r.validate(); err != nil {
				return fmt.Errorf("%s rule %d (%s): %w", d.name, i, r.Policy, err)
			}
		}
		for tier, rules := range map[Tier][]TierRule{TierAdmin: d.d.Admin, TierBaseline: d.d.Baseline} {
			for i, r := range rules {
				if err := r.validate(); err != nil {
					return fmt.Errorf("%s %s tier rule %d (%s): %w", d.name, tier, i, r.Policy, err)
				}
			}
		}
	}
	for _, s := range p.Services {
		if s.Protocol.Number() == 0 {
			return fmt.Errorf("service %s: unknown protocol %q", s.Name, s.Protocol)
		}
		if !s.VIP.IsValid() {
			return fmt.Errorf("service %s: no virtual address", s.Name)
		}
		for _, b := range s.Backends {
			if !b.Addr.IsValid() {
				return fmt.Errorf("service %s: a backend without an address", s.Name)
			}
		}
	}
	return nil
}

func (r *Rule) validate() error {
	for _, pr := range r.Ports {
		if pr.Protocol.Number() == 0 {
			return fmt.Errorf("unknown protocol %q", pr.Protocol)
		}
		if pr.First == 0 && pr.Last != 0 || pr.Last != 0 && pr.Last < pr.First {
			return fmt.Errorf("bad port range %d-%d", pr.First, pr.Last)
		}
	}
	for _, peer := range r.Peers {
		if !peer.CIDR.IsValid() {
			return fmt.Errorf("peer without a CIDR")
		}
		for _, e := range peer.Except {
			if !e.IsValid() || e.Addr().Is4() != peer.CIDR.Addr().Is4() {
				return fmt.Errorf("except %s does not fit peer %s", e, peer.CIDR)
			}
		}
	}
	return nil
}

// Marshal encodes p for the control socket and the policy file.
func Marshal(p *PodPolicy) ([]byte, error) { return json.Marshal(p) }

// Unmarshal decodes and validates a policy.
func Unmarshal(b []byte) (*PodPolicy, error) {
	var p PodPolicy
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("decoding policy: %w", err)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// Equal reports whether a and b enforce the same thing (Generation aside).
func Equal(a, b *PodPolicy) bool {
	ja, _ := json.Marshal(withoutGeneration(a))
	jb, _ := json.Marshal(withoutGeneration(b))
	return slices.Equal(ja, jb)
}

func withoutGeneration(p *PodPolicy) PodPolicy {
	c := *p
	c.Generation = 0
	return c
}
