package netpolicy

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// withServices adds to s:
//   - y/web: dual-stack, http 80/TCP to y/a, y/b (y/c not ready) and dns
//     53/UDP to y/a only; one slice per family, an FQDN slice ignored;
//   - y/headless (None), z/empty (no endpoints), z/external (no cluster
//     IP) and a slice labelled for a Service that does not exist.
func withServices(s *Snapshot) {
	s.Services["y/web"] = &Service{
		Metadata: ObjectMeta{Name: "web", Namespace: "y"},
		Spec: ServiceSpec{
			ClusterIPs: []string{"10.96.0.10", "fd00:96::10"},
			Ports:      []ServicePort{{Name: "http", Port: 80}, {Name: "dns", Port: 53, Protocol: "UDP"}},
		},
	}
	s.Services["y/headless"] = &Service{
		Metadata: ObjectMeta{Name: "headless", Namespace: "y"},
		Spec:     ServiceSpec{ClusterIPs: []string{"None"}, Ports: []ServicePort{{Port: 80}}},
	}
	s.Services["z/empty"] = &Service{
		Metadata: ObjectMeta{Name: "empty", Namespace: "z"},
		Spec:     ServiceSpec{ClusterIPs: []string{"10.96.0.20"}, Ports: []ServicePort{{Port: 8080, Protocol: "SCTP"}}},
	}
	s.Services["z/external"] = &Service{Metadata: ObjectMeta{Name: "external", Namespace: "z"}}
	http, dns := "http", "dns"
	tcp, udp := "TCP", "UDP"
	p80, p53 := int32(80), int32(53)
	ready, notReady := true, false
	svcLabel := func(name string) ObjectMeta {
		return ObjectMeta{Namespace: "y", Labels: map[string]string{ServiceNameLabel: name}}
	}
	s.EndpointSlices["y/web-v4"] = &EndpointSlice{
		Metadata:    svcLabel("web"),
		AddressType: "IPv4",
		Endpoints: []Endpoint{
			{Addresses: []string{podAddr4("y", "b").String()}, Conditions: EndpointConditions{Ready: &ready}},
			{Addresses: []string{podAddr4("y", "a").String()}},
			{Addresses: []string{podAddr4("y", "c").String()}, Conditions: EndpointConditions{Ready: &notReady}},
			{Addresses: []string{"fd00:2::1", "not-an-address"}},
		},
		Ports: []EndpointPort{{Name: &http, Port: &p80, Protocol: &tcp}},
	}
	s.EndpointSlices["y/web-v4-dns"] = &EndpointSlice{
		Metadata:    svcLabel("web"),
		AddressType: "IPv4",
		Endpoints:   []Endpoint{{Addresses: []string{podAddr4("y", "a").String()}}},
		Ports:       []EndpointPort{{Name: &dns, Port: &p53, Protocol: &udp}, {Name: &http, Port: &p53, Protocol: &udp}},
	}
	s.EndpointSlices["y/web-v6"] = &EndpointSlice{
		Metadata:    svcLabel("web"),
		AddressType: "IPv6",
		Endpoints:   []Endpoint{{Addresses: []string{podAddr6("y", "a").String()}}},
		Ports:       []EndpointPort{{Name: &http, Port: &p80}},
	}
	s.EndpointSlices["y/web-fqdn"] = &EndpointSlice{
		Metadata:    svcLabel("web"),
		AddressType: "FQDN",
		Endpoints:   []Endpoint{{Addresses: []string{"10.9.9.9"}}},
		Ports:       []EndpointPort{{Name: &http, Port: &p80}},
	}
	s.EndpointSlices["y/gone"] = &EndpointSlice{
		Metadata:    svcLabel("gone"),
		AddressType: "IPv4",
		Endpoints:   []Endpoint{{Addresses: []string{"10.9.9.8"}}},
		Ports:       []EndpointPort{{Port: &p80}},
	}
}

