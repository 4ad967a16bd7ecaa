package main

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
)

func TestClusterShape(t *testing.T) {
	for name, s := range clusters {
		c, err := newCluster(s)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(c.local) != s.Local {
			t.Errorf("%s: %d local pods, want %d", name, len(c.local), s.Local)
		}
		nses := map[string]bool{}
		for i := range c.local {
			p := c.localPod(i)
			if p.Spec.NodeName != nodeName {
				t.Errorf("%s: local pod %s on %s", name, p.Metadata.Name, p.Spec.NodeName)
			}
			nses[p.Metadata.Namespace] = true
		}
		if want := min(s.Local, s.Namespaces); len(nses) < want/5 {
			t.Errorf("%s: local pods in %d namespaces, want them spread (≥ %d)", name, len(nses), want/5)
		}
		if len(c.Pods) != s.Pods+2 || len(c.Svcs) != s.Services+1 || len(c.Slices) != s.Services+1 || len(c.Pols) != s.Policies {
			t.Errorf("%s: %d pods, %d Services, %d slices, %d policies; want %d, %d, %d, %d (DNS besides)",
				name, len(c.Pods), len(c.Svcs), len(c.Slices), len(c.Pols), s.Pods+2, s.Services+1, s.Services+1, s.Policies)
		}
		eps := 0
		for _, es := range c.Slices[:s.Services] {
			eps += len(es.Endpoints)
		}
		if eps != s.Services*s.Endpoints {
			t.Errorf("%s: %d endpoints, want %d", name, eps, s.Services*s.Endpoints)
		}
		deny := 0
		for _, p := range c.Pols {
			if p.Metadata.Name == "default-deny-egress" {
				deny++
			}
		}
		if deny != s.Namespaces {
			t.Errorf("%s: %d default-deny-egress policies, want one per namespace (%d)", name, deny, s.Namespaces)
		}
	}
}

func TestClusterSpecValidate(t *testing.T) {
	for _, s := range []clusterSpec{
		{Pods: 1000, Services: 300, Policies: 100, Namespaces: 10, Endpoints: 5, Local: 100}, // uneven apps
		{Pods: 1000, Services: 200, Policies: 5, Namespaces: 10, Endpoints: 5, Local: 100},   // fewer policies than namespaces
		{Pods: 1000, Services: 200, Policies: 100, Namespaces: 10, Endpoints: 6, Local: 100}, // more endpoints than pods of an app
		{Pods: 1000, Services: 200, Policies: 100, Namespaces: 10, Endpoints: 5, Local: 500}, // too many local pods
	} {
		if err := s.validate(); err == nil {
			t.Errorf("%+v: valid, want an error", s)
		}
	}
}

func TestEvents(t *testing.T) {
	c, err := newCluster(clusters["1k"])
	if err != nil {
		t.Fatal(err)
	}
	l := c.localPod(0)

	first, _ := c.event(evLabel)
	p := first.obj.(*pod)
	if first.resource != "pods" || first.typ != "MODIFIED" || p.Metadata.Namespace != l.Metadata.Namespace || p.Spec.NodeName == nodeName {
		t.Errorf("label change %s %s of %s/%s on %s, want a remote pod of %s MODIFIED",
			first.resource, first.typ, p.Metadata.Namespace, p.Metadata.Name, p.Spec.NodeName, l.Metadata.Namespace)
	}
	tier := p.Metadata.Labels["tier"]
	second, _ := c.event(evLabel)
	if second.obj.(*pod) != p || p.Metadata.Labels["tier"] == tier {
		t.Errorf("the second label change left tier %q, want it flipped back", p.Metadata.Labels["tier"])
	}

	a1, _ := c.event(evPodAdded)
	a2, _ := c.event(evPodAdded)
	p1, p2 := a1.obj.(*pod), a2.obj.(*pod)
	if a1.typ != "ADDED" || p1.Metadata.Name == p2.Metadata.Name || p1.Status.PodIP == p2.Status.PodIP ||
		p1.Metadata.Namespace != l.Metadata.Namespace || p1.Metadata.Labels["tier"] != "frontend" {
		t.Errorf("pods added: %+v and %+v, want two new frontend pods of %s", p1.Metadata, p2.Metadata, l.Metadata.Namespace)
	}

	e1, _ := c.event(evEndpoint)
	es := e1.obj.(*endpointSlice)
	if e1.resource != "endpointslices" || *es.Endpoints[0].Conditions.Ready {
		t.Errorf("endpoint change %s, ready %v; want an endpoint of a slice turned unready", e1.resource, *es.Endpoints[0].Conditions.Ready)
	}
	for i := range c.local {
		for _, ep := range es.Endpoints {
			if c.reachedBy(i, netip.MustParseAddr(ep.Addresses[0])) {
				t.Errorf("local pod %d's rules reach %s of the unrelated slice %s", i, ep.Addresses[0], es.Metadata.Name)
			}
		}
	}
	if db := c.Slices[(c.local[0]/c.spec.podsPerNS())*c.spec.appsPerNS()]; !c.reachedBy(0, netip.MustParseAddr(db.Endpoints[0].Addresses[0])) {
		t.Errorf("local pod 0's rules do not reach its namespace's db %s: reachedBy is wrong", db.Metadata.Name)
	}
	c.event(evEndpoint)
	if !*es.Endpoints[0].Conditions.Ready {
		t.Errorf("the second endpoint change left the endpoint unready, want it ready again")
	}

	pc, _ := c.event(evPolicy)
	np := pc.obj.(*networkPolicy)
	if pc.typ != "ADDED" || np.Metadata.Namespace != l.Metadata.Namespace || np.Spec.PodSelector.MatchLabels["app"] != l.Metadata.Labels["app"] {
		t.Errorf("policy added %+v selecting %v, want one of %s selecting app %s", np.Metadata, np.Spec.PodSelector, l.Metadata.Namespace, l.Metadata.Labels["app"])
	}
	if _, err := c.event("nothing"); err == nil {
		t.Errorf("an unknown event kind: no error")
	}
}

