package netpolicy

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// parsedPolicy is one NetworkPolicy: what it selects is checked for every
// pod; its rules are resolved (peers, ports) once, when it first selects a
// pod, and that body is then compiled into each pod's policy.
type parsedPolicy struct {
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
	// peers are the rules' resolved peers, those that select nothing
	// now included (a pod may come that they select); namedAll and
	// namedBlocks the destinations of egress named ports other than
	// selected pods: every pod, the pods in these blocks. A pod's
	// change matters to the pods this policy selects when it is, was or
	// becomes one of them (Deps).
	peers       []*peerSet
	namedAll    bool
	namedBlocks []policy.Peer
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

func parsePolicy(np *NetworkPolicy, key string) *parsedPolicy {
	cp := &parsedPolicy{np: np, name: objectKey(np.Metadata, key)}
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

func (cp *parsedPolicy) warn(format string, args ...any) {
	cp.warnings = append(cp.warnings, Warning{Object: cp.name, Message: fmt.Sprintf(format, args...)})
}

// on is r for a pod whose containers are containers: false when it allows
// nothing (every port it names is a named port the pod does not declare).
func (r *ingressRule) on(containers []Container, name string) (policy.Rule, bool) {
	rule := policy.Rule{Policy: name, Peers: r.peers}
	if r.allPorts {
		return rule, true
	}
	ports := withNamedPorts(r.ports, r.named, containers)
	if len(ports) == 0 {
		return policy.Rule{}, false
	}
	rule.Ports = ports
	return rule, true
}

// withNamedPorts is ports and the named ports resolved on a pod whose
// containers are containers (ports itself when there are none to
// resolve; a name the pod does not declare adds nothing).
func withNamedPorts(ports []policy.PortRange, named []namedPort, containers []Container) []policy.PortRange {
	if len(named) == 0 {
		return ports
	}
	ports = slices.Clone(ports)
	for _, n := range named {
		if pr, ok := containerPort(containers, n); ok {
			ports = append(ports, pr)
		}
	}
	return sortPorts(ports)
}

// containerPort resolves a named port on a pod's containers: the port of
// that name and protocol, or of that name alone when n has no protocol
// (a ClusterNetworkPolicy's: the name is unique in a pod).
func containerPort(containers []Container, n namedPort) (policy.PortRange, bool) {
	for _, ctr := range containers {
		for _, p := range ctr.Ports {
			proto := policy.Protocol(cmp.Or(p.Protocol, string(policy.TCP)))
			if p.Name == n.name && (n.protocol == "" || proto == n.protocol) && p.ContainerPort > 0 && p.ContainerPort <= 65535 {
				port := uint16(p.ContainerPort)
				return policy.PortRange{Protocol: proto, First: port, Last: port}, true
			}
		}
	}
	return policy.PortRange{}, false
}

func (cp *parsedPolicy) resolved(c *Compiler) *policyBody {
	cp.once.Do(func() { cp.body = c.resolveBody(cp) })
	return cp.body
}

func (c *Compiler) resolveBody(cp *parsedPolicy) *policyBody {
	b := &policyBody{}
	warn := func(format string, args ...any) {
		b.warnings = append(b.warnings, Warning{Object: cp.name, Message: fmt.Sprintf(format, args...)})
	}
	ns := cp.np.Metadata.Namespace
	if cp.ingress {
		for i, rule := range cp.np.Spec.Ingress {
			where := fmt.Sprintf("ingress rule %d", i)
			peers := c.resolvePeers(ns, rule.From, where, warn)
			b.peers = append(b.peers, peers)
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
			b.peers = append(b.peers, peers)
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
				b.namedAll = b.namedAll || peers.all
				b.namedBlocks = append(b.namedBlocks, peers.blocks...)
			}
		}
	}
	return b
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
