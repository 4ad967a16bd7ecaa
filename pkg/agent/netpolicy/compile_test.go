package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

type probe struct {
	proto policy.Protocol
	port  uint16
	want  truth
	// want6 is the IPv6 probes' matrix when it differs from want's.
	want6 truth
}

// TestReachability compiles the upstream e2e cases (test/e2e/network/netpol,
// network_policy.go) for the x/y/z × a/b/c cluster and asserts the whole
// matrix of each probe, as those tests do.
func TestReachability(t *testing.T) {
	all := NetworkPolicyPeer{PodSelector: &LabelSelector{}, NamespaceSelector: &LabelSelector{}}
	tests := []struct {
		name     string
		policies []*NetworkPolicy
		probes   []probe
	}{{
		name:   "no policy: everything open",
		probes: []probe{{"TCP", 80, newTruth(true), nil}, {"UDP", 81, newTruth(true), nil}},
	}, {
		name:     "default-deny-ingress",
		policies: []*NetworkPolicy{netpol("x", "deny-ingress", NetworkPolicySpec{})},
		probes:   []probe{{"TCP", 80, newTruth(true).set("", "x/", false), nil}},
	}, {
		name: "default-deny-all",
		policies: []*NetworkPolicy{netpol("x", "deny-all", NetworkPolicySpec{
			PolicyTypes: []string{"Ingress", "Egress"},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/", false).set("x/", "", false), nil}},
	}, {
		name: "default-deny-egress",
		policies: []*NetworkPolicy{netpol("x", "deny-egress", NetworkPolicySpec{
			PolicyTypes: []string{"Egress"},
		})},
		probes: []probe{{"UDP", 80, newTruth(true).set("x/", "", false), nil}},
	}, {
		name: "allow traffic from pods within server namespace based on PodSelector",
		policies: []*NetworkPolicy{netpol("x", "x-a-allows-x-b", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress:     []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{PodSelector: labels("pod", "b")}}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/a", false).set("x/b", "x/a", true), nil}},
	}, {
		name: "allow ingress traffic for a target: deny-all union allow-all-to-a",
		policies: []*NetworkPolicy{
			netpol("x", "deny-all", NetworkPolicySpec{}),
			netpol("x", "allow-all-to-a", NetworkPolicySpec{
				PodSelector: *labels("pod", "a"),
				Ingress:     []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{all}}},
			}),
		},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/b", false).set("", "x/c", false), nil}},
	}, {
		name: "allow ingress from pods in all namespaces: namespaceSelector {}",
		policies: []*NetworkPolicy{netpol("x", "allow-from-another-ns", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress:     []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{NamespaceSelector: labels()}}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true), nil}},
	}, {
		name: "allow only from a different namespace, based on NamespaceSelector",
		policies: []*NetworkPolicy{netpol("x", "allow-client-a-via-ns-selector", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress:     []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{NamespaceSelector: labels(namespaceLabelKey, "y")}}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("x/", "x/a", false).set("z/", "x/a", false), nil}},
	}, {
		name: "PodSelector with MatchExpressions",
		policies: []*NetworkPolicy{netpol("x", "x-a-allows-x-b", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress:     []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{PodSelector: expr("pod", "In", "b")}}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/a", false).set("x/b", "x/a", true), nil}},
	}, {
		name: "NamespaceSelector with MatchExpressions",
		policies: []*NetworkPolicy{netpol("x", "allow-ns-y-match-selector", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress:     []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{NamespaceSelector: expr("ns", "In", "y")}}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("x/", "x/a", false).set("z/", "x/a", false), nil}},
	}, {
		name: "PodSelector or NamespaceSelector (two peers)",
		policies: []*NetworkPolicy{netpol("x", "allow-ns-y-match-selector", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{
				{NamespaceSelector: expr(namespaceLabelKey, "NotIn", "x")},
				{PodSelector: labels("pod", "b")},
			}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("x/c", "x/a", false), nil}},
	}, {
		name: "PodSelector and NamespaceSelector (one peer)",
		policies: []*NetworkPolicy{netpol("x", "allow-ns-y-podselector-and-nsselector", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{
				NamespaceSelector: expr(namespaceLabelKey, "NotIn", "x"),
				PodSelector:       labels("pod", "b"),
			}}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/a", false).set("y/b", "x/a", true).set("z/b", "x/a", true), nil}},
	}, {
		name: "Multiple PodSelectors and NamespaceSelectors",
		policies: []*NetworkPolicy{netpol("x", "allow-ns-y-z-pod-b-c", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{
				NamespaceSelector: expr(namespaceLabelKey, "NotIn", "x"),
				PodSelector:       expr("pod", "In", "b", "c"),
			}}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/a", false).set("y/b", "x/a", true).set("y/c", "x/a", true).
			set("z/b", "x/a", true).set("z/c", "x/a", true), nil}},
	}, {
		name: "Exists and DoesNotExist",
		policies: []*NetworkPolicy{
			netpol("x", "from-labelled-ns", NetworkPolicySpec{
				PodSelector: *labels("pod", "a"),
				Ingress:     []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{NamespaceSelector: expr("ns", "Exists"), PodSelector: expr("pod", "NotIn", "b")}}}},
			}),
			netpol("x", "from-unlabelled-pods", NetworkPolicySpec{
				PodSelector: *labels("pod", "b"),
				Ingress:     []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{NamespaceSelector: labels(), PodSelector: expr("pod", "DoesNotExist")}}}},
			}),
		},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/b", false).set("x/b", "x/a", false).set("y/b", "x/a", false).set("z/b", "x/a", false), nil}},
	}, {
		name: "ingress on one numeric port from a namespace",
		policies: []*NetworkPolicy{netpol("x", "allow-client-a-via-ns-selector-80", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{{
				From:  []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "y")}},
				Ports: []NetworkPolicyPort{numPort("TCP", 80)},
			}},
		})},
		probes: []probe{
			{"TCP", 80, newTruth(true).set("x/", "x/a", false).set("z/", "x/a", false), nil},
			{"TCP", 81, newTruth(true).set("", "x/a", false), nil},
			{"UDP", 80, newTruth(true).set("", "x/a", false), nil},
		},
	}, {
		name: "ingress on one named port from a namespace (resolved on the pod itself)",
		policies: []*NetworkPolicy{netpol("x", "allow-client-in-ns-y-via-named-port", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{{
				From:  []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "y")}},
				Ports: []NetworkPolicyPort{namePort("", "serve-80-tcp")},
			}},
		})},
		probes: []probe{
			{"TCP", 80, newTruth(true).set("x/", "x/a", false).set("z/", "x/a", false), nil},
			{"TCP", 81, newTruth(true).set("", "x/a", false), nil},
		},
	}, {
		name: "ingress named port of another protocol: UDP name, TCP probe",
		policies: []*NetworkPolicy{netpol("x", "udp-named", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress:     []NetworkPolicyIngressRule{{Ports: []NetworkPolicyPort{namePort("UDP", "serve-81-udp")}}},
		})},
		probes: []probe{
			{"UDP", 81, newTruth(true), nil},
			{"TCP", 81, newTruth(true).set("", "x/a", false), nil},
			{"UDP", 80, newTruth(true).set("", "x/a", false), nil},
		},
	}, {
		// Upstream: "should allow egress access on one named port" — a rule
		// with a named port and no to: every pod, on its own port of that
		// name.
		name: "egress on one named port, no peers",
		policies: []*NetworkPolicy{netpol("x", "allow-egress", NetworkPolicySpec{
			PodSelector: LabelSelector{},
			PolicyTypes: []string{"Egress"},
			Egress:      []NetworkPolicyEgressRule{{Ports: []NetworkPolicyPort{namePort("", "serve-80-tcp")}}},
		})},
		probes: []probe{
			// z/c names 8080 serve-80-tcp.
			{"TCP", 80, newTruth(true).set("x/", "z/c", false), nil},
			{"TCP", 8080, newTruth(true).set("x/", "", false).set("x/", "z/c", true), nil},
			{"TCP", 81, newTruth(true).set("x/", "", false), nil},
		},
	}, {
		name: "egress on a named port to selected pods: resolved on each destination",
		policies: []*NetworkPolicy{netpol("x", "a-to-z-named", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			PolicyTypes: []string{"Egress"},
			Egress: []NetworkPolicyEgressRule{{
				To:    []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "z")}},
				Ports: []NetworkPolicyPort{namePort("TCP", "serve-80-tcp"), numPort("UDP", 53)},
			}},
		})},
		probes: []probe{
			{"TCP", 80, newTruth(true).set("x/a", "", false).set("x/a", "z/a", true).set("x/a", "z/b", true), nil},
			{"TCP", 8080, newTruth(true).set("x/a", "", false).set("x/a", "z/c", true), nil},
			{"UDP", 53, newTruth(true).set("x/a", "", false).set("x/a", "z/", true), nil},
		},
	}, {
		name: "egress named port within an ipBlock: the block's pods that name it",
		policies: []*NetworkPolicy{netpol("x", "a-to-block-named", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			PolicyTypes: []string{"Egress"},
			Egress: []NetworkPolicyEgressRule{{
				To:    []NetworkPolicyPeer{block("10.3.0.0/16", "10.3.0.2/32")},
				Ports: []NetworkPolicyPort{namePort("", "serve-81-tcp")},
			}},
		})},
		probes: []probe{
			// z/b is excepted, z/c has no serve-81-tcp, the IPv6
			// addresses are outside the block.
			{"TCP", 81, newTruth(true).set("x/a", "", false).set("x/a", "z/a", true), newTruth(true).set("x/a", "", false)},
		},
	}, {
		name: "endPort",
		policies: []*NetworkPolicy{netpol("x", "range", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress:     []NetworkPolicyIngressRule{{Ports: []NetworkPolicyPort{rangePort(81, 90)}}},
		})},
		probes: []probe{
			{"TCP", 80, newTruth(true).set("", "x/a", false), nil},
			{"TCP", 81, newTruth(true), nil},
			{"TCP", 90, newTruth(true), nil},
			{"TCP", 91, newTruth(true).set("", "x/a", false), nil},
			{"UDP", 85, newTruth(true).set("", "x/a", false), nil},
		},
	}, {
		name: "a port without a number: every port of its protocol",
		policies: []*NetworkPolicy{netpol("x", "sctp", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress:     []NetworkPolicyIngressRule{{Ports: []NetworkPolicyPort{{Protocol: ptr("SCTP")}}}},
		})},
		probes: []probe{
			{"SCTP", 80, newTruth(true), nil},
			{"SCTP", 9999, newTruth(true), nil},
			{"TCP", 80, newTruth(true).set("", "x/a", false), nil},
		},
	}, {
		name: "ingress from an ipBlock with except, IPv4 and IPv6",
		policies: []*NetworkPolicy{netpol("x", "from-y-but-b", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{
				block("10.2.0.0/16", "10.2.0.2/32"),
				block("fd00:2::/64", "fd00:2::2/128"),
			}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/a", false).set("y/", "x/a", true).set("y/b", "x/a", false), nil}},
	}, {
		name: "egress to an ipBlock with except",
		policies: []*NetworkPolicy{netpol("x", "to-z-but-c", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			PolicyTypes: []string{"Egress"},
			Egress: []NetworkPolicyEgressRule{{To: []NetworkPolicyPeer{
				block("10.3.0.0/16", "10.3.0.3/32"),
				block("fd00:3::/64", "fd00:3::3/128"),
			}}},
		})},
		probes: []probe{{"UDP", 81, newTruth(true).set("x/a", "", false).set("x/a", "z/", true).set("x/a", "z/c", false), nil}},
	}, {
		name: "multiple policies: union",
		policies: []*NetworkPolicy{
			netpol("x", "allow-from-y", NetworkPolicySpec{
				PodSelector: *labels("pod", "a"),
				Ingress:     []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "y")}}, Ports: []NetworkPolicyPort{numPort("", 80)}}},
			}),
			netpol("x", "allow-from-z-81", NetworkPolicySpec{
				PodSelector: *labels("pod", "a"),
				Ingress:     []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "z")}}, Ports: []NetworkPolicyPort{numPort("", 81)}}},
			}),
		},
		probes: []probe{
			{"TCP", 80, newTruth(true).set("", "x/a", false).set("y/", "x/a", true), nil},
			{"TCP", 81, newTruth(true).set("", "x/a", false).set("z/", "x/a", true), nil},
		},
	}, {
		name: "policyTypes defaulting: egress rules make an Egress policy",
		policies: []*NetworkPolicy{netpol("x", "egress-to-y", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Egress:      []NetworkPolicyEgressRule{{To: []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "y")}}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/a", false).set("x/a", "", false).set("x/a", "y/", true), nil}},
	}, {
		name: "policyTypes Egress only: the ingress rules are not enforced",
		policies: []*NetworkPolicy{netpol("x", "egress-only", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			PolicyTypes: []string{"Egress"},
			Ingress:     []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{PodSelector: labels("pod", "b")}}}},
			Egress:      []NetworkPolicyEgressRule{{}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true), nil}},
	}, {
		name: "policyTypes Ingress only: the egress rules are not enforced",
		policies: []*NetworkPolicy{netpol("x", "ingress-only", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			PolicyTypes: []string{"Ingress"},
			Ingress:     []NetworkPolicyIngressRule{{}},
			Egress:      []NetworkPolicyEgressRule{{To: []NetworkPolicyPeer{{PodSelector: labels("pod", "b")}}}},
		})},
		probes: []probe{{"TCP", 80, newTruth(true), nil}},
	}, {
		name: "rule {} allows everything, an empty rule list nothing",
		policies: []*NetworkPolicy{
			netpol("x", "allow-all-ingress", NetworkPolicySpec{PodSelector: *labels("pod", "a"), Ingress: []NetworkPolicyIngressRule{{}}}),
			netpol("x", "deny-ingress-b", NetworkPolicySpec{PodSelector: *labels("pod", "b"), Ingress: []NetworkPolicyIngressRule{}}),
			netpol("y", "allow-all-egress", NetworkPolicySpec{PodSelector: *labels("pod", "a"), PolicyTypes: []string{"Egress"}, Egress: []NetworkPolicyEgressRule{{}}}),
			netpol("y", "deny-egress-b", NetworkPolicySpec{PodSelector: *labels("pod", "b"), PolicyTypes: []string{"Egress"}}),
		},
		probes: []probe{{"TCP", 80, newTruth(true).set("", "x/b", false).set("y/b", "", false), nil}},
	}, {
		name: "egress and ingress policies on both ends",
		policies: []*NetworkPolicy{
			netpol("x", "a-egress-to-y-b", NetworkPolicySpec{
				PodSelector: *labels("pod", "a"),
				PolicyTypes: []string{"Egress"},
				Egress: []NetworkPolicyEgressRule{{
					To: []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "y"), PodSelector: labels("pod", "b")}},
				}},
			}),
			netpol("y", "b-ingress-from-x-a-80", NetworkPolicySpec{
				PodSelector: *labels("pod", "b"),
				Ingress: []NetworkPolicyIngressRule{{
					From:  []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "x"), PodSelector: labels("pod", "a")}},
					Ports: []NetworkPolicyPort{numPort("TCP", 80)},
				}},
			}),
		},
		probes: []probe{
			{"TCP", 80, newTruth(true).set("x/a", "", false).set("", "y/b", false).set("x/a", "y/b", true), nil},
			{"TCP", 81, newTruth(true).set("x/a", "", false).set("", "y/b", false), nil},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := xyz()
			addPolicies(s, tt.policies...)
			ps, warnings := compileAll(t, s)
			if len(warnings) > 0 {
				t.Errorf("got warnings %v, want none", warnings)
			}
			for _, p := range tt.probes {
				p.want.check(t, ps, p.proto, p.port, p.want6)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestCompiledPolicy checks a compiled policy in full: sorted policies,
// peers and ports, excepts, the node's addresses, named ports resolved.
func TestCompiledPolicy(t *testing.T) {
	s := xyz()
	addPolicies(s,
		netpol("x", "b-second", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			Ingress: []NetworkPolicyIngressRule{{
				From:  []NetworkPolicyPeer{{PodSelector: labels("pod", "c")}, block("172.16.0.0/12", "172.17.0.0/16", "fd00::/8", "172.16.0.0/16")},
				Ports: []NetworkPolicyPort{namePort("", "serve-81-tcp"), numPort("UDP", 53), namePort("", "no-such-port"), rangePort(1000, 2000)},
			}},
		}),
		netpol("x", "a-first", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			PolicyTypes: []string{"Egress", "Ingress"},
		}),
		netpol("y", "not-x", NetworkPolicySpec{}),
	)
	node := []netip.Addr{netip.MustParseAddr("fd00:ffff::10"), netip.MustParseAddr("192.168.0.10"), netip.MustParseAddr("::ffff:192.168.0.10")}
	got := Compile(s, LocalPod{Pod: s.Pods["x/a"]}, node, 42)
	want := &policy.PodPolicy{
		Version:    1, // no ClusterNetworkPolicy rule: what version-1 stacks read
		Generation: 42,
		Ingress: policy.Direction{
			Isolated: true,
			Policies: []string{"x/a-first", "x/b-second"},
			Rules: []policy.Rule{{
				Policy: "x/b-second",
				Peers: []policy.Peer{
					{CIDR: netip.MustParsePrefix("10.1.0.3/32")},
					{CIDR: netip.MustParsePrefix("172.16.0.0/12"), Except: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/16"), netip.MustParsePrefix("172.17.0.0/16")}},
					{CIDR: netip.MustParsePrefix("fd00:1::3/128")},
				},
				Ports: []policy.PortRange{{Protocol: "TCP", First: 81, Last: 81}, {Protocol: "TCP", First: 1000, Last: 2000}, {Protocol: "UDP", First: 53, Last: 53}},
			}},
		},
		Egress: policy.Direction{Isolated: true, Policies: []string{"x/a-first"}},
		Node:   []netip.Addr{netip.MustParseAddr("192.168.0.10"), netip.MustParseAddr("fd00:ffff::10")},
	}
	if !policy.Equal(got, want) || got.Generation != want.Generation {
		t.Errorf("got\n%s\nwant\n%s", mustJSON(t, got), mustJSON(t, want))
	}
}

func mustJSON(t *testing.T, p *policy.PodPolicy) string {
	t.Helper()
	b, err := policy.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPeerPods checks which pods a selector makes peers of: never a pod on
// the host's network, finished or without an address; the pod compiled is
// one with the addresses its attachment has, before the API shows them.
//
// A pod being deleted stays a peer until its addresses are released (its
// phase finished or its podIPs gone): during its grace period it still
// serves and calls, and dropping it at the deletionTimestamp would cut a
// server draining its connections, as Calico found. (This test used to
// want it dropped at once.)
func TestPeerPods(t *testing.T) {
	s := xyz()
	hostNet := testPod("y", "host")
	hostNet.Spec.HostNetwork = true
	hostNet.Status.PodIPs = []PodIP{{IP: "192.168.0.20"}}
	done := testPod("y", "done")
	done.Status.Phase = "Succeeded"
	done.Status.PodIPs = []PodIP{{IP: "10.2.0.50"}}
	failed := testPod("y", "failed")
	failed.Status.Phase = "Failed"
	failed.Status.PodIPs = []PodIP{{IP: "10.2.0.51"}}
	deleting := testPod("y", "deleting")
	deleting.Metadata.DeletionTimestamp = ptr("2026-12-02T06:00:00Z")
	deleting.Status.PodIPs = []PodIP{{IP: "10.2.0.52"}}
	deleted := testPod("y", "deleted") // terminated: its address released
	deleted.Metadata.DeletionTimestamp = ptr("2026-12-02T06:00:00Z")
	deleted.Status.Phase = "Succeeded"
	deleted.Status.PodIPs = []PodIP{{IP: "10.2.0.53"}}
	released := testPod("y", "released") // being deleted, addresses gone
	released.Metadata.DeletionTimestamp = ptr("2026-12-02T06:00:00Z")
	released.Status.PodIPs = nil
	noIP := testPod("y", "noip")
	noIP.Status.PodIPs = nil
	badIP := testPod("y", "badip")
	badIP.Status.PodIPs = []PodIP{{IP: "10.2.0.999"}}
	pending := testPod("y", "pending")
	pending.Status = PodStatus{Phase: "Pending"}
	for _, p := range []*Pod{hostNet, done, failed, deleting, deleted, released, noIP, badIP, pending} {
		p.Metadata.Labels["role"] = "client"
		s.Pods["y/"+p.Metadata.Name] = p
	}
	addPolicies(s, netpol("x", "from-clients", NetworkPolicySpec{
		Ingress: []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{NamespaceSelector: labels(), PodSelector: labels("role", "client")}}}},
	}))
	// pending is being added on this node: its attachment has its address.
	pendingAddr := netip.MustParseAddr("10.2.0.60")
	c := NewCompiler(s, []LocalPod{{Pod: s.Pods["x/a"]}, {Pod: pending, IPs: []netip.Addr{pendingAddr}}})
	p, w := c.Compile(LocalPod{Pod: s.Pods["x/a"]}, nil, 1)
	if len(w) != 0 {
		t.Errorf("got warnings %v, want none", w)
	}
	want := []policy.Rule{{Policy: "x/from-clients", Peers: []policy.Peer{
		{CIDR: netip.MustParsePrefix("10.2.0.52/32")}, // deleting, still addressed
		{CIDR: netip.PrefixFrom(pendingAddr, 32)},
	}}}
	if !slices.EqualFunc(p.Ingress.Rules, want, ruleEqual) {
		t.Errorf("got rules %+v, want %+v", p.Ingress.Rules, want)
	}
}

