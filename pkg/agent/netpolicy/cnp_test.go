// SPDX-License-Identifier: Apache-2.0

package netpolicy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

func cnp(name, tier string, prio int32, subject ClusterNetworkPolicySubject, in []ClusterNetworkPolicyIngressRule, eg []ClusterNetworkPolicyEgressRule) *ClusterNetworkPolicy {
	return &ClusterNetworkPolicy{Metadata: ObjectMeta{Name: name},
		Spec: ClusterNetworkPolicySpec{Tier: tier, Priority: prio, Subject: subject, Ingress: in, Egress: eg}}
}

func nsSubject(ns string) ClusterNetworkPolicySubject {
	return ClusterNetworkPolicySubject{Namespaces: labels("ns", ns)}
}

func fromNS(action string, ns ...string) ClusterNetworkPolicyIngressRule {
	r := ClusterNetworkPolicyIngressRule{Action: action}
	for _, n := range ns {
		sel := &LabelSelector{}
		if n != "" {
			sel = labels("ns", n)
		}
		r.From = append(r.From, ClusterNetworkPolicyPeer{Namespaces: sel})
	}
	return r
}

func addCNPs(s *Snapshot, cs ...*ClusterNetworkPolicy) {
	if s.ClusterPolicies == nil {
		s.ClusterPolicies = map[string]*ClusterNetworkPolicy{}
	}
	for _, c := range cs {
		s.ClusterPolicies[c.Metadata.Name] = c
	}
}

// checkStack compares the reachability the stacks' own matchers give with
// t, on TCP port, over both families: the verdict with every layer, as
// the stacks take it.
func checkStack(tb testing.TB, ps map[string]*policy.PodPolicy, port uint16, t truth) {
	tb.Helper()
	checkStackOn(tb, ps, policy.ProtoTCP, port, t)
}

// checkStackOn is checkStack on IP protocol proto.
func checkStackOn(tb testing.TB, ps map[string]*policy.PodPolicy, proto uint8, port uint16, t truth) {
	tb.Helper()
	ms := map[string]*policy.Matcher{}
	for k, p := range ps {
		m, err := policy.Compile(p)
		if err != nil {
			tb.Fatalf("%s: %v", k, err)
		}
		ms[k] = m
	}
	var bad []string
	for _, from := range allPods() {
		for _, to := range allPods() {
			if from == to {
				continue
			}
			fns, fpod, _ := strings.Cut(from, "/")
			tns, tpod, _ := strings.Cut(to, "/")
			for _, fam := range []func(string, string) netip.Addr{podAddr4, podAddr6} {
				src, dst := fam(fns, fpod), fam(tns, tpod)
				eg, _ := ms[from].Allow(policy.Egress, dst, proto, port)
				in, _ := ms[to].Allow(policy.Ingress, src, proto, port)
				if got, want := eg && in, t[[2]string{from, to}]; got != want {
					bad = append(bad, fmt.Sprintf("%s -> %s %s proto %d port %d: got %s, want %s", from, to, dst, proto, port, boolStr(got), boolStr(want)))
				}
			}
		}
	}
	if len(bad) > 0 {
		tb.Errorf("reachability differs in %d probes:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}

func boolStr(b bool) string {
	if b {
		return "reachable"
	}
	return "denied"
}

// TestAdminDenyBeatsNetworkPolicy: a tenant's NetworkPolicy that allows
// every ingress cannot open what an Admin tier Deny closes.
func TestAdminDenyBeatsNetworkPolicy(t *testing.T) {
	s := xyz()
	addPolicies(s, netpol("x", "allow-all", NetworkPolicySpec{PodSelector: LabelSelector{},
		Ingress: []NetworkPolicyIngressRule{{}}}))
	addCNPs(s, cnp("no-y-into-x", tierAdmin, 10, nsSubject("x"), []ClusterNetworkPolicyIngressRule{fromNS("Deny", "y")}, nil))
	ps, _ := compileAll(t, s)
	checkStack(t, ps, 80, newTruth(true).set("y/", "x/", false))
	if ps["x/a"].Version != policy.FormatVersion || len(ps["x/a"].Ingress.Admin) != 1 || ps["y/a"].Ingress.HasTiers() {
		t.Errorf("x/a must carry the Admin rule (version %d), y/a none: %+v / %+v", ps["x/a"].Version, ps["x/a"].Ingress, ps["y/a"].Ingress)
	}
}

// TestBaselineDenyYieldsToNetworkPolicy: a Baseline Deny of every ingress
// holds where no NetworkPolicy isolates a pod; where one does, its allow
// stands (and its own isolation denies the rest).
func TestBaselineDenyYieldsToNetworkPolicy(t *testing.T) {
	s := xyz()
	addPolicies(s, netpol("x", "a-from-y", NetworkPolicySpec{PodSelector: *labels("pod", "a"),
		Ingress: []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "y")}}}}}))
	all := ClusterNetworkPolicySubject{Namespaces: &LabelSelector{}}
	addCNPs(s, cnp("default-deny", tierBaseline, 0, all, []ClusterNetworkPolicyIngressRule{fromNS("Deny", "")}, nil))
	ps, _ := compileAll(t, s)
	checkStack(t, ps, 80, newTruth(false).set("y/", "x/a", true))
}

