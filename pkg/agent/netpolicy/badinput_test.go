package netpolicy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// TestBadInput: input the API server would refuse or that selects nothing.
// Each part that cannot be used allows nothing (never more than the
// policy's valid parts) and is reported; the rest of the policy applies.
func TestBadInput(t *testing.T) {
	tests := []struct {
		name     string
		policies []*NetworkPolicy
		probes   []probe
		// warnings are substrings the warnings must hold, in order.
		warnings []string
	}{{
		name: "a policy that selects nothing isolates nothing",
		policies: []*NetworkPolicy{netpol("x", "selects-nothing", NetworkPolicySpec{
			PodSelector: *labels("pod", "nonexistent"),
			PolicyTypes: []string{"Ingress", "Egress"},
		})},
		probes: []probe{{"TCP", 80, newTruth(true), nil}},
	}, {
		name: "a peer that selects nothing allows nothing",
		policies: []*NetworkPolicy{netpol("x", "from-nobody", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{
				{From: []NetworkPolicyPeer{{PodSelector: labels("pod", "nonexistent")}}},
				{From: []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "nonexistent")}}},
			},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/a", false), nil}},
	}, {
		name: "a named port no container declares: that entry matches nothing, the others apply",
		policies: []*NetworkPolicy{netpol("x", "undeclared", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{
				{Ports: []NetworkPolicyPort{namePort("", "no-such-port")}},
				{Ports: []NetworkPolicyPort{namePort("", "no-such-port"), numPort("", 81)}, From: []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "y")}}},
			},
			PolicyTypes: []string{"Ingress", "Egress"},
			Egress:      []NetworkPolicyEgressRule{{Ports: []NetworkPolicyPort{namePort("UDP", "serve-80-tcp")}}},
		})},
		probes: []probe{
			{"TCP", 80, newTruth(true).set("", "x/a", false).set("x/a", "", false), nil},
			{"TCP", 81, newTruth(true).set("", "x/a", false).set("y/", "x/a", true).set("x/a", "", false), nil},
			{"UDP", 80, newTruth(true).set("", "x/a", false).set("x/a", "", false), nil},
		},
	}, {
		name: "overlapping ipBlocks: their union, each less its own excepts",
		policies: []*NetworkPolicy{netpol("x", "overlap", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{
				block("10.0.0.0/8", "10.2.0.0/16", "10.3.0.0/16"),
				block("10.2.0.0/24", "10.2.0.3/32"),
				block("10.2.0.0/16"),
				block("10.3.0.0/30"), // z/a, z/b, z/c (.3 is the /30's last)
				block("10.3.0.2/31", "10.3.0.0/16"),
			}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/a", false).
			set("x/", "x/a", true).set("y/", "x/a", true).set("z/", "x/a", true), newTruth(true).set("", "x/a", false)}},
	}, {
		name: "a malformed CIDR is skipped and opens nothing",
		policies: []*NetworkPolicy{netpol("x", "bad-cidrs", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{
				{From: []NetworkPolicyPeer{block("10.0.0.0/33")}},
				{From: []NetworkPolicyPeer{block("garbage")}},
				{From: []NetworkPolicyPeer{block("")}},
				// A malformed except would open what it closes: the whole
				// block goes.
				{From: []NetworkPolicyPeer{block("0.0.0.0/0", "10.1.0.2/32", "10.2.0.0/16 ")}},
				{From: []NetworkPolicyPeer{block("10.2.0.0/16"), block("::/0", "not-a-prefix")}, Ports: []NetworkPolicyPort{numPort("", 80)}},
			},
			PolicyTypes: []string{"Egress", "Ingress"},
			Egress:      []NetworkPolicyEgressRule{{To: []NetworkPolicyPeer{block("1.2.3.4")}}},
		})},
		probes: []probe{
			{"TCP", 80, newTruth(true).set("", "x/a", false).set("y/", "x/a", true).set("x/a", "", false), newTruth(true).set("", "x/a", false).set("x/a", "", false)},
			{"TCP", 81, newTruth(true).set("", "x/a", false).set("x/a", "", false), nil},
		},
		warnings: []string{`ingress rule 0 peer 0: ipBlock cidr "10.0.0.0/33"`, `ingress rule 1 peer 0: ipBlock cidr "garbage"`, `ingress rule 2 peer 0: ipBlock cidr ""`,
			`ingress rule 3 peer 0: ipBlock 0.0.0.0/0 except "10.2.0.0/16 "`, `ingress rule 4 peer 1: ipBlock ::/0 except "not-a-prefix"`,
			`egress rule 0 peer 0: ipBlock cidr "1.2.3.4"`},
	}, {
		name: "an egress rule whose peers are all malformed allows nothing, named ports included",
		policies: []*NetworkPolicy{netpol("x", "bad-egress-peers", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			PolicyTypes: []string{"Egress"},
			Egress: []NetworkPolicyEgressRule{
				{To: []NetworkPolicyPeer{block("bad")}, Ports: []NetworkPolicyPort{namePort("", "serve-80-tcp"), numPort("", 81)}},
				{To: []NetworkPolicyPeer{{PodSelector: expr("pod", "Bogus")}}, Ports: []NetworkPolicyPort{namePort("", "serve-80-tcp")}},
				{To: []NetworkPolicyPeer{{}}},
			},
		})},
		probes: []probe{
			{"TCP", 80, newTruth(true).set("x/a", "", false), nil},
			{"TCP", 81, newTruth(true).set("x/a", "", false), nil},
			{"TCP", 8080, newTruth(true).set("x/a", "", false), nil},
		},
		warnings: []string{`egress rule 0 peer 0: ipBlock cidr "bad"`, `egress rule 1 peer 0: podSelector selects no pod`, "egress rule 2 peer 0: neither"},
	}, {
		name: "an except of the other family excludes nothing",
		policies: []*NetworkPolicy{netpol("x", "mixed-except", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress:     []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{block("10.2.0.0/16", "fd00:2::/64")}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/a", false).set("y/", "x/a", true), newTruth(true).set("", "x/a", false)}},
	}, {
		name: "an unknown protocol matches nothing",
		policies: []*NetworkPolicy{netpol("x", "icmp", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{
				{Ports: []NetworkPolicyPort{numPort("ICMP", 80)}},
				{Ports: []NetworkPolicyPort{numPort("tcp", 80), numPort("UDP", 80)}},
				{Ports: []NetworkPolicyPort{{Protocol: ptr("ANY")}}},
			},
		})},
		probes: []probe{
			{"TCP", 80, newTruth(true).set("", "x/a", false), nil},
			{"UDP", 80, newTruth(true), nil},
		},
		warnings: []string{`ingress rule 0 port 0: unknown protocol "ICMP"`, `ingress rule 1 port 0: unknown protocol "tcp"`, `ingress rule 2 port 0: unknown protocol "ANY"`},
	}, {
		name: "an unknown selector operator selects nothing",
		policies: []*NetworkPolicy{
			netpol("x", "bad-peer", NetworkPolicySpec{
				PodSelector: *labels("pod", "a"),
				Ingress: []NetworkPolicyIngressRule{
					{From: []NetworkPolicyPeer{{PodSelector: expr("pod", "Equals", "b")}}},
					{From: []NetworkPolicyPeer{{NamespaceSelector: expr("ns", "In")}, {PodSelector: labels("pod", "c")}}},
					{From: []NetworkPolicyPeer{{NamespaceSelector: expr("ns", "Exists", "x")}}},
				},
			}),
			netpol("y", "bad-target", NetworkPolicySpec{PodSelector: *expr("pod", "Gt", "1")}),
		},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/a", false).set("x/c", "x/a", true), nil}},
		warnings: []string{`ingress rule 0 peer 0: podSelector selects no pod: label selector: unknown operator "Equals"`,
			`ingress rule 1 peer 0: namespaceSelector selects no namespace: label selector: ns In without values`,
			`ingress rule 2 peer 0: namespaceSelector selects no namespace: label selector: ns Exists with values`},
	}, {
		name: "bad ports: out of range, endPort below port, endPort with a named port or without a port",
		policies: []*NetworkPolicy{netpol("x", "bad-ports", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{{Ports: []NetworkPolicyPort{
				numPort("", 0), numPort("", 70000), rangePort(90, 80), rangePort(80, 70000),
				{Port: &IntOrString{IsString: true, Str: "serve-80-tcp"}, EndPort: ptr(int32(81))},
				{EndPort: ptr(int32(81))},
				namePort("", ""),
			}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/a", false), nil}, {"TCP", 1, newTruth(true).set("", "x/a", false), nil}},
		warnings: []string{"port 0: port range 0-0", "port 1: port range 70000-70000", "port 2: port range 90-80", "port 3: port range 80-70000",
			`port 4: named port "serve-80-tcp" with endPort`, "port 5: endPort without port", `port 6: named port "" with endPort or empty`},
	}, {
		name: "a peer with neither selector nor ipBlock, or an ipBlock with a selector, allows nothing",
		policies: []*NetworkPolicy{netpol("x", "bad-peers", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{
				{},
				{IPBlock: &IPBlock{CIDR: "0.0.0.0/0"}, PodSelector: labels("pod", "b")},
			}}},
		})},
		probes:   []probe{{"TCP", 80, newTruth(true).set("", "x/a", false), nil}},
		warnings: []string{"peer 0: neither a selector nor an ipBlock", "peer 1: ipBlock together with a selector"},
	}, {
		name: "unknown policyTypes are ignored; none known is the default",
		policies: []*NetworkPolicy{
			netpol("x", "typo", NetworkPolicySpec{PodSelector: *labels("pod", "a"), PolicyTypes: []string{"ingress"}, Egress: []NetworkPolicyEgressRule{{}}}),
			netpol("x", "typo-and-egress", NetworkPolicySpec{PodSelector: *labels("pod", "b"), PolicyTypes: []string{"egres", "Egress"}}),
		},
		probes:   []probe{{"TCP", 80, newTruth(true).set("", "x/a", false).set("x/b", "", false), nil}},
		warnings: []string{`unknown policy type "ingress"`, `unknown policy type "egres"`},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := xyz()
			addPolicies(s, tt.policies...)
			ps, warnings := compileAll(t, s)
			for _, p := range tt.probes {
				p.want.check(t, ps, p.proto, p.port, p.want6)
			}
			var got []string
			for _, w := range warnings {
				got = append(got, w.String())
			}
			all := strings.Join(got, "\n")
			for _, w := range tt.warnings {
				if !strings.Contains(all, w) {
					t.Errorf("no warning %q in:\n%s", w, all)
				}
			}
			if len(tt.warnings) == 0 && len(got) > 0 {
				t.Errorf("got warnings\n%s\nwant none", all)
			}
		})
	}
}