func ruleEqual(a, b policy.Rule) bool {
	return a.Policy == b.Policy && slices.Equal(a.Ports, b.Ports) &&
		slices.EqualFunc(a.Peers, b.Peers, func(x, y policy.Peer) bool { return x.CIDR == y.CIDR && slices.Equal(x.Except, y.Except) })
}

func TestNamespaceWithoutObject(t *testing.T) {
	// A pod whose Namespace the watch has not delivered yet is still in
	// its namespace, and has the name label the API server gives every
	// namespace.
	s := xyz()
	delete(s.Namespaces, "z")
	addPolicies(s, netpol("x", "from-z", NetworkPolicySpec{
		Ingress: []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{NamespaceSelector: labels(namespaceLabelKey, "z")}}}},
	}))
	ps, _ := compileAll(t, s)
	newTruth(true).set("", "x/", false).set("z/", "x/", true).check(t, ps, "TCP", 80, nil)
}

func TestNoPodObject(t *testing.T) {
	p := Compile(xyz(), LocalPod{IPs: []netip.Addr{podAddr4("x", "a")}}, nodeAddrs, 3)
	if !p.Ingress.Isolated || !p.Egress.Isolated || len(p.Ingress.Rules)+len(p.Egress.Rules) != 0 || p.Generation != 3 {
		t.Errorf("got %+v, want policy.Closed at generation 3", p)
	}
	if err := p.Validate(); err != nil {
		t.Error(err)
	}
	if strings.Join(p.Ingress.Policies, ",") != "(pending)" {
		t.Errorf("got policies %v", p.Ingress.Policies)
	}
}