// TestPassGoesToNetworkPolicy: an Admin Pass skips the tier's later Deny
// and hands the connection to NetworkPolicy, which decides for the pods it
// isolates; the others get the default.
func TestPassGoesToNetworkPolicy(t *testing.T) {
	s := xyz()
	addPolicies(s, netpol("x", "a-from-y-b", NetworkPolicySpec{PodSelector: *labels("pod", "a"),
		Ingress: []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "y"), PodSelector: labels("pod", "b")}}}}}))
	addCNPs(s,
		cnp("pass-y", tierAdmin, 10, nsSubject("x"), []ClusterNetworkPolicyIngressRule{fromNS("Pass", "y")}, nil),
		cnp("deny-all", tierAdmin, 20, nsSubject("x"), []ClusterNetworkPolicyIngressRule{fromNS("Deny", "")}, nil),
	)
	ps, _ := compileAll(t, s)
	// Into x: only y passes; x/a then admits y/b alone (NetworkPolicy),
	// x/b and x/c are not isolated (the default).
	want := newTruth(true).set("", "x/", false).set("y/", "x/b", true).set("y/", "x/c", true).set("y/b", "x/a", true)
	checkStack(t, ps, 80, want)
}

// TestAdminPriority: within the Admin tier the lower priority decides,
// whatever the policies' names; an Admin Accept also opens what a
// NetworkPolicy isolates.
func TestAdminPriority(t *testing.T) {
	for _, c := range []struct {
		name                 string
		denyPrio, acceptPrio int32
		want                 bool
	}{
		{"deny first", 5, 10, false},
		{"accept first", 10, 5, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := xyz()
			addPolicies(s, netpol("x", "deny-ingress", NetworkPolicySpec{PodSelector: LabelSelector{}, PolicyTypes: []string{"Ingress"}}))
			addCNPs(s,
				// Names in the opposite order of the priorities.
				cnp("a-accept", tierAdmin, c.acceptPrio, nsSubject("x"), []ClusterNetworkPolicyIngressRule{fromNS("Accept", "y")}, nil),
				cnp("b-deny", tierAdmin, c.denyPrio, nsSubject("x"), []ClusterNetworkPolicyIngressRule{fromNS("Deny", "y")}, nil),
			)
			ps, _ := compileAll(t, s)
			checkStack(t, ps, 80, newTruth(true).set("", "x/", false).set("y/", "x/", c.want))
		})
	}
}

