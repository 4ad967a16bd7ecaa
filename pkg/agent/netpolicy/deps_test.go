package netpolicy

import (
	"slices"
	"testing"
)

// Each kind of change affects the pods whose compiled inputs it touches,
// and only those: x/a takes ingress from y's pods labelled pod=b and
// egress to z's pod=a on 80; x/b is selected by nothing that looks
// outside; y/c only by a default deny.
func TestChangeAffects(t *testing.T) {
	s := xyz()
	withServices(s)
	addPolicies(s,
		netpol("x", "a", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"), PolicyTypes: []string{"Ingress", "Egress"},
			Ingress: []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "y"), PodSelector: labels("pod", "b")}}}},
			Egress:  []NetworkPolicyEgressRule{{To: []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "y"), PodSelector: labels("pod", "a")}}, Ports: []NetworkPolicyPort{numPort("", 80)}}},
		}),
		netpol("y", "deny", NetworkPolicySpec{PodSelector: *labels("pod", "c"), PolicyTypes: []string{"Ingress", "Egress"}}),
	)
	local := []string{"x/a", "x/b", "y/c"}
	c := NewCompiler(s, nil)
	deps := map[string]*Deps{}
	for _, k := range local {
		deps[k] = c.CompilePod(LocalPod{Pod: s.Pods[k]}, nodeAddrs, 1).Deps
	}
	nsLabels := func(ns string) map[string]string { return s.Namespaces[ns].Metadata.Labels }
	relabel := func(p *Pod, kv ...string) *Pod {
		q := *p
		q.Metadata.Labels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			q.Metadata.Labels[kv[i]] = kv[i+1]
		}
		return &q
	}
	deleting := *s.Pods["y/b"]
	deleting.Metadata.DeletionTimestamp = ptr("2026-12-02T06:00:00Z")
	finished := deleting
	finished.Status.Phase = "Succeeded"
	ns := func(name string, kv ...string) *Namespace {
		n := &Namespace{Metadata: ObjectMeta{Name: name, Labels: map[string]string{}}}
		for i := 0; i+1 < len(kv); i += 2 {
			n.Metadata.Labels[kv[i]] = kv[i+1]
		}
		return n
	}
	policyX := s.Policies["x/a"]
	policyX2 := *policyX
	policyX2.Metadata.ResourceVersion = "2"
	newSlice := *s.EndpointSlices["y/web-v4"]
	newSlice.Endpoints = append(slices.Clone(newSlice.Endpoints), Endpoint{Addresses: []string{"10.2.0.99"}})
	webExt := *s.Services["y/web"]
	webExt.Spec.ExternalIPs = []string{"203.0.113.9"}
	web4 := []*EndpointSlice{s.EndpointSlices["y/web-v4"]}

	for _, tc := range []struct {
		name   string
		change Change
		want   []string // nil Change: want nil
	}{
		{"a policy's spec unchanged", PolicyChange(policyX, &policyX2), nil},
		{"a policy deleted", PolicyChange(policyX, nil), []string{"x/a"}},
		{"a policy added in y", PolicyChange(nil, netpol("y", "new", NetworkPolicySpec{})), []string{"y/c"}},
		{"a peer relabelled out", PodChange(s.Pods["y/b"], relabel(s.Pods["y/b"], "pod", "z"), nsLabels), []string{"x/a"}},
		{"a pod nobody selects relabelled", PodChange(s.Pods["z/b"], relabel(s.Pods["z/b"], "pod", "q"), nsLabels), []string{}},
		{"a peer being deleted, still addressed", PodChange(s.Pods["y/b"], &deleting, nsLabels), nil},
		{"a peer being deleted, finished", PodChange(&deleting, &finished, nsLabels), []string{"x/a"}},
		{"an egress peer gone", PodChange(s.Pods["y/a"], nil, nsLabels), []string{"x/a"}},
		{"a namespace unchanged", NamespaceChange(s.Namespaces["y"], ns("y", "ns", "y", namespaceLabelKey, "y")), nil},
		{"y relabelled", NamespaceChange(s.Namespaces["y"], ns("y", "ns", "q")), []string{"x/a"}},
		{"a namespace nobody selects", NamespaceChange(nil, ns("w", "ns", "w")), []string{}},
		{"a backend nobody reaches", SliceChange(s.EndpointSlices["y/web-v4"], &newSlice), []string{}},
		{"a reached backend gone", SliceChange(s.EndpointSlices["y/web-v4"], nil), []string{"x/a"}},
		{"a slice unchanged", SliceChange(s.EndpointSlices["y/web-v4"], s.EndpointSlices["y/web-v4"]), nil},
		{"an external IP added", ServiceChange(s.Services["y/web"], &webExt, web4), []string{"x/a"}},
		{"a Service nobody reaches", ServiceChange(nil, s.Services["z/empty"], nil), []string{}},
	} {
		if tc.want == nil {
			if tc.change != nil {
				t.Errorf("%s: got a change, want none", tc.name)
			}
			continue
		}
		if tc.change == nil {
			t.Errorf("%s: got no change, want one affecting %v", tc.name, tc.want)
			continue
		}
		got := []string{}
		for _, k := range local {
			if tc.change.Affects(deps[k]) {
				got = append(got, k)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: affects %v, want %v", tc.name, got, tc.want)
		}
	}
}
