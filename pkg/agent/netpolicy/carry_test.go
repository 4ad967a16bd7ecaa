package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// withExposedServices adds to s (with withServices' already there):
//   - y/lb: type LoadBalancer, cluster IP 10.96.1.1, external IP
//     203.0.113.7, load balancer IPs 198.51.100.1 (short-cut by
//     kube-proxy) and 198.51.100.2 (ipMode Proxy: not), a hostname;
//     port 443 (node port 30443) to y/b:8443;
//   - z/np: type NodePort, dual-stack, port 80 (node port 30080) to z/a:80;
//   - z/stale: type ClusterIP with a load balancer status left over and a
//     node port field set: neither is kube-proxy's any more.
func withExposedServices(s *Snapshot) {
	tcp := "TCP"
	p8443, p80 := int32(8443), int32(80)
	s.Services["y/lb"] = &Service{
		Metadata: ObjectMeta{Name: "lb", Namespace: "y"},
		Spec: ServiceSpec{Type: "LoadBalancer", ClusterIPs: []string{"10.96.1.1"}, ExternalIPs: []string{"203.0.113.7"},
			Ports: []ServicePort{{Name: "https", Port: 443, NodePort: 30443}}},
		Status: ServiceStatus{LoadBalancer: LoadBalancerStatus{Ingress: []LoadBalancerIngress{
			{IP: "198.51.100.1"}, {IP: "198.51.100.2", IPMode: "Proxy"}, {}}}},
	}
	https := "https"
	s.EndpointSlices["y/lb-1"] = &EndpointSlice{
		Metadata: ObjectMeta{Name: "lb-1", Namespace: "y", Labels: map[string]string{ServiceNameLabel: "lb"}}, AddressType: "IPv4",
		Endpoints: []Endpoint{{Addresses: []string{podAddr4("y", "b").String()}}},
		Ports:     []EndpointPort{{Name: &https, Port: &p8443, Protocol: &tcp}},
	}
	s.Services["z/np"] = &Service{
		Metadata: ObjectMeta{Name: "np", Namespace: "z"},
		Spec:     ServiceSpec{Type: "NodePort", ClusterIPs: []string{"10.96.1.2", "fd00:96::1:2"}, Ports: []ServicePort{{Port: 80, NodePort: 30080}}},
	}
	for _, fam := range []string{"IPv4", "IPv6"} {
		a := podAddr4("z", "a")
		if fam == "IPv6" {
			a = podAddr6("z", "a")
		}
		s.EndpointSlices["z/np-"+fam] = &EndpointSlice{
			Metadata: ObjectMeta{Name: "np-" + fam, Namespace: "z", Labels: map[string]string{ServiceNameLabel: "np"}}, AddressType: fam,
			Endpoints: []Endpoint{{Addresses: []string{a.String()}}}, Ports: []EndpointPort{{Port: &p80}},
		}
	}
	s.Services["z/stale"] = &Service{
		Metadata: ObjectMeta{Name: "stale", Namespace: "z"},
		Spec:     ServiceSpec{ClusterIPs: []string{"10.96.1.3"}, Ports: []ServicePort{{Port: 80, NodePort: 30081}}},
		Status:   ServiceStatus{LoadBalancer: LoadBalancerStatus{Ingress: []LoadBalancerIngress{{IP: "198.51.100.3"}}}},
	}
	s.EndpointSlices["z/stale-1"] = &EndpointSlice{
		Metadata: ObjectMeta{Name: "stale-1", Namespace: "z", Labels: map[string]string{ServiceNameLabel: "stale"}}, AddressType: "IPv4",
		Endpoints: []Endpoint{{Addresses: []string{podAddr4("z", "a").String()}}}, Ports: []EndpointPort{{Port: &p80}},
	}
}

// carryAll is what every egress-isolated pod carried before the carriage
// was made proportional: every entry, every ready backend.
func carryAll(s *Snapshot, node []netip.Addr) []policy.Service {
	var out []policy.Service
	for _, e := range newServiceTable(s).entries {
		if e.vip.Addr().IsValid() {
			out = append(out, policy.Service{Name: e.name, Protocol: e.proto, VIP: e.vip, Backends: e.backends})
			continue
		}
		for _, a := range node {
			if a.Is4() == e.v4 {
				out = append(out, policy.Service{Name: e.name, Protocol: e.proto, VIP: netip.AddrPortFrom(a, e.vip.Port()), Backends: e.backends})
			}
		}
	}
	return out
}

