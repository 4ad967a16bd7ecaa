// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
)

// Action is what a ClusterNetworkPolicy rule does with the connections it
// matches.
type Action string

// The actions of policy.networking.k8s.io ClusterNetworkPolicy rules.
const (
	// Accept allows the connection: no later rule of any layer is asked.
	Accept Action = "Accept"
	// Deny drops it: no later rule of any layer is asked.
	Deny Action = "Deny"
	// Pass skips the rest of the rule's tier: the next layer decides
	// (NetworkPolicy after the Admin tier, the default after Baseline).
	Pass Action = "Pass"
)

// Tier names a layer of the verdict, in the order a connection meets
// them: the Admin tier, NetworkPolicy, the Baseline tier, then the
// default (allow).
type Tier string

// The layers that can deny a connection.
const (
	TierAdmin         Tier = "Admin"
	TierNetworkPolicy Tier = "NetworkPolicy"
	TierBaseline      Tier = "Baseline"
)

// TierRule is one ClusterNetworkPolicy rule, resolved to addresses and
// ports like Rule: Action applies to a connection with any of Peers on
// any of Ports. An empty Peers is every address (the compiler writes it
// only for a rule that must match everything); an empty Ports is every
// protocol and port, ICMP included.
type TierRule struct {
	// Policy is the ClusterNetworkPolicy's name; Name the rule's, when it
	// has one. Both for denials and logs.
	Policy string      `json:"policy"`
	Name   string      `json:"name,omitempty"`
	Action Action      `json:"action"`
	Peers  []Peer      `json:"peers,omitempty"`
	Ports  []PortRange `json:"ports,omitempty"`
}

func (r *TierRule) validate() error {
	switch r.Action {
	case Accept, Deny, Pass:
	default:
		return fmt.Errorf("unknown action %q", r.Action)
	}
	return (&Rule{Policy: r.Policy, Peers: r.Peers, Ports: r.Ports}).validate()
}

// HasTiers reports whether d holds any ClusterNetworkPolicy rule.
func (d *Direction) HasTiers() bool { return len(d.Admin) > 0 || len(d.Baseline) > 0 }

// tierMatcher is one TierRule compiled.
type tierMatcher struct {
	action Action
	// label is the rule's policy: a denial's Policies.
	label string
	peers *addrSet
	// ports are the rule's ports by protocol number; nil: every
	// protocol and port.
	ports []portSpanProto
	// denied counts the rule's denials (Deny rules), shared by the
	// policy's rules of the direction; set by Attach.
	denied *atomic.Uint64
}

type portSpanProto struct {
	proto       uint8
	first, last uint16 // first 0: every port
}

func compileTier(rules []TierRule) []tierMatcher {
	out := make([]tierMatcher, 0, len(rules))
	for i := range rules {
		r := &rules[i]
		var b addrSetBuilder
		b.addPeers(r.Peers)
		tm := tierMatcher{action: r.Action, label: r.Policy, peers: b.build()}
		for _, pr := range r.Ports {
			last := pr.Last
			if last == 0 {
				last = pr.First
			}
			tm.ports = append(tm.ports, portSpanProto{pr.Protocol.Number(), pr.First, last})
		}
		out = append(out, tm)
	}
	return out
}

func (t *tierMatcher) matches(peer netip.Addr, proto uint8, port uint16) bool {
	if !t.peers.contains(peer) {
		return false
	}
	if t.ports == nil {
		return true
	}
	return slices.ContainsFunc(t.ports, func(p portSpanProto) bool {
		return p.proto == proto && (p.first == 0 || p.first <= port && port <= p.last)
	})
}

// tierVerdict walks a tier's rules in order: the first that matches
// decides (Accept or Deny) or hands over to the next layer (Pass, or no
// rule matched: decided false).
func tierVerdict(rules []tierMatcher, peer netip.Addr, proto uint8, port uint16) (decided, allowed bool, by *tierMatcher) {
	for i := range rules {
		t := &rules[i]
		if !t.matches(peer, proto, port) {
			continue
		}
		switch t.action {
		case Accept:
			return true, true, nil
		case Deny:
			return true, false, t
		}
		return false, false, nil // Pass
	}
	return false, false, nil
}

// Layer is the layer whose rule a denial for r is: the tier of a
// ClusterNetworkPolicy's Deny, NetworkPolicy when no rule of the
// isolating policies admits the flow, empty for a flow denied before any
// layer was asked (a packet that cannot be judged, a Service whose every
// backend is denied).
func (r Reason) Layer() Tier {
	switch r {
	case AdminDeny:
		return TierAdmin
	case BaselineDeny:
		return TierBaseline
	case NoRuleAdmits:
		return TierNetworkPolicy
	}
	return ""
}

// Layers counts the policies of each layer in m, nil when no
// ClusterNetworkPolicy applies (the pod has NetworkPolicies alone).
func (m *Matcher) Layers() *LayerCounts { return m.layers }

func layersOf(p *PodPolicy) *LayerCounts {
	if !p.Ingress.HasTiers() && !p.Egress.HasTiers() {
		return nil
	}
	admin, np, base := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, d := range []*Direction{&p.Ingress, &p.Egress} {
		for _, r := range d.Admin {
			admin[r.Policy] = true
		}
		for _, r := range d.Baseline {
			base[r.Policy] = true
		}
		if d.Isolated {
			for _, n := range d.Policies {
				np[n] = true
			}
		}
	}
	return &LayerCounts{Admin: len(admin), NetworkPolicy: len(np), Baseline: len(base)}
}
