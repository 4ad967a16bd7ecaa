// SPDX-License-Identifier: Apache-2.0

package policyctl

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
)

const pathCNPs = "/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies"

// withCRD serves the ClusterNetworkPolicies besides the default kinds.
func withCRD(t *testing.T, e *policyEnv) {
	kinds := append(slices.Clone(fakeapi.Kinds), fakeapi.Kind{Group: "policy.networking.k8s.io", Version: "v1beta1",
		Resource: "clusternetworkpolicies", Kind: "ClusterNetworkPolicy"})
	e.api = &fakeAPI{t: t, Server: fakeapi.NewTest(t, fakeapi.Options{Token: "tok", Kinds: kinds})}
	e.clusterPolicies = true
}

func adminDenyFrom(name, subjectNS, fromNS string) *netpolicy.ClusterNetworkPolicy {
	return &netpolicy.ClusterNetworkPolicy{Metadata: netpolicy.ObjectMeta{Name: name}, Spec: netpolicy.ClusterNetworkPolicySpec{
		Tier: "Admin", Priority: 5,
		Subject: netpolicy.ClusterNetworkPolicySubject{Namespaces: &netpolicy.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": subjectNS}}},
		Ingress: []netpolicy.ClusterNetworkPolicyIngressRule{{Action: "Deny", From: []netpolicy.ClusterNetworkPolicyPeer{
			{Namespaces: &netpolicy.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": fromNS}}}}}},
	}}
}

func adminRules(s *fakeStack) []policy.TierRule {
	if p := s.current(); p != nil && p.Generation != 0 {
		return p.Ingress.Admin
	}
	return nil
}

// A pod's stack follows the ClusterNetworkPolicies as it follows the
// NetworkPolicies: the Admin tier's rule pushed beside the tenant's allow
// (format version 2), its peers following the pods, gone when the policy
// is; the gauges count them.
func TestClusterPolicyFollowsTheAPI(t *testing.T) {
	e := newPolicyEnv(t)
	withCRD(t, e)
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathNamespaces, nsObj("y", nil))
	e.api.put(pathPods, podObj("x", "a", "10.244.1.10", map[string]string{"app": "a"}))
	e.api.put(pathPods, podObj("y", "b", "10.244.2.20", map[string]string{"app": "b"}))
	e.api.put(pathPolicies, ingressPolicy("x", "allow-b", "b"))
	sock, att := localPod(t, e.store, e.dir, "x", "a", "10.244.1.10")
	st := newFakeStack(t, sock, policy.Closed(testNode))
	e.start(t)
	waitFor(t, "the tenant's allow", 5*time.Second, holds(st, true, "10.244.2.20/32"))
	if v := st.current().Version; v != 1 {
		t.Errorf("a policy without tiers went out as version %d, want 1", v)
	}

	e.api.put(pathCNPs, adminDenyFrom("no-y", "x", "y"))
	waitFor(t, "the Admin tier's deny", 5*time.Second, func() bool {
		r := adminRules(st)
		return len(r) == 1 && r[0].Action == policy.Deny && len(r[0].Peers) == 1 && r[0].Peers[0].CIDR.String() == "10.244.2.20/32"
	})
	if p := st.current(); p.Version != policy.FormatVersion || !p.Ingress.Isolated {
		t.Errorf("with a tier: version %d, NetworkPolicy isolated %v; want %d, true", p.Version, p.Ingress.Isolated, policy.FormatVersion)
	}
	fileMatches(t, att, st)
	if got := testutil.ToFloat64(e.m.clusterPolicies.WithLabelValues("Admin")); got != 1 {
		t.Errorf("cni_usernet_policy_cluster_policies{tier=Admin}: got %v, want 1", got)
	}
	// A new pod in y joins the rule's peers.
	e.api.put(pathPods, podObj("y", "c", "10.244.2.30", nil))
	waitFor(t, "y/c among the denied", 5*time.Second, func() bool {
		r := adminRules(st)
		return len(r) == 1 && len(r[0].Peers) == 2
	})
	e.api.del(pathCNPs, "no-y")
	waitFor(t, "the Admin tier gone", 5*time.Second, func() bool {
		p := st.current()
		return len(p.Ingress.Admin) == 0 && p.Version == 1
	})
}

// Without the CRD the agent says so once and enforces NetworkPolicy.
func TestClusterPolicyCRDAbsent(t *testing.T) {
	e := newPolicyEnv(t) // the default kinds: no CRD
	e.clusterPolicies = true
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathPods, podObj("x", "a", "10.244.1.10", nil))
	e.api.put(pathPolicies, ingressPolicy("x", "deny", ""))
	sock, _ := localPod(t, e.store, e.dir, "x", "a", "10.244.1.10")
	st := newFakeStack(t, sock, policy.Closed(testNode))
	e.start(t)
	waitFor(t, "the NetworkPolicy", 5*time.Second, holds(st, true))
	time.Sleep(300 * time.Millisecond) // a few relists at the tests' backoff
	if n := strings.Count(e.logs.String(), "does not serve this resource"); n != 1 {
		t.Errorf("the missing CRD said %d times, want once:\n%s", n, e.logs.String())
	}
}

// A policy with parts the agent does not implement is logged with them,
// counted, and fails closed in the pods it selects.
func TestClusterPolicyUnsupportedReported(t *testing.T) {
	e := newPolicyEnv(t)
	withCRD(t, e)
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathPods, podObj("x", "a", "10.244.1.10", nil))
	cnp := adminDenyFrom("fqdn", "x", "y")
	cnp.Spec.Ingress = nil
	cnp.Spec.Egress = []netpolicy.ClusterNetworkPolicyEgressRule{{Action: "Pass", To: []netpolicy.ClusterNetworkPolicyPeer{{Nodes: &netpolicy.LabelSelector{}}}}}
	e.api.put(pathCNPs, cnp)
	sock, _ := localPod(t, e.store, e.dir, "x", "a", "10.244.1.10")
	st := newFakeStack(t, sock, policy.Closed(testNode))
	e.start(t)
	waitFor(t, "the failed-closed rule", 5*time.Second, func() bool {
		p := st.current()
		return p != nil && p.Generation != 0 && len(p.Egress.Admin) == 1 && p.Egress.Admin[0].Action == policy.Deny && len(p.Egress.Admin[0].Peers) == 0
	})
	if !strings.Contains(e.logs.String(), "spec.egress[0] peer 0: nodes") {
		t.Errorf("the unsupported part is not logged:\n%s", e.logs.String())
	}
	if got := testutil.ToFloat64(e.m.clusterUnsupported); got != 1 {
		t.Errorf("cni_usernet_policy_cluster_policies_unsupported: got %v, want 1", got)
	}
	waitFor(t, "the pod's Event", 5*time.Second, func() bool {
		for _, ev := range e.api.postedEvents() {
			if ev["reason"] == "NetworkPolicySkipped" && strings.Contains(ev["message"].(string), "nodes (experimental) is not implemented") {
				return true
			}
		}
		return false
	})
}