// An injected change reaches the store with a new resourceVersion.
func TestStoreApply(t *testing.T) {
	c, _ := newCluster(clusters["1k"])
	api, err := fakeapi.New(fakeapi.Options{Plain: true})
	if err != nil {
		t.Fatal(err)
	}
	st := api.Store
	if err := loadCluster(st, c); err != nil {
		t.Fatal(err)
	}
	before := st.Current()
	ch, _ := c.event(evPodAdded)
	rv, err := st.Put(ch.resource, ch.obj)
	if err != nil || rv != before+1 {
		t.Fatalf("Put: rv %d, %v; want %d", rv, err, before+1)
	}
	m := ch.obj.meta()
	if m.ResourceVersion != fmt.Sprint(rv) || !strings.Contains(string(st.Get("pods", m.Namespace, m.Name)), `"resourceVersion":"`+m.ResourceVersion+`"`) {
		t.Errorf("the added pod: %s, want it at %d", st.Get("pods", m.Namespace, m.Name), rv)
	}
}

func TestTally(t *testing.T) {
	now := time.Now()
	got := tally([]push{{0, 100, now}, {1, 300, now.Add(time.Second)}, {0, 200, now.Add(2 * time.Second)}})
	if got.pushes != 3 || got.pods != 2 || got.bytes != 600 || got.max != 300 || !got.last.Equal(now.Add(2*time.Second)) {
		t.Errorf("tally: %+v", got)
	}
}

// The agent's command: cni-usernet-agent where a build has it, else
// `cni-usernet agent`.
func TestAgentCommand(t *testing.T) {
	dir := t.TempDir()
	if _, err := agentCommand(dir); err == nil {
		t.Errorf("an empty directory: no error")
	}
	write := func(name string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("cni-usernet")
	if got, _ := agentCommand(dir); len(got) != 2 || got[1] != "agent" {
		t.Errorf("with cni-usernet: %q, want [cni-usernet agent]", got)
	}
	write("cni-usernet-agent")
	if got, _ := agentCommand(dir); len(got) != 1 || filepath.Base(got[0]) != "cni-usernet-agent" {
		t.Errorf("with cni-usernet-agent: %q, want it alone", got)
	}
}

// TestClusterPolicies: --cluster-policies adds Admin and Baseline
// ClusterNetworkPolicies in turn, and the event adds one whose subject is
// the first local pod's team.
func TestClusterPolicies(t *testing.T) {
	spec := clusters["1k"]
	spec.ClusterPolicies = 4
	c, err := newCluster(spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.CNPs) != 4 || c.CNPs[0].Spec.Tier != "Admin" || c.CNPs[1].Spec.Tier != "Baseline" || c.CNPs[0].Metadata.Namespace != "" {
		t.Fatalf("cluster policies %+v, want 4, Admin and Baseline in turn, cluster-scoped", c.CNPs)
	}
	ev, err := c.event(evClusterPolicy)
	if err != nil {
		t.Fatal(err)
	}
	p := ev.obj.(*clusterNetworkPolicy)
	lns := c.local[0] / spec.podsPerNS()
	if ev.resource != "clusternetworkpolicies" || ev.typ != "ADDED" || p.Spec.Subject.Namespaces.MatchLabels["team"] != team(lns) {
		t.Errorf("event %s %s selecting %v, want a new policy over %s", ev.resource, ev.typ, p.Spec.Subject.Namespaces, team(lns))
	}
	if !slices.ContainsFunc(servedKinds(true), func(k fakeapi.Kind) bool { return k.Resource == "clusternetworkpolicies" }) ||
		slices.ContainsFunc(servedKinds(false), func(k fakeapi.Kind) bool { return k.Resource == "clusternetworkpolicies" }) {
		t.Error("the ClusterNetworkPolicies are served when, and only when, the cluster has some")
	}
}