// outcome is the stack's decision on a new connection from the pod to
// dst: denied, or the destinations it may reach, by flow hash.
func outcome(t *testing.T, p *policy.PodPolicy, dst netip.AddrPort, proto policy.Protocol) string {
	t.Helper()
	m, err := policy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	be, isSvc, ok := m.ResolveService(dst, proto.Number(), 0)
	if !isSvc {
		if ok, _ := m.Allow(policy.Egress, dst.Addr(), proto.Number(), dst.Port()); ok {
			return "plain " + dst.String()
		}
		return "denied"
	}
	if !ok {
		return "denied"
	}
	// The backends it picks, over a few flow hashes.
	var picked []string
	for h := range uint32(8) {
		be, _, _ = m.ResolveService(dst, proto.Number(), h)
		picked = append(picked, be.String())
	}
	slices.Sort(picked)
	return "via " + strings.Join(slices.Compact(picked), " ")
}

// Carrying only the Services a pod's egress rules can reach changes no
// verdict: for every Service address and port, and every policy here
// (among them an ipBlock that holds the cluster IPs but excepts the pods'
// addresses), the stack decides what it decided with every Service
// carried.
func TestServicesCarriedChangeNoVerdict(t *testing.T) {
	egress := func(rules ...NetworkPolicyEgressRule) NetworkPolicySpec {
		return NetworkPolicySpec{PolicyTypes: []string{"Egress"}, Egress: rules}
	}
	to := func(ports []NetworkPolicyPort, peers ...NetworkPolicyPeer) NetworkPolicyEgressRule {
		return NetworkPolicyEgressRule{To: peers, Ports: ports}
	}
	tcp443 := []NetworkPolicyPort{numPort("", 443)}
	cases := map[string]NetworkPolicySpec{
		"deny all":                 egress(),
		"allow all":                egress(NetworkPolicyEgressRule{}),
		"y/a on 80":                egress(to([]NetworkPolicyPort{numPort("", 80)}, NetworkPolicyPeer{NamespaceSelector: labels("ns", "y"), PodSelector: labels("pod", "a")})),
		"DNS anywhere":             egress(to([]NetworkPolicyPort{numPort("UDP", 53)})),
		"the world but the pods":   egress(to(nil, block("0.0.0.0/0", "10.0.0.0/8"), block("::/0", "fd00::/16"))),
		"the VIPs but the pods":    egress(to(nil, block("10.96.0.0/16"), block("fd00:96::/64"))),
		"the node and y/b on 8443": egress(to(nil, block("192.168.0.10/32")), to([]NetworkPolicyPort{numPort("", 8443)}, NetworkPolicyPeer{NamespaceSelector: labels(), PodSelector: labels("pod", "b")})),
		"the node on 443 only":     egress(to(tcp443, block("192.168.0.0/24"))),
		"named port anywhere":      egress(to([]NetworkPolicyPort{namePort("", "serve-80-tcp")})),
		"z's pods on every port":   egress(to(nil, NetworkPolicyPeer{NamespaceSelector: labels("ns", "z")})),
	}
	for name, spec := range cases {
		t.Run(name, func(t *testing.T) {
			s := xyz()
			withServices(s)
			withExposedServices(s)
			addPolicies(s, netpol("x", "out", spec))
			c := NewCompiler(s, []LocalPod{{Pod: s.Pods["x/a"]}})
			r := c.CompilePod(LocalPod{Pod: s.Pods["x/a"]}, nodeAddrs, 1)
			ref := *r.Policy
			ref.Services = carryAll(s, nodeAddrs)
			if len(r.Policy.Services) > len(ref.Services) {
				t.Errorf("carries %d entries, more than the %d there are", len(r.Policy.Services), len(ref.Services))
			}
			for _, svc := range ref.Services {
				got, want := outcome(t, r.Policy, svc.VIP, svc.Protocol), outcome(t, &ref, svc.VIP, svc.Protocol)
				if got != want {
					t.Errorf("%s %s %s: got %s, want %s (every Service carried)", svc.Name, svc.Protocol, svc.VIP, got, want)
				}
			}
		})
	}
}