// TestTenThousandPolicies: 10,000 policies, most of them in the local
// pods' namespace, still compile to valid, deterministic policies that
// allow exactly what the policies allow.
func TestTenThousandPolicies(t *testing.T) {
	s := xyz()
	for i := range 10000 {
		ns := namespaces[i%3]
		spec := NetworkPolicySpec{PodSelector: *labels("pod", podNames[i%3])}
		switch i % 4 {
		case 0:
			spec.Ingress = []NetworkPolicyIngressRule{{Ports: []NetworkPolicyPort{numPort("TCP", int32(1000+i))}}}
		case 1:
			spec.Ingress = []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{block(fmt.Sprintf("172.%d.%d.0/24", 16+i/256, i%256))}}}
		case 2:
			spec.PolicyTypes = []string{"Egress"}
			spec.Egress = []NetworkPolicyEgressRule{{To: []NetworkPolicyPeer{{NamespaceSelector: labels("ns", namespaces[(i+1)%3])}}, Ports: []NetworkPolicyPort{namePort("", "serve-81-tcp"), numPort("UDP", int32(i))}}}
		case 3:
			spec.Ingress = []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{PodSelector: expr("pod", "NotIn", podNames[(i+1)%3])}}}}
		}
		addPolicies(s, netpol(ns, fmt.Sprintf("p%05d", i), spec))
	}
	ps, warnings := compileAll(t, s)
	if len(warnings) > 0 {
		t.Fatalf("got %d warnings, first %v", len(warnings), warnings[0])
	}
	// x/a is selected by the policies i%3 == 0: ingress from the 2,501
	// whose i%4 != 2 (ports 1000+i, 172.x blocks, x pods other than b),
	// egress to y on serve-81-tcp and UDP i from the others.
	p := ps["x/a"]
	if got, want := len(p.Ingress.Policies), 2501; got != want {
		t.Errorf("x/a: got %d ingress policies, want %d", got, want)
	}
	if !allows(&p.Ingress, podAddr4("z", "c"), policy.TCP, 1000) || allows(&p.Ingress, podAddr4("z", "c"), policy.TCP, 1001) {
		t.Error("x/a: port 1000 of p00000 not alone open")
	}
	if !allows(&p.Ingress, podAddr4("x", "c"), policy.UDP, 7) || allows(&p.Ingress, podAddr4("x", "b"), policy.UDP, 7) {
		t.Error("x/a: x/c not let in or x/b let in")
	}
	if !allows(&p.Ingress, netip.MustParseAddr("172.16.9.1"), policy.TCP, 7) || allows(&p.Ingress, netip.MustParseAddr("172.16.13.1"), policy.TCP, 7) {
		t.Error("x/a: the block of p00009 not open or p00013's open")
	}
	if !allows(&p.Egress, podAddr4("y", "c"), policy.TCP, 81) || allows(&p.Egress, podAddr4("z", "c"), policy.TCP, 81) ||
		!allows(&p.Egress, podAddr6("y", "c"), policy.UDP, 6) || allows(&p.Egress, podAddr6("y", "c"), policy.UDP, 5) {
		t.Error("x/a: egress wrong")
	}
}
