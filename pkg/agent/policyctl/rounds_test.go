package policyctl

import (
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// counter counts compiles per pod.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) add(pod string) { c.mu.Lock(); c.n[pod]++; c.mu.Unlock() }

// take returns the counts so far and starts again from zero.
func (c *counter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.n
	c.n = map[string]int{}
	return out
}

func endpointSlice(ns, name, svc string, port int32, addrs ...string) *netpolicy.EndpointSlice {
	es := &netpolicy.EndpointSlice{
		Metadata:    netpolicy.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{netpolicy.ServiceNameLabel: svc}},
		AddressType: "IPv4", Ports: []netpolicy.EndpointPort{{Port: &port}},
	}
	for _, a := range addrs {
		es.Endpoints = append(es.Endpoints, netpolicy.Endpoint{Addresses: []string{a}})
	}
	return es
}

func service(ns, name, vip string, port int32) *netpolicy.Service {
	return &netpolicy.Service{
		Metadata: netpolicy.ObjectMeta{Namespace: ns, Name: name},
		Spec:     netpolicy.ServiceSpec{ClusterIPs: []string{vip}, Ports: []netpolicy.ServicePort{{Port: port}}},
	}
}

// A round compiles the local pods a change can affect and no other, by
// kind of change. Local: x/web (ingress from app=client pods of
// namespaces team=b; egress to y's app=db on 5432), x/idle (no policy),
// y/deny (default deny both ways). Elsewhere: y/client, y/db (behind
// Service y/db), z/other (behind Service z/other).
func TestPolicyRoundsTouchOnlyAffectedPods(t *testing.T) {
	e := newPolicyEnv(t)
	counts := &counter{n: map[string]int{}}
	e.compiled = counts.add
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathNamespaces, nsObj("y", map[string]string{"team": "b"}))
	e.api.put(pathNamespaces, nsObj("z", nil))
	web := &netpolicy.NetworkPolicy{
		Metadata: netpolicy.ObjectMeta{Namespace: "x", Name: "web"},
		Spec: netpolicy.NetworkPolicySpec{
			PodSelector: netpolicy.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PolicyTypes: []string{"Ingress", "Egress"},
			Ingress: []netpolicy.NetworkPolicyIngressRule{{From: []netpolicy.NetworkPolicyPeer{{
				NamespaceSelector: &netpolicy.LabelSelector{MatchLabels: map[string]string{"team": "b"}},
				PodSelector:       &netpolicy.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
			}}}},
			Egress: []netpolicy.NetworkPolicyEgressRule{{
				To: []netpolicy.NetworkPolicyPeer{{
					NamespaceSelector: &netpolicy.LabelSelector{MatchLabels: map[string]string{"team": "b"}},
					PodSelector:       &netpolicy.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
				}},
				Ports: []netpolicy.NetworkPolicyPort{{Port: &netpolicy.IntOrString{Int: 5432}}},
			}},
		},
	}
	deny := &netpolicy.NetworkPolicy{
		Metadata: netpolicy.ObjectMeta{Namespace: "y", Name: "deny"},
		Spec: netpolicy.NetworkPolicySpec{
			PodSelector: netpolicy.LabelSelector{MatchLabels: map[string]string{"app": "deny"}},
			PolicyTypes: []string{"Ingress", "Egress"},
		},
	}
	e.api.put(pathPolicies, web)
	e.api.put(pathPolicies, deny)
	locals := map[string]string{"x/web": "10.244.1.10", "x/idle": "10.244.1.11", "y/deny": "10.244.1.12"}
	stacks := map[string]*fakeStack{}
	for key, ip := range locals {
		ns, name := key[:1], key[2:]
		e.api.put(pathPods, podObj(ns, name, ip, map[string]string{"app": name}))
		sock, _ := localPod(t, e.store, e.dir, ns, name, ip)
		stacks[key] = newFakeStack(t, sock, policy.Closed(testNode))
	}
	e.api.put(pathPods, podObj("y", "client", "10.244.2.20", map[string]string{"app": "client"}))
	e.api.put(pathPods, podObj("y", "db", "10.244.2.30", map[string]string{"app": "db"}))
	e.api.put(pathPods, podObj("z", "other", "10.244.2.40", map[string]string{"app": "other"}))
	e.api.put(pathServices, service("y", "db", "10.96.0.30", 5432))
	e.api.put(pathSlices, endpointSlice("y", "db-1", "db", 5432, "10.244.2.30"))
	e.api.put(pathServices, service("z", "other", "10.96.0.40", 80))
	e.api.put(pathSlices, endpointSlice("z", "other-1", "other", 80, "10.244.2.40"))

	e.start(t)
	waitFor(t, "every stack's first push", 5*time.Second, func() bool {
		for _, s := range stacks {
			if p := s.current(); p == nil || p.Generation == 0 {
				return false
			}
		}
		return true
	})
	webPolicy := stacks["x/web"].current()
	if len(webPolicy.Services) != 1 || webPolicy.Services[0].VIP != netip.MustParseAddrPort("10.96.0.30:5432") {
		t.Fatalf("x/web carries %+v, want y/db's Service alone", webPolicy.Services)
	}
	time.Sleep(200 * time.Millisecond)
	counts.take()
	pushes := func() map[string]int {
		out := map[string]int{}
		for k, s := range stacks {
			out[k] = len(s.pushed())
		}
		return out
	}

	for _, step := range []struct {
		name     string
		change   func()
		compiled []string // the pods compiled, once each
		pushed   []string // the pods pushed to
	}{
		{"an endpoint no local pod's rules reach", func() {
			e.api.put(pathSlices, endpointSlice("z", "other-1", "other", 80, "10.244.2.40", "10.244.2.41"))
		}, nil, nil},
		{"a Service no local pod's rules reach", func() { e.api.put(pathServices, service("z", "more", "10.96.0.50", 80)) }, nil, nil},
		{"a pod no rule selects, relabelled", func() {
			e.api.put(pathPods, podObj("z", "other", "10.244.2.40", map[string]string{"app": "other", "v": "2"}))
		}, nil, nil},
		{"a peer's status that no peer is made of", func() {
			e.api.put(pathPods, podObj("y", "client", "10.244.2.20", map[string]string{"app": "client"}))
		}, nil, nil},
		{"a policy of a namespace without local pods", func() { e.api.put(pathPolicies, ingressPolicy("z", "deny", "")) }, nil, nil},
		{"a peer relabelled out", func() {
			e.api.put(pathPods, podObj("y", "client", "10.244.2.20", map[string]string{"app": "gone"}))
		}, []string{"x/web"}, []string{"x/web"}},
		{"a reached backend gone", func() { e.api.put(pathSlices, endpointSlice("y", "db-1", "db", 5432)) }, []string{"x/web"}, []string{"x/web"}},
		{"a namespace relabelled into a selector, no pod of it selected", func() {
			e.api.put(pathNamespaces, nsObj("z", map[string]string{"team": "b"}))
		}, []string{"x/web"}, nil},
		{"a policy changed", func() {
			d := *deny
			d.Spec.PolicyTypes = []string{"Ingress"}
			e.api.put(pathPolicies, &d)
		}, []string{"y/deny"}, []string{"y/deny"}},
		{"a local pod relabelled", func() {
			e.api.put(pathPods, podObj("x", "idle", "10.244.1.11", map[string]string{"app": "web"}))
		}, []string{"x/idle"}, []string{"x/idle"}},
	} {
		before := pushes()
		step.change()
		want := map[string]int{}
		for _, k := range step.compiled {
			want[k] = 1
		}
		if len(want) > 0 {
			waitFor(t, step.name+": the compiles", 5*time.Second, func() bool {
				counts.mu.Lock()
				defer counts.mu.Unlock()
				return len(counts.n) >= len(want)
			})
		}
		time.Sleep(300 * time.Millisecond) // no more than those
		if got := counts.take(); !maps.Equal(got, want) {
			t.Errorf("%s: compiled %v, want %v", step.name, got, want)
		}
		after := pushes()
		var pushed []string
		for k := range after {
			if after[k] != before[k] {
				pushed = append(pushed, k)
			}
		}
		slices.Sort(pushed)
		if !slices.Equal(pushed, step.pushed) {
			t.Errorf("%s: pushed to %v, want %v", step.name, pushed, step.pushed)
		}
	}
}