// A Service whose backends the rules all deny but whose cluster IP an
// allowed ipBlock holds is carried without backends, so that the stack
// denies it (kube-proxy would send it to a denied backend), and the
// Services the rules reach nothing of are not carried at all.
func TestServiceVIPInAllowedBlock(t *testing.T) {
	s := xyz()
	withServices(s)
	addPolicies(s, netpol("x", "world", NetworkPolicySpec{PolicyTypes: []string{"Egress"}, Egress: []NetworkPolicyEgressRule{{
		To: []NetworkPolicyPeer{block("0.0.0.0/0", "10.0.0.0/8"), block("10.96.0.0/16")},
	}}}))
	p, _ := NewCompiler(s, nil).Compile(LocalPod{Pod: s.Pods["x/a"]}, nodeAddrs, 1)
	var got []string
	for _, svc := range p.Services {
		got = append(got, fmt.Sprintf("%s %s backends=%d", svc.Name, svc.VIP, len(svc.Backends)))
	}
	want := []string{"y/web:dns 10.96.0.10:53 backends=0", "y/web:http 10.96.0.10:80 backends=0", "z/empty:8080 10.96.0.20:8080 backends=0"}
	if !slices.Equal(got, want) {
		t.Errorf("got services %q, want %q (IPv6: neither VIP nor backend reachable, not carried)", got, want)
	}
	if o := outcome(t, p, netip.MustParseAddrPort("10.96.0.10:80"), policy.TCP); o != "denied" {
		t.Errorf("web:http's cluster IP: got %s, want denied", o)
	}
	if o := outcome(t, p, netip.MustParseAddrPort("10.96.0.99:80"), policy.TCP); o != "plain 10.96.0.99:80" {
		t.Errorf("an address of the block that is no Service's: got %s, want allowed as itself", o)
	}
}

// External IPs, a load balancer's IPs (those kube-proxy short-cuts, of a
// LoadBalancer Service) and node ports on this node's addresses lead to
// the backends as cluster IPs do; another node's address at a node port
// is that address (its kube-proxy translates it, out of the pod's
// stack's sight), and a stale status or node port of a ClusterIP
// Service is nothing.
func TestServiceExternalLBNodePort(t *testing.T) {
	s := xyz()
	withExposedServices(s)
	addPolicies(s, netpol("x", "to-backends", NetworkPolicySpec{PolicyTypes: []string{"Egress"}, Egress: []NetworkPolicyEgressRule{{
		To: []NetworkPolicyPeer{{NamespaceSelector: labels(), PodSelector: labels("pod", "b")}, {NamespaceSelector: labels("ns", "z"), PodSelector: labels("pod", "a")}},
	}}}))
	p, _ := NewCompiler(s, nil).Compile(LocalPod{Pod: s.Pods["x/a"]}, nodeAddrs, 1)
	var got []string
	for _, svc := range p.Services {
		got = append(got, fmt.Sprintf("%s %s", svc.VIP, svc.Backends))
	}
	yb, za4, za6 := podAddr4("y", "b"), podAddr4("z", "a"), podAddr6("z", "a")
	want := []string{
		fmt.Sprintf("10.96.1.1:443 [{%s:8443}]", yb),
		fmt.Sprintf("10.96.1.2:80 [{%s:80}]", za4),
		fmt.Sprintf("10.96.1.3:80 [{%s:80}]", za4),
		fmt.Sprintf("192.168.0.10:30080 [{%s:80}]", za4),
		fmt.Sprintf("192.168.0.10:30443 [{%s:8443}]", yb),
		fmt.Sprintf("198.51.100.1:443 [{%s:8443}]", yb),
		fmt.Sprintf("203.0.113.7:443 [{%s:8443}]", yb),
		fmt.Sprintf("[fd00:96::1:2]:80 [{[%s]:80}]", za6),
		fmt.Sprintf("[fd00:ffff::10]:30080 [{[%s]:80}]", za6),
	}
	if !slices.Equal(got, want) {
		t.Errorf("got services\n%q\nwant\n%q", got, want)
	}
	for dst, want := range map[string]string{
		"203.0.113.7:443":       fmt.Sprintf("via %s:8443", yb),
		"198.51.100.1:443":      fmt.Sprintf("via %s:8443", yb),
		"198.51.100.2:443":      "denied", // ipMode Proxy: the load balancer itself, not allowed
		"198.51.100.3:80":       "denied", // a ClusterIP Service's stale status
		"192.168.0.10:30443":    fmt.Sprintf("via %s:8443", yb),
		"192.168.0.11:30443":    "denied", // another node: its address, not allowed
		"192.168.0.10:30081":    "denied", // a ClusterIP Service's node port field
		"[fd00:ffff::10]:30080": fmt.Sprintf("via [%s]:80", za6),
	} {
		ap := netip.MustParseAddrPort(dst)
		if o := outcome(t, p, ap, policy.TCP); o != want {
			t.Errorf("%s: got %s, want %s", dst, o, want)
		}
	}
}