// TestConcurrentCompile compiles the same pods from several goroutines
// sharing one Compiler (run it with -race): the results are the ones a
// lone compile gives.
func TestConcurrentCompile(t *testing.T) {
	s, locals := benchCluster(10, 10, 200, 10)
	c := NewCompiler(s, locals)
	want := make([]*policy.PodPolicy, len(locals))
	for i, lp := range locals {
		want[i], _ = NewCompiler(s, locals).Compile(lp, nodeAddrs, 1)
	}
	errs := make(chan error, 4*len(locals))
	for range 4 {
		go func() {
			for i, lp := range locals {
				got, _ := c.Compile(lp, nodeAddrs, 1)
				if !policy.Equal(got, want[i]) {
					errs <- fmt.Errorf("%s: concurrent compile differs", lp.Pod.Metadata.Name)
					continue
				}
				errs <- nil
			}
		}()
	}
	for range 4 * len(locals) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestEmptyAndNilSnapshot(t *testing.T) {
	pod := testPod("x", "a")
	for name, s := range map[string]*Snapshot{
		"nil":       nil,
		"empty":     {},
		"nil items": {Policies: map[string]*NetworkPolicy{"x/p": nil}, Pods: map[string]*Pod{"x/b": nil}, Namespaces: map[string]*Namespace{"x": nil}, Services: map[string]*Service{"x/s": nil}, EndpointSlices: map[string]*EndpointSlice{"x/s": nil}},
	} {
		p := Compile(s, LocalPod{Pod: pod}, nil, 1)
		if err := p.Validate(); err != nil || p.Ingress.Isolated || p.Egress.Isolated {
			t.Errorf("%s snapshot: got %+v (%v), want an open policy", name, p, err)
		}
	}
}
