// SPDX-License-Identifier: Apache-2.0

package policy_test

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

type sinkRec struct {
	why   policy.Reason
	label string
}

type recSink struct{ got []sinkRec }

func (s *recSink) Denied(_ time.Time, _ policy.Flow, why policy.Reason, label string, _ uint64) {
	s.got = append(s.got, sinkRec{why, label})
}

func tierRule(pol string, a policy.Action, peers []policy.Peer, pr ...policy.PortRange) policy.TierRule {
	return policy.TierRule{Policy: pol, Action: a, Peers: peers, Ports: pr}
}

// TestTierOrder holds the order of the layers: the Admin tier before
// NetworkPolicy, NetworkPolicy before the Baseline tier, Pass handing over
// to the next layer, the first matching rule deciding within a tier.
func TestTierOrder(t *testing.T) {
	tenant := []policy.Peer{peer("10.0.0.5/32")}
	other := []policy.Peer{peer("10.0.0.6/32")}
	cases := []struct {
		name      string
		dir       policy.Direction
		peer      string
		port      uint16
		want      bool
		why       policy.Reason
		wantLabel string
	}{
		{
			name: "admin deny beats a NetworkPolicy allow",
			dir: policy.Direction{Isolated: true, Policies: []string{"ns/open"}, Rules: []policy.Rule{{Policy: "ns/open"}},
				Admin: []policy.TierRule{tierRule("block", policy.Deny, tenant)}},
			peer: "10.0.0.5", port: 80, want: false, why: policy.AdminDeny, wantLabel: "block",
		},
		{
			name: "admin deny leaves other peers to NetworkPolicy",
			dir: policy.Direction{Isolated: true, Policies: []string{"ns/open"}, Rules: []policy.Rule{{Policy: "ns/open"}},
				Admin: []policy.TierRule{tierRule("block", policy.Deny, tenant)}},
			peer: "10.0.0.6", port: 80, want: true,
		},
		{
			name: "a NetworkPolicy allow beats a baseline deny",
			dir: policy.Direction{Isolated: true, Policies: []string{"ns/web"}, Rules: []policy.Rule{{Policy: "ns/web", Peers: tenant}},
				Baseline: []policy.TierRule{tierRule("base", policy.Deny, nil)}},
			peer: "10.0.0.5", port: 80, want: true,
		},
		{
			name: "baseline deny where no NetworkPolicy isolates",
			dir:  policy.Direction{Baseline: []policy.TierRule{tierRule("base", policy.Deny, nil)}},
			peer: "10.0.0.5", port: 80, want: false, why: policy.BaselineDeny, wantLabel: "base",
		},
		{
			name: "baseline accept before its deny",
			dir:  policy.Direction{Baseline: []policy.TierRule{tierRule("base", policy.Accept, tenant), tierRule("base", policy.Deny, nil)}},
			peer: "10.0.0.5", port: 80, want: true,
		},
		{
			name: "pass hands over to NetworkPolicy, which denies",
			dir: policy.Direction{Isolated: true, Policies: []string{"ns/web"}, Rules: []policy.Rule{{Policy: "ns/web", Peers: other}},
				Admin: []policy.TierRule{tierRule("p", policy.Pass, tenant), tierRule("allow-all", policy.Accept, nil)}},
			peer: "10.0.0.5", port: 80, want: false, why: policy.NoRuleAdmits, wantLabel: "ns/web",
		},
		{
			name: "pass hands over to NetworkPolicy, which allows",
			dir: policy.Direction{Isolated: true, Policies: []string{"ns/web"}, Rules: []policy.Rule{{Policy: "ns/web", Peers: tenant}},
				Admin: []policy.TierRule{tierRule("p", policy.Pass, tenant), tierRule("deny-all", policy.Deny, nil)}},
			peer: "10.0.0.5", port: 80, want: true,
		},
		{
			name: "pass skips the rest of the admin tier to the baseline",
			dir: policy.Direction{Admin: []policy.TierRule{tierRule("p", policy.Pass, tenant), tierRule("deny-all", policy.Deny, nil)},
				Baseline: []policy.TierRule{tierRule("base", policy.Deny, tenant)}},
			peer: "10.0.0.5", port: 80, want: false, why: policy.BaselineDeny, wantLabel: "base",
		},
		{
			name: "the earlier admin rule decides: accept before deny",
			dir:  policy.Direction{Admin: []policy.TierRule{tierRule("first", policy.Accept, tenant), tierRule("second", policy.Deny, tenant)}},
			peer: "10.0.0.5", port: 80, want: true,
		},
		{
			name: "the earlier admin rule decides: deny before accept",
			dir:  policy.Direction{Admin: []policy.TierRule{tierRule("first", policy.Deny, tenant), tierRule("second", policy.Accept, tenant)}},
			peer: "10.0.0.5", port: 80, want: false, why: policy.AdminDeny, wantLabel: "first",
		},
		{
			name: "a rule's ports: another port is not matched",
			dir:  policy.Direction{Admin: []policy.TierRule{tierRule("d", policy.Deny, tenant, ports(policy.TCP, 8000, 8080))}},
			peer: "10.0.0.5", port: 80, want: true,
		},
		{
			name: "a rule's ports: a port of the range is",
			dir:  policy.Direction{Admin: []policy.TierRule{tierRule("d", policy.Deny, tenant, ports(policy.TCP, 8000, 8080))}},
			peer: "10.0.0.5", port: 8042, want: false, why: policy.AdminDeny, wantLabel: "d",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &policy.PodPolicy{Version: policy.FormatVersion, Ingress: c.dir}
			m, err := policy.Compile(p)
			if err != nil {
				t.Fatal(err)
			}
			counters := map[string]*atomic.Uint64{}
			sink := &recSink{}
			m.Attach(func(_ policy.Dir, label string) *atomic.Uint64 {
				c := new(atomic.Uint64)
				counters[label] = c
				return c
			}, sink)
			got := m.CheckFlow(policy.Flow{Dir: policy.Ingress, Proto: policy.ProtoTCP, Peer: addr(c.peer), Port: c.port})
			if got != c.want {
				t.Fatalf("verdict %v, want %v", got, c.want)
			}
			if c.want {
				return
			}
			if len(sink.got) != 1 || sink.got[0] != (sinkRec{c.why, c.wantLabel}) {
				t.Fatalf("denials recorded %+v, want one for %q by %q", sink.got, c.why, c.wantLabel)
			}
			key := c.wantLabel
			if l := c.why.Layer(); l != policy.TierNetworkPolicy {
				key = string(l) + ":" + c.wantLabel
			}
			if n := counters[key]; n == nil || n.Load() != 1 {
				t.Errorf("counter %q not counted once: %v", key, counters)
			}
		})
	}
}