// The Service table a pod carries grows with what its rules admit, not
// with the cluster: 1,000 Services of 5 backends each, and a pod allowed
// to one app and DNS carries those two Services' entries.
func TestServicesCarriedSize(t *testing.T) {
	s := xyz()
	p80, p53, udp := int32(80), int32(53), "UDP"
	for i := range 1000 {
		ns, name := "z", fmt.Sprintf("svc%d", i)
		app := fmt.Sprintf("app%d", i)
		port := ServicePort{Port: 80}
		if i == 0 {
			port = ServicePort{Port: 53, Protocol: "UDP"}
		}
		s.Services[ns+"/"+name] = &Service{Metadata: ObjectMeta{Name: name, Namespace: ns},
			Spec: ServiceSpec{ClusterIPs: []string{fmt.Sprintf("10.97.%d.%d", i/250, i%250+1)}, Ports: []ServicePort{port}}}
		var eps []Endpoint
		for j := range 5 {
			a := netip.AddrFrom4([4]byte{10, 50 + byte(i/250), byte(i % 250), byte(j + 1)})
			pod := &Pod{Metadata: ObjectMeta{Name: fmt.Sprintf("%s-%d", app, j), Namespace: ns, Labels: map[string]string{"app": app}},
				Status: PodStatus{Phase: "Running", PodIPs: []PodIP{{IP: a.String()}}}}
			s.Pods[ns+"/"+pod.Metadata.Name] = pod
			eps = append(eps, Endpoint{Addresses: []string{a.String()}})
		}
		es := &EndpointSlice{Metadata: ObjectMeta{Name: name + "-1", Namespace: ns, Labels: map[string]string{ServiceNameLabel: name}},
			AddressType: "IPv4", Endpoints: eps, Ports: []EndpointPort{{Port: &p80}}}
		if i == 0 {
			es.Ports = []EndpointPort{{Port: &p53, Protocol: &udp}}
		}
		s.EndpointSlices[ns+"/"+name+"-1"] = es
	}
	addPolicies(s, netpol("x", "narrow", NetworkPolicySpec{PolicyTypes: []string{"Egress"}, Egress: []NetworkPolicyEgressRule{
		{To: []NetworkPolicyPeer{{NamespaceSelector: labels("ns", "z"), PodSelector: labels("app", "app7")}}},
		{Ports: []NetworkPolicyPort{numPort("UDP", 53)}},
	}}))
	p, _ := NewCompiler(s, nil).Compile(LocalPod{Pod: s.Pods["x/a"]}, nodeAddrs, 1)
	var names []string
	backends := 0
	for _, svc := range p.Services {
		names = append(names, svc.Name)
		backends += len(svc.Backends)
	}
	if want := []string{"z/svc0:53", "z/svc7:80"}; !slices.Equal(names, want) || backends != 10 {
		t.Errorf("carried %q with %d backends, want %q with 10 (of %d entries in the cluster)", names, backends, want, len(carryAll(s, nodeAddrs)))
	}
	b, _ := policy.Marshal(p)
	all := *p
	all.Services = carryAll(s, nodeAddrs)
	ball, _ := policy.Marshal(&all)
	t.Logf("policy: %d bytes carried proportionally, %d with every Service", len(b), len(ball))
	if len(b)*20 > len(ball) {
		t.Errorf("policy of %d bytes, want under a twentieth of the %d every Service takes", len(b), len(ball))
	}
}