// TestClusterPolicyEgressNetworksAndPorts: an egress Deny to a network on
// one TCP port leaves the other ports, and Services whose backends it
// denies carry only the others.
func TestClusterPolicyEgressNetworksAndPorts(t *testing.T) {
	s := xyz()
	addCNPs(s, cnp("no-y-80", tierAdmin, 1, ClusterNetworkPolicySubject{Pods: &NamespacedPod{PodSelector: *labels("pod", "a")}}, nil,
		[]ClusterNetworkPolicyEgressRule{{Action: "Deny",
			To:        []ClusterNetworkPolicyPeer{{Networks: []string{"10.2.0.0/16", "fd00:2::/64"}}},
			Protocols: []ClusterNetworkPolicyProtocol{{TCP: &ClusterNetworkPolicyPorts{DestinationPort: &ClusterNetworkPolicyPort{Range: &ClusterNetworkPolicyPortRange{Start: 79, End: 80}}}}}}}))
	ps, _ := compileAll(t, s)
	checkStack(t, ps, 80, newTruth(true).set("x/a", "y/", false).set("y/a", "y/", false).set("z/a", "y/", false))
	checkStack(t, ps, 81, newTruth(true))
}

// TestClusterPolicyFailsClosed: what the agent does not implement is
// reported, and fails closed as the API asks: a Deny (or Pass) rule that
// holds it denies everything, an Accept rule matches nothing.
func TestClusterPolicyFailsClosed(t *testing.T) {
	s := xyz()
	nodes := ClusterNetworkPolicyEgressRule{Action: "Pass", To: []ClusterNetworkPolicyPeer{{Nodes: &LabelSelector{}}}}
	domains := ClusterNetworkPolicyEgressRule{Action: "Accept", To: []ClusterNetworkPolicyPeer{{DomainNames: []string{"example.com"}}}}
	addCNPs(s,
		cnp("experimental", tierAdmin, 1, nsSubject("x"), nil, []ClusterNetworkPolicyEgressRule{domains, nodes}),
	)
	newer := cnp("newer", tierBaseline, 1, nsSubject("z"), []ClusterNetworkPolicyIngressRule{{Action: "Deny", From: []ClusterNetworkPolicyPeer{{}}}}, nil)
	newer.Unknown = []string{"spec.ingress[0].from[0].services"}
	addCNPs(s, newer)
	ps, warnings := compileAll(t, s)
	checkStack(t, ps, 80, newTruth(true).set("x/", "", false).set("", "z/", false))
	var all []string
	for _, w := range warnings {
		all = append(all, w.String())
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{"nodes (experimental) is not implemented, enforced as Deny of everything",
		"domainNames (experimental) is not implemented, matches nothing", "unknown field spec.ingress[0].from[0].services",
		"peer 0 has 0 fields"} {
		if !strings.Contains(joined, want) {
			t.Errorf("warnings lack %q:\n%s", want, joined)
		}
	}
}

// TestClusterPolicyDeps: a ClusterNetworkPolicy's change affects every
// pod; a namespace's relabelling its own pods (subjects select by it).
func TestClusterPolicyDeps(t *testing.T) {
	s := xyz()
	addCNPs(s, cnp("p", tierAdmin, 1, nsSubject("x"), []ClusterNetworkPolicyIngressRule{fromNS("Deny", "y")}, nil))
	c := NewCompiler(s, nil)
	dz := c.CompilePod(LocalPod{Pod: s.Pods["z/a"]}, nil, 1).Deps
	if ch := ClusterPolicyChange(nil, s.ClusterPolicies["p"]); ch == nil || !ch.Affects(dz) {
		t.Error("a new ClusterNetworkPolicy does not affect z/a")
	}
	if ch := ClusterPolicyChange(s.ClusterPolicies["p"], s.ClusterPolicies["p"]); ch != nil {
		t.Error("an unchanged ClusterNetworkPolicy is a change")
	}
	old := s.Namespaces["z"]
	relabelled := &Namespace{Metadata: ObjectMeta{Name: "z", Labels: map[string]string{"ns": "x"}}}
	if ch := NamespaceChange(old, relabelled); ch == nil || !ch.Affects(dz) {
		t.Error("z's relabelling does not affect z/a")
	}
	if dx := c.CompilePod(LocalPod{Pod: s.Pods["x/a"]}, nil, 1).Deps; NamespaceChange(old, relabelled).Affects(dx) {
		// x/a's peers select by ns=y only: z's labels (ns=z, then ns=x)
		// are no peer of it.
		t.Error("z's relabelling affects x/a, whose peers it is not")
	}
}
