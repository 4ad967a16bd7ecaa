package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

// A rule that admits a run of pods' addresses carries them as the
// prefixes that hold exactly them, not one host prefix each.
func TestPeersAggregated(t *testing.T) {
	s := &Snapshot{Pods: map[string]*Pod{}, Namespaces: map[string]*Namespace{"web": {Metadata: ObjectMeta{Name: "web"}}}}
	for i := range 256 {
		p := &Pod{Metadata: ObjectMeta{Name: fmt.Sprint("client-", i), Namespace: "web", Labels: map[string]string{"role": "client"}},
			Status: PodStatus{Phase: "Running", PodIPs: []PodIP{{IP: netip.AddrFrom4([4]byte{10, 5, 0, byte(i)}).String()}}}}
		s.Pods["web/"+p.Metadata.Name] = p
	}
	// One client gone from the run: its address stays out.
	delete(s.Pods, "web/client-7")
	server := &Pod{Metadata: ObjectMeta{Name: "server", Namespace: "web", Labels: map[string]string{"role": "server"}},
		Status: PodStatus{Phase: "Running", PodIPs: []PodIP{{IP: "10.6.0.1"}}}}
	s.Pods["web/server"] = server
	s.Policies = map[string]*NetworkPolicy{"web/clients": netpol("web", "clients", NetworkPolicySpec{
		PodSelector: *labels("role", "server"),
		Ingress:     []NetworkPolicyIngressRule{{From: []NetworkPolicyPeer{{PodSelector: labels("role", "client")}}}},
	})}
	p := Compile(s, LocalPod{Pod: server}, nil, 1)
	if len(p.Ingress.Rules) != 1 {
		t.Fatalf("rules: %+v", p.Ingress.Rules)
	}
	var got []string
	for _, peer := range p.Ingress.Rules[0].Peers {
		got = append(got, peer.CIDR.String())
	}
	want := []string{"10.5.0.0/30", "10.5.0.4/31", "10.5.0.6/32", "10.5.0.8/29", "10.5.0.16/28", "10.5.0.32/27", "10.5.0.64/26", "10.5.0.128/25"}
	if !slices.Equal(got, want) {
		t.Errorf("peers: got %v, want %v", got, want)
	}
}