func TestServices(t *testing.T) {
	s := xyz()
	withServices(s)
	addPolicies(s,
		netpol("x", "a-to-y-a-http", NetworkPolicySpec{
			PodSelector: *labels("pod", "a"),
			PolicyTypes: []string{"Egress"},
			Egress: []NetworkPolicyEgressRule{{
				To:    []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "y"), PodSelector: labels("pod", "a")}},
				Ports: []NetworkPolicyPort{numPort("", 80)},
			}},
		}),
		netpol("x", "b-ingress-only", NetworkPolicySpec{PodSelector: *labels("pod", "b")}),
	)
	ps, warnings := compileAll(t, s)
	if len(warnings) > 0 {
		t.Errorf("got warnings %v, want none", warnings)
	}
	for _, pod := range []string{"x/b", "x/c", "y/a"} {
		if ps[pod].Services != nil {
			t.Errorf("%s: egress not isolated, got services %v, want none", pod, ps[pod].Services)
		}
	}
	be := func(a netip.Addr, port uint16) policy.Backend {
		return policy.Backend{Addr: netip.AddrPortFrom(a, port)}
	}
	vip4, vip6 := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")
	// x/a's egress admits y/a on port 80 alone: it carries web:http with
	// that backend, and nothing else (the Services its rules cannot reach
	// used to be carried too, every backend included).
	want := []policy.Service{
		{Name: "y/web:http", Protocol: "TCP", VIP: netip.AddrPortFrom(vip4, 80), Backends: []policy.Backend{be(podAddr4("y", "a"), 80)}},
		{Name: "y/web:http", Protocol: "TCP", VIP: netip.AddrPortFrom(vip6, 80), Backends: []policy.Backend{be(podAddr6("y", "a"), 80)}},
	}
	got := ps["x/a"].Services
	if !slices.EqualFunc(got, want, func(a, b policy.Service) bool {
		return a.Name == b.Name && a.Protocol == b.Protocol && a.VIP == b.VIP && slices.Equal(a.Backends, b.Backends)
	}) {
		t.Errorf("got services\n%+v\nwant\n%+v", got, want)
	}

	// The stack's verdict on a connection to a VIP is the one on the
	// backend it resolves it to: x/a reaches web:http through y/a only.
	var allowed []policy.Backend
	for _, svc := range got {
		for _, b := range svc.Backends {
			if allows(&ps["x/a"].Egress, b.Addr.Addr(), svc.Protocol, b.Addr.Port()) {
				allowed = append(allowed, b)
			}
		}
	}
	if wantAllowed := []policy.Backend{be(podAddr4("y", "a"), 80), be(podAddr6("y", "a"), 80)}; !slices.Equal(allowed, wantAllowed) {
		t.Errorf("got allowed backends %v, want %v", allowed, wantAllowed)
	}
}

func TestServiceBadInput(t *testing.T) {
	s := xyz()
	s.Services["y/bad"] = &Service{
		Metadata: ObjectMeta{Name: "bad", Namespace: "y"},
		Spec: ServiceSpec{
			ClusterIPs: []string{"10.96.0.300", "", "10.96.0.30"},
			Ports:      []ServicePort{{Name: "icmp", Port: 1, Protocol: "ICMP"}, {Name: "zero"}, {Name: "ok", Port: 443}},
		},
	}
	// Egress to everywhere: the one usable address is carried (without
	// backends: it has none, and is denied as kube-proxy would reject it).
	addPolicies(s, netpol("x", "all-egress", NetworkPolicySpec{PolicyTypes: []string{"Egress"}, Egress: []NetworkPolicyEgressRule{{}}}))
	ps, warnings := compileAll(t, s)
	if got := ps["x/a"].Services; len(got) != 1 || got[0].VIP != netip.MustParseAddrPort("10.96.0.30:443") || len(got[0].Backends) != 0 {
		t.Errorf("got services %+v, want 10.96.0.30:443 alone, without backends", got)
	}
	if len(warnings) == 0 {
		t.Error("got no warning for the bad cluster IP and ports")
	}
}
