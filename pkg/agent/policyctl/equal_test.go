package policyctl

import (
	"net/netip"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// The digest agrees with policy.Equal (the JSON encodings compared) on a
// policy, its copy through JSON, each field changed, and changes that
// move a value from one field or element into the next.
func TestDigestIsEqual(t *testing.T) {
	mk := func() *policy.PodPolicy {
		return &policy.PodPolicy{
			Version: policy.FormatVersion, Generation: 7,
			Ingress: policy.Direction{Isolated: true, Policies: []string{"x/a"}, Rules: []policy.Rule{{Policy: "x/a",
				Peers: []policy.Peer{{CIDR: netip.MustParsePrefix("10.0.0.0/8"), Except: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}},
				Ports: []policy.PortRange{{Protocol: policy.TCP, First: 80, Last: 80}}}}},
			Egress: policy.Direction{Isolated: true, Policies: []string{"x/a"},
				Admin: []policy.TierRule{{Policy: "no-y", Name: "r", Action: policy.Deny,
					Peers: []policy.Peer{{CIDR: netip.MustParsePrefix("10.2.0.0/16")}}}},
				Baseline: []policy.TierRule{{Policy: "base", Action: policy.Deny}}},
			Node: []netip.Addr{netip.MustParseAddr("192.0.2.1")},
			Services: []policy.Service{{Name: "y/s:http", Protocol: policy.TCP, VIP: netip.MustParseAddrPort("10.96.0.1:80"),
				Backends: []policy.Backend{{Addr: netip.MustParseAddrPort("10.2.0.1:8080")}}}},
		}
	}
	b, _ := policy.Marshal(mk())
	back, err := policy.Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	back.Generation = 8
	for name, change := range map[string]func(p *policy.PodPolicy){
		"through JSON, another generation": nil,
		"isolation":                        func(p *policy.PodPolicy) { p.Egress.Isolated = false },
		"a policy name":                    func(p *policy.PodPolicy) { p.Ingress.Policies[0] = "x/b" },
		"an except":                        func(p *policy.PodPolicy) { p.Ingress.Rules[0].Peers[0].Except = nil },
		"a port":                           func(p *policy.PodPolicy) { p.Ingress.Rules[0].Ports[0].Last = 81 },
		"the node":                         func(p *policy.PodPolicy) { p.Node = nil },
		"a backend":                        func(p *policy.PodPolicy) { p.Services[0].Backends = nil },
		"a service's address":              func(p *policy.PodPolicy) { p.Services[0].VIP = netip.MustParseAddrPort("10.96.0.1:81") },
		"the version":                      func(p *policy.PodPolicy) { p.Version++ },
		"a service's name":                 func(p *policy.PodPolicy) { p.Services[0].Name = "y/s:https" },
		"a rule's policy":                  func(p *policy.PodPolicy) { p.Ingress.Rules[0].Policy = "x/b" },
		"a prefix length":                  func(p *policy.PodPolicy) { p.Ingress.Rules[0].Peers[0].CIDR = netip.MustParsePrefix("10.0.0.0/9") },
		"an Admin rule's action":           func(p *policy.PodPolicy) { p.Egress.Admin[0].Action = policy.Pass },
		"an Admin rule's peer":             func(p *policy.PodPolicy) { p.Egress.Admin[0].Peers = nil },
		"an Admin rule's name":             func(p *policy.PodPolicy) { p.Egress.Admin[0].Name = "" },
		"a Baseline rule's ports": func(p *policy.PodPolicy) {
			p.Egress.Baseline[0].Ports = []policy.PortRange{{Protocol: policy.UDP}}
		},
		"the Admin rule moved to the Baseline tier": func(p *policy.PodPolicy) {
			p.Egress.Baseline = append(p.Egress.Admin, p.Egress.Baseline...)
			p.Egress.Admin = nil
		},
		"one policy name split in two": func(p *policy.PodPolicy) {
			p.Ingress.Policies = []string{"x/", "a"}
		},
		"the except moved into a peer of its own": func(p *policy.PodPolicy) {
			r := &p.Ingress.Rules[0]
			r.Peers = []policy.Peer{{CIDR: r.Peers[0].CIDR}, {CIDR: r.Peers[0].Except[0]}}
		},
		"a rule's peers moved to the other direction": func(p *policy.PodPolicy) {
			p.Egress.Rules, p.Ingress.Rules = p.Ingress.Rules, nil
		},
		"an IPv4 node address as IPv4-in-IPv6": func(p *policy.PodPolicy) {
			p.Node = []netip.Addr{netip.AddrFrom16(netip.MustParseAddr("192.0.2.1").As16())}
		},
	} {
		a, b := mk(), back
		if change != nil {
			b = mk()
			change(b)
		}
		if got, want := digestOf(a) == digestOf(b), policy.Equal(a, b); got != want {
			t.Errorf("%s: same digest %v, policy.Equal %v", name, got, want)
		}
	}
}