// A full round runs at the start and at every Resync, compiling every
// local pod; an unchanged policy is not pushed again.
func TestPolicyResyncCompilesEveryPod(t *testing.T) {
	e := newPolicyEnv(t)
	counts := &counter{n: map[string]int{}}
	e.compiled = counts.add
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathPods, podObj("x", "a", "10.244.1.10", nil))
	e.api.put(pathPods, podObj("x", "b", "10.244.1.11", nil))
	sa, _ := localPod(t, e.store, e.dir, "x", "a", "10.244.1.10")
	sb, _ := localPod(t, e.store, e.dir, "x", "b", "10.244.1.11")
	sta, stb := newFakeStack(t, sa, policy.Closed(testNode)), newFakeStack(t, sb, policy.Closed(testNode))
	e.resync = 300 * time.Millisecond
	e.start(t)
	waitFor(t, "the first pushes", 5*time.Second, func() bool { return holds(sta, false)() && holds(stb, false)() })
	counts.take()
	waitFor(t, "a resync", 5*time.Second, func() bool {
		counts.mu.Lock()
		defer counts.mu.Unlock()
		return counts.n["x/a"] >= 1 && counts.n["x/b"] >= 1
	})
	if n, m := len(sta.pushed()), len(stb.pushed()); n != 1 || m != 1 {
		t.Errorf("pushes after a resync: %d and %d, want 1 each (nothing changed)", n, m)
	}
}
