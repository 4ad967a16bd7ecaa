// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"context"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/agent/policyctl"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// agentRig is a rig whose pod's policy comes from the node agent's own
// policy controller, watching a stand-in API server: the pod in namespace
// "test", the allowed peer as peers-a/allowed, the other as peers-b/other.
type agentRig struct {
	*rig
	api *fakeapi.Server
}

func newAgentRig(t *testing.T) *agentRig {
	t.Helper()
	r := &agentRig{rig: newRig(t)}
	kinds := append(slices.Clone(fakeapi.Kinds), fakeapi.Kind{Group: "policy.networking.k8s.io", Version: "v1beta1",
		Resource: "clusternetworkpolicies", Kind: "ClusterNetworkPolicy"})
	r.api = fakeapi.NewTest(t, fakeapi.Options{Token: "tok", Kinds: kinds})
	for _, ns := range []string{"test", "peers-a", "peers-b"} {
		r.put(t, "namespaces", &netpolicy.Namespace{Metadata: netpolicy.ObjectMeta{Name: ns}})
	}
	r.put(t, "pods", podOf("test", r.pod.ID, r.pod))
	r.put(t, "pods", podOf("peers-a", "allowed", r.allowed))
	r.put(t, "pods", podOf("peers-b", "other", r.other))
	c, err := policyctl.New(policyctl.Options{
		Config:    &rest.Config{Host: r.api.URL(), BearerToken: "tok", TLSClientConfig: rest.TLSClientConfig{CAData: r.api.CAPEM()}},
		Store:     state.Store{Dir: filepath.Join(r.env.Dir, "state")},
		Node:      "node-1",
		NodeAddrs: func() ([]netip.Addr, error) { return r.node(), nil },
		Log:       slog.New(slog.NewTextHandler(t.Output(), nil)),

		ClusterNetworkPolicy: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func podOf(ns, name string, p *nettest.Pod) *netpolicy.Pod {
	return &netpolicy.Pod{
		Metadata: netpolicy.ObjectMeta{Namespace: ns, Name: name, UID: "uid-" + name, Labels: map[string]string{"app": name}},
		Status: netpolicy.PodStatus{Phase: "Running",
			PodIPs: []netpolicy.PodIP{{IP: p.IP(4).String()}, {IP: p.IP(6).String()}}},
	}
}

func (r *agentRig) put(t *testing.T, resource string, obj any) {
	t.Helper()
	if _, err := r.api.Store.Put(resource, obj); err != nil {
		t.Fatal(err)
	}
}

func (r *agentRig) del(t *testing.T, resource, ns, name string) {
	t.Helper()
	if err := r.api.Store.Delete(resource, ns, name); err != nil {
		t.Fatal(err)
	}
}

// layers waits until the stack holds a policy of the agent's whose layers
// are want (nil: no ClusterNetworkPolicy) and whose generation is past
// after; it returns that generation.
func (r *agentRig) layers(t *testing.T, after uint64, want *policy.LayerCounts) uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p := r.status(t).Policy
		if p != nil && p.Generation > after && (p.Layers == nil && want == nil || p.Layers != nil && want != nil && *p.Layers == *want) {
			return p.Generation
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stack holds %+v, want layers %+v after generation %d", p, want, after)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lastDenial is the stack's last recorded denial.
func (r *agentRig) lastDenial(t *testing.T) policy.Denial {
	t.Helper()
	d := r.status(t).Policy.RecentDenials
	if len(d) == 0 {
		t.Fatal("no denial recorded")
	}
	return d[len(d)-1]
}

func nsSel(name string) *netpolicy.LabelSelector {
	return &netpolicy.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": name}}
}

func clusterPolicy(name, tier string, prio int32, action string, from *netpolicy.LabelSelector) *netpolicy.ClusterNetworkPolicy {
	return &netpolicy.ClusterNetworkPolicy{Metadata: netpolicy.ObjectMeta{Name: name}, Spec: netpolicy.ClusterNetworkPolicySpec{
		Tier: tier, Priority: prio, Subject: netpolicy.ClusterNetworkPolicySubject{Namespaces: nsSel("test")},
		Ingress: []netpolicy.ClusterNetworkPolicyIngressRule{{Action: action, From: []netpolicy.ClusterNetworkPolicyPeer{{Namespaces: from}}}},
	}}
}

// allowFrom is the tenant's NetworkPolicy in "test": ingress from the
// namespace from ("" every source).
func allowFrom(name, from string) *netpolicy.NetworkPolicy {
	rule := netpolicy.NetworkPolicyIngressRule{}
	if from != "" {
		rule.From = []netpolicy.NetworkPolicyPeer{{NamespaceSelector: nsSel(from)}}
	}
	return &netpolicy.NetworkPolicy{Metadata: netpolicy.ObjectMeta{Namespace: "test", Name: name},
		Spec: netpolicy.NetworkPolicySpec{PolicyTypes: []string{"Ingress"}, Ingress: []netpolicy.NetworkPolicyIngressRule{rule}}}
}

// TestClusterNetworkPolicyLayers: ClusterNetworkPolicies and the tenant's
// NetworkPolicy, from the API through the agent's controller into the
// pod's real stack, judged on real connections in the order of the
// layers: an Admin Deny closes what the tenant's NetworkPolicy opens, an
// Admin Pass of a higher priority hands the connection back to it, a
// Baseline Deny yields to a NetworkPolicy's allow and holds where none
// isolates the pod; each denial names its layer and policy.
func TestClusterNetworkPolicyLayers(t *testing.T) {
	r := newAgentRig(t)
	a4, b4 := r.allowed.IP(4), r.other.IP(4)

	// The tenant opens ingress to everyone; the Admin tier denies peers-b.
	r.put(t, "networkpolicies", allowFrom("open", ""))
	r.put(t, "clusternetworkpolicies", clusterPolicy("deny-b", "Admin", 10, "Deny", nsSel("peers-b")))
	gen := r.layers(t, 0, &policy.LayerCounts{Admin: 1, NetworkPolicy: 1})
	wantTCP(t, "admin deny: peers-a", r.allowed.NS, r.pod.IP(4), tcpPort, true)
	wantTCP(t, "admin deny: peers-b, which the tenant allows", r.other.NS, r.pod.IP(4), tcpPort, false)
	wantUDP(t, "admin deny: peers-b over UDP", r.other.NS, r.pod.IP(4), udpPort, false)
	wantTCP(t, "admin deny: peers-b over IPv6", r.other.NS, r.pod.IP(6), tcpPort, false)
	if d := r.lastDenial(t); d.Layer != policy.TierAdmin || d.Policies != "deny-b" || d.Peer.Unmap() != r.other.IP(6) && d.Peer.Unmap() != b4 {
		t.Errorf("denial %+v: want layer Admin, policy deny-b, from peers-b", d)
	}
	wantTCP(t, "node (kubelet's probes)", r.env.Node, r.pod.IP(4), tcpPort, true)

	// A Pass of a higher priority (a lower number) hands peers-b to the
	// tenant's NetworkPolicy, which allows it.
	r.put(t, "clusternetworkpolicies", clusterPolicy("pass-b", "Admin", 5, "Pass", nsSel("peers-b")))
	gen = r.layers(t, gen, &policy.LayerCounts{Admin: 2, NetworkPolicy: 1})
	wantTCP(t, "pass: peers-b to the tenant's allow", r.other.NS, r.pod.IP(4), tcpPort, true)

	// The tenant allows peers-a only: peers-b, passed, is denied by the
	// NetworkPolicy.
	r.del(t, "networkpolicies", "test", "open")
	r.put(t, "networkpolicies", allowFrom("only-a", "peers-a"))
	gen = r.layers(t, gen, &policy.LayerCounts{Admin: 2, NetworkPolicy: 1})
	wantTCP(t, "pass: peers-b to the tenant's isolation", r.other.NS, r.pod.IP(4), tcpPort, false)
	if d := r.lastDenial(t); d.Layer != policy.TierNetworkPolicy || d.Policies != "test/only-a" {
		t.Errorf("denial %+v: want layer NetworkPolicy, policy test/only-a", d)
	}

	// No Admin tier; a Baseline Deny of everything: the tenant's allow
	// stands for peers-a, and holds alone once the tenant's policy goes.
	r.del(t, "clusternetworkpolicies", "", "deny-b")
	r.del(t, "clusternetworkpolicies", "", "pass-b")
	r.put(t, "clusternetworkpolicies", clusterPolicy("base-deny", "Baseline", 0, "Deny", &netpolicy.LabelSelector{}))
	gen = r.layers(t, gen, &policy.LayerCounts{Baseline: 1, NetworkPolicy: 1})
	wantTCP(t, "baseline deny: peers-a, which the tenant allows", r.allowed.NS, r.pod.IP(4), tcpPort, true)
	wantTCP(t, "baseline deny: peers-b, not allowed by the tenant", r.other.NS, r.pod.IP(4), tcpPort, false)
	r.del(t, "networkpolicies", "test", "only-a")
	r.layers(t, gen, &policy.LayerCounts{Baseline: 1})
	wantTCP(t, "baseline deny alone: peers-a", r.allowed.NS, r.pod.IP(4), tcpPort, false)
	if d := r.lastDenial(t); d.Layer != policy.TierBaseline || d.Policies != "base-deny" || d.Peer.Unmap() != a4 {
		t.Errorf("denial %+v: want layer Baseline, policy base-deny, from %s", d, a4)
	}
	wantTCP(t, "baseline deny alone: the node", r.env.Node, r.pod.IP(4), tcpPort, true)
}