// TestTierVersion: a policy with ClusterNetworkPolicy rules needs format
// version 2, so that a stack that reads version 1 refuses it rather than
// skip its Admin tier; one without them stays version 1.
func TestTierVersion(t *testing.T) {
	p := &policy.PodPolicy{Ingress: policy.Direction{Isolated: true}}
	if v := p.NeededVersion(); v != 1 {
		t.Fatalf("tierless policy needs version %d, want 1", v)
	}
	p.Egress.Admin = []policy.TierRule{tierRule("x", policy.Deny, nil)}
	if v := p.NeededVersion(); v != policy.FormatVersion {
		t.Fatalf("tiered policy needs version %d, want %d", v, policy.FormatVersion)
	}
	p.Version = 1
	if _, err := policy.Compile(p); err == nil {
		t.Fatal("a version-1 policy with tiers compiled")
	}
	p.Version = policy.FormatVersion
	p.Egress.Admin[0].Action = "Drop"
	if _, err := policy.Compile(p); err == nil {
		t.Fatal("an unknown action compiled")
	}
}

// TestTierServiceBackends: a Service's backends are chosen by the whole
// verdict, the Admin tier included, also when no NetworkPolicy isolates
// egress.
func TestTierServiceBackends(t *testing.T) {
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	p := &policy.PodPolicy{Version: policy.FormatVersion,
		Egress: policy.Direction{Admin: []policy.TierRule{tierRule("block", policy.Deny, []policy.Peer{peer("10.0.0.5/32")})}},
		Services: []policy.Service{{Name: "ns/s:http", Protocol: policy.TCP, VIP: vip, Backends: []policy.Backend{
			{Addr: netip.MustParseAddrPort("10.0.0.5:8080")}, {Addr: netip.MustParseAddrPort("10.0.0.6:8080")}}}}}
	m, err := policy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	for h := range uint32(8) {
		be, isSvc, ok := m.ResolveService(vip, policy.ProtoTCP, h)
		if !isSvc || !ok || be.Addr() != addr("10.0.0.6") {
			t.Fatalf("ResolveService(%d) = %v %v %v, want the allowed backend 10.0.0.6", h, be, isSvc, ok)
		}
	}
}
