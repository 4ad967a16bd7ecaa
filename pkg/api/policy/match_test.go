package policy_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

func peer(cidr string, except ...string) policy.Peer {
	p := policy.Peer{CIDR: pfx(cidr)}
	for _, e := range except {
		p.Except = append(p.Except, pfx(e))
	}
	return p
}

func ports(proto policy.Protocol, first, last uint16) policy.PortRange {
	return policy.PortRange{Protocol: proto, First: first, Last: last}
}

// isolated is a direction isolated by ns/a and ns/b with rules.
func isolated(rules ...policy.Rule) policy.Direction {
	return policy.Direction{Isolated: true, Policies: []string{"ns/a", "ns/b"}, Rules: rules}
}

type verdict struct {
	name  string
	dir   policy.Dir
	peer  string
	proto uint8
	port  uint16
	want  bool
}

func check(t *testing.T, p *policy.PodPolicy, cases []verdict) {
	t.Helper()
	p.Version = policy.FormatVersion
	m, err := policy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		got, label := m.Allow(c.dir, addr(c.peer), c.proto, c.port)
		if got != c.want {
			t.Errorf("%s: Allow(%s, %s, %d, %d) = %v, want %v", c.name, c.dir, c.peer, c.proto, c.port, got, c.want)
		}
		switch {
		case !got && label != "ns/a,ns/b":
			t.Errorf("%s: denied with label %q, want %q", c.name, label, "ns/a,ns/b")
		case got && label != "":
			t.Errorf("%s: allowed with label %q, want none", c.name, label)
		}
	}
}

const (
	tcp   = policy.ProtoTCP
	udp   = policy.ProtoUDP
	sctp  = policy.ProtoSCTP
	icmp  = policy.ProtoICMP
	icmp6 = policy.ProtoICMPv6
)

func TestNotIsolatedAllowsEverything(t *testing.T) {
	// Rules without isolation allow everything, as Kubernetes does: the
	// rules of a direction no policy selects the pod for do not exist.
	p := &policy.PodPolicy{Ingress: policy.Direction{Rules: []policy.Rule{{Peers: []policy.Peer{peer("10.0.0.0/8")}}}}}
	check(t, p, []verdict{
		{"ingress tcp", policy.Ingress, "192.0.2.1", tcp, 80, true},
		{"egress udp", policy.Egress, "2001:db8::1", udp, 53, true},
		{"ingress icmp", policy.Ingress, "192.0.2.1", icmp, 0, true},
	})
}

func TestDefaultDeny(t *testing.T) {
	p := &policy.PodPolicy{Ingress: isolated(), Egress: isolated()}
	check(t, p, []verdict{
		{"tcp in", policy.Ingress, "10.1.2.3", tcp, 80, false},
		{"udp in", policy.Ingress, "fd00::3", udp, 53, false},
		{"icmp in", policy.Ingress, "10.1.2.3", icmp, 0, false},
		{"tcp out", policy.Egress, "10.1.2.3", tcp, 443, false},
		{"icmpv6 out", policy.Egress, "fd00::3", icmp6, 0, false},
	})
}

func TestNodeAlwaysAllowedIn(t *testing.T) {
	p := &policy.PodPolicy{Ingress: isolated(), Egress: isolated(),
		Node: []netip.Addr{addr("10.0.0.1"), addr("fd00::1")}}
	check(t, p, []verdict{
		{"node v4 tcp", policy.Ingress, "10.0.0.1", tcp, 8080, true},
		{"node v6 icmp", policy.Ingress, "fd00::1", icmp6, 0, true},
		{"node v4-mapped", policy.Ingress, "::ffff:10.0.0.1", udp, 9, true},
		{"other", policy.Ingress, "10.0.0.2", tcp, 8080, false},
		// Only in: the pod reaching the node is egress like any other.
		{"to node", policy.Egress, "10.0.0.1", tcp, 8080, false},
	})
}

func TestPeersCIDRExcept(t *testing.T) {
	p := &policy.PodPolicy{Ingress: isolated(policy.Rule{Policy: "ns/a", Peers: []policy.Peer{
		peer("10.0.0.0/16", "10.0.5.0/24", "10.0.7.128/25"),
		peer("fd00:1::/48", "fd00:1:0:2::/64"),
		peer("192.168.1.7/32"),
	}})}
	check(t, p, []verdict{
		{"in cidr", policy.Ingress, "10.0.4.255", tcp, 1, true},
		{"first of cidr", policy.Ingress, "10.0.0.0", tcp, 1, true},
		{"last of cidr", policy.Ingress, "10.0.255.255", tcp, 1, true},
		{"in except", policy.Ingress, "10.0.5.9", tcp, 1, false},
		{"first of except", policy.Ingress, "10.0.5.0", tcp, 1, false},
		{"last of except", policy.Ingress, "10.0.5.255", tcp, 1, false},
		{"after except", policy.Ingress, "10.0.6.0", tcp, 1, true},
		{"before second except", policy.Ingress, "10.0.7.127", tcp, 1, true},
		{"in second except", policy.Ingress, "10.0.7.200", tcp, 1, false},
		{"outside", policy.Ingress, "10.1.0.0", tcp, 1, false},
		{"v6 in", policy.Ingress, "fd00:1:0:1::9", udp, 53, true},
		{"v6 except", policy.Ingress, "fd00:1:0:2::9", udp, 53, false},
		{"v6 after except", policy.Ingress, "fd00:1:0:3::", udp, 53, true},
		{"v6 outside", policy.Ingress, "fd00:2::1", udp, 53, false},
		{"host", policy.Ingress, "192.168.1.7", tcp, 22, true},
		{"next to host", policy.Ingress, "192.168.1.8", tcp, 22, false},
		// A rule without ports allows every protocol, ICMP included.
		{"icmp from peer", policy.Ingress, "10.0.1.1", icmp, 0, true},
		{"icmpv6 from peer", policy.Ingress, "fd00:1::1", icmp6, 0, true},
		{"sctp from peer", policy.Ingress, "10.0.1.1", sctp, 9, true},
		{"icmp from except", policy.Ingress, "10.0.5.1", icmp, 0, false},
		// The other family's table is not consulted.
		{"v4 address in v6 slot", policy.Ingress, "253.0.0.1", tcp, 1, false},
	})
}

func TestExceptLargerThanCIDRAndOverlapping(t *testing.T) {
	p := &policy.PodPolicy{Egress: isolated(policy.Rule{Peers: []policy.Peer{
		peer("10.0.0.0/24", "10.0.0.0/25", "10.0.0.64/26", "10.0.0.200/32"),
		peer("10.9.0.0/24", "10.0.0.0/8"), // wholly excepted
		peer("0.0.0.0/0", "0.0.0.0/1"),
		peer("::/0", "::/1"),
	}})}
	check(t, p, []verdict{
		{"in both excepts", policy.Egress, "10.0.0.70", tcp, 1, false},
		{"after excepts", policy.Egress, "10.0.0.128", tcp, 1, true},
		{"host except", policy.Egress, "10.0.0.200", tcp, 1, false},
		{"after host except", policy.Egress, "10.0.0.201", tcp, 1, true},
		{"wholly excepted", policy.Egress, "10.9.0.1", tcp, 1, false},
		{"upper half", policy.Egress, "200.0.0.1", tcp, 1, true},
		{"top address", policy.Egress, "255.255.255.255", tcp, 1, true},
		{"v6 upper half", policy.Egress, "ffff::1", tcp, 1, true},
		{"v6 top", policy.Egress, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", tcp, 1, true},
		{"v6 lower half", policy.Egress, "2001:db8::1", tcp, 1, false},
	})
}

func TestPorts(t *testing.T) {
	p := &policy.PodPolicy{Ingress: isolated(
		policy.Rule{Policy: "ns/a", Ports: []policy.PortRange{ports(policy.TCP, 80, 0), ports(policy.UDP, 53, 53)}},
		policy.Rule{Policy: "ns/b", Peers: []policy.Peer{peer("10.0.0.0/8")},
			Ports: []policy.PortRange{ports(policy.TCP, 8000, 8099), ports(policy.SCTP, 0, 0)}},
		policy.Rule{Policy: "ns/b", Peers: []policy.Peer{peer("fd00::/8")},
			Ports: []policy.PortRange{ports(policy.TCP, 8050, 9000), ports(policy.UDP, 0, 0)}},
	)}
	check(t, p, []verdict{
		{"port 80 anyone", policy.Ingress, "192.0.2.1", tcp, 80, true},
		{"port 81", policy.Ingress, "192.0.2.1", tcp, 81, false},
		{"port 80 udp", policy.Ingress, "192.0.2.1", udp, 80, false},
		{"udp 53", policy.Ingress, "2001:db8::1", udp, 53, true},
		{"tcp 53", policy.Ingress, "2001:db8::1", tcp, 53, false},
		{"range first", policy.Ingress, "10.1.1.1", tcp, 8000, true},
		{"range last", policy.Ingress, "10.1.1.1", tcp, 8099, true},
		{"range after", policy.Ingress, "10.1.1.1", tcp, 8100, false},
		{"range before", policy.Ingress, "10.1.1.1", tcp, 7999, false},
		{"range wrong peer", policy.Ingress, "11.1.1.1", tcp, 8010, false},
		{"overlapping range v6", policy.Ingress, "fd00::5", tcp, 8060, true},
		{"overlapping range v6 end", policy.Ingress, "fd00::5", tcp, 9000, true},
		{"overlapping range v4 beyond its own", policy.Ingress, "10.1.1.1", tcp, 8500, false},
		{"v6 below its range", policy.Ingress, "fd00::5", tcp, 8010, false},
		{"sctp all ports", policy.Ingress, "10.2.2.2", sctp, 36412, true},
		{"sctp wrong peer", policy.Ingress, "fd00::5", sctp, 36412, false},
		{"udp all ports v6", policy.Ingress, "fd00::5", udp, 40000, true},
		{"udp all ports wrong peer", policy.Ingress, "10.2.2.2", udp, 40000, false},
		// ICMP has no port: only a rule without ports allows it.
		{"icmp with port rules", policy.Ingress, "10.2.2.2", icmp, 0, false},
		{"icmpv6 with port rules", policy.Ingress, "fd00::5", icmp6, 0, false},
		{"other protocol", policy.Ingress, "10.2.2.2", 47, 0, false},
	})
}

func TestNestedRanges(t *testing.T) {
	// A long range that starts first must still be found behind shorter
	// ones that start later and end before the port.
	p := &policy.PodPolicy{Egress: isolated(
		policy.Rule{Peers: []policy.Peer{peer("10.0.0.1/32")}, Ports: []policy.PortRange{ports(policy.TCP, 100, 60000)}},
		policy.Rule{Peers: []policy.Peer{peer("10.0.0.2/32")}, Ports: []policy.PortRange{ports(policy.TCP, 200, 300)}},
		policy.Rule{Peers: []policy.Peer{peer("10.0.0.3/32")}, Ports: []policy.PortRange{ports(policy.TCP, 400, 500)}},
	)}
	check(t, p, []verdict{
		{"long range behind short ones", policy.Egress, "10.0.0.1", tcp, 1000, true},
		{"short range", policy.Egress, "10.0.0.2", tcp, 250, true},
		{"short range past its end", policy.Egress, "10.0.0.2", tcp, 450, false},
		{"long range end", policy.Egress, "10.0.0.1", tcp, 60000, true},
		{"long range after end", policy.Egress, "10.0.0.1", tcp, 60001, false},
	})
}

func TestUnionOfRules(t *testing.T) {
	// Two policies select the pod: what either allows is allowed.
	p := &policy.PodPolicy{Egress: isolated(
		policy.Rule{Policy: "ns/a", Peers: []policy.Peer{peer("10.0.0.0/24")}, Ports: []policy.PortRange{ports(policy.TCP, 5432, 0)}},
		policy.Rule{Policy: "ns/b", Peers: []policy.Peer{peer("10.0.0.0/16", "10.0.0.0/24")}},
		policy.Rule{Policy: "ns/b", Peers: []policy.Peer{peer("10.0.0.0/24")}, Ports: []policy.PortRange{ports(policy.UDP, 53, 0)}},
	)}
	check(t, p, []verdict{
		{"first rule", policy.Egress, "10.0.0.5", tcp, 5432, true},
		{"third rule", policy.Egress, "10.0.0.5", udp, 53, true},
		{"neither", policy.Egress, "10.0.0.5", tcp, 80, false},
		{"second rule, any port", policy.Egress, "10.0.1.5", tcp, 80, true},
		{"second rule, icmp", policy.Egress, "10.0.1.5", icmp, 0, true},
		{"excepted from second, icmp", policy.Egress, "10.0.0.5", icmp, 0, false},
	})
}

func TestIngressAndEgressIndependent(t *testing.T) {
	p := &policy.PodPolicy{Ingress: isolated(), Egress: isolated(policy.Rule{Peers: []policy.Peer{peer("10.0.0.0/8")}})}
	check(t, p, []verdict{
		{"egress allowed", policy.Egress, "10.0.0.5", tcp, 80, true},
		{"ingress from same peer", policy.Ingress, "10.0.0.5", tcp, 80, false},
	})
	p = &policy.PodPolicy{Egress: isolated()}
	check(t, p, []verdict{
		{"ingress not isolated", policy.Ingress, "10.0.0.5", tcp, 80, true},
		{"egress denied", policy.Egress, "10.0.0.5", tcp, 80, false},
	})
}

func TestResolveService(t *testing.T) {
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	vip6 := netip.MustParseAddrPort("[fd00:96::10]:53")
	b := func(s string) policy.Backend { return policy.Backend{Addr: netip.MustParseAddrPort(s)} }
	p := &policy.PodPolicy{
		Version: policy.FormatVersion,
		Egress: isolated(policy.Rule{Peers: []policy.Peer{peer("10.1.0.0/16"), peer("fd00:1::/64")},
			Ports: []policy.PortRange{ports(policy.TCP, 8080, 0), ports(policy.UDP, 5353, 0)}}),
		Services: []policy.Service{
			{Name: "ns/web:http", Protocol: policy.TCP, VIP: vip,
				Backends: []policy.Backend{b("10.2.0.1:8080"), b("10.1.0.1:8080"), b("10.1.0.2:8080"), b("10.1.0.3:9999")}},
			{Name: "ns/dns:dns", Protocol: policy.UDP, VIP: vip6, Backends: []policy.Backend{b("[fd00:1::5]:5353")}},
			{Name: "ns/closed:http", Protocol: policy.TCP, VIP: netip.MustParseAddrPort("10.96.0.11:80"),
				Backends: []policy.Backend{b("10.2.0.1:8080")}},
			{Name: "ns/empty:http", Protocol: policy.TCP, VIP: netip.MustParseAddrPort("10.96.0.12:80")},
		},
	}
	m, err := policy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[netip.AddrPort]bool{}
	for h := range uint32(64) {
		be, isSvc, ok := m.ResolveService(vip, tcp, h)
		if !isSvc || !ok {
			t.Fatalf("hash %d: isService %v ok %v, want true true", h, isSvc, ok)
		}
		if allowed, _ := m.Allow(policy.Egress, be.Addr(), tcp, be.Port()); !allowed {
			t.Fatalf("hash %d: got backend %s, which the rules deny", h, be)
		}
		if again, _, _ := m.ResolveService(vip, tcp, h); again != be {
			t.Fatalf("hash %d: got %s then %s, want the same backend for one flow", h, be, again)
		}
		seen[be] = true
	}
	if len(seen) != 2 {
		t.Errorf("got backends %v, want both allowed ones used", seen)
	}
	if be, isSvc, ok := m.ResolveService(vip6, udp, 7); !isSvc || !ok || be != netip.MustParseAddrPort("[fd00:1::5]:5353") {
		t.Errorf("v6 UDP service: got %s %v %v", be, isSvc, ok)
	}
	if _, isSvc, ok := m.ResolveService(vip6, tcp, 7); isSvc || !ok {
		t.Errorf("service of another protocol: isService %v ok %v, want false true", isSvc, ok)
	}
	for _, v := range []string{"10.96.0.11:80", "10.96.0.12:80"} {
		if _, isSvc, ok := m.ResolveService(netip.MustParseAddrPort(v), tcp, 1); !isSvc || ok {
			t.Errorf("%s: isService %v ok %v, want true false (no allowed backend: deny)", v, isSvc, ok)
		}
	}
	other := netip.MustParseAddrPort("10.1.0.9:8080")
	if be, isSvc, ok := m.ResolveService(other, tcp, 1); isSvc || !ok || be != other {
		t.Errorf("not a VIP: got %s %v %v, want itself, false, true", be, isSvc, ok)
	}
	// Not isolated: no resolution, whatever Services says.
	p.Egress = policy.Direction{}
	m, _ = policy.Compile(p)
	if be, isSvc, ok := m.ResolveService(vip, tcp, 1); isSvc || !ok || be != vip {
		t.Errorf("egress open: got %s %v %v, want the VIP, false, true", be, isSvc, ok)
	}
}

func TestUnmarshalRoundTrip(t *testing.T) {
	p := &policy.PodPolicy{Version: policy.FormatVersion, Generation: 3,
		Ingress: isolated(policy.Rule{Policy: "ns/a", Peers: []policy.Peer{peer("10.0.0.0/8", "10.1.0.0/16")},
			Ports: []policy.PortRange{ports(policy.TCP, 80, 90)}}),
		Node: []netip.Addr{addr("10.0.0.1")}}
	b, err := policy.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	q, err := policy.Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !policy.Equal(p, q) || q.Generation != 3 {
		t.Fatalf("round trip: got %+v, want %+v", q, p)
	}
	for _, bad := range []string{
		`{"version":3}`,
		`{"version":1,"ingress":{"isolated":true,"rules":[{"ports":[{"protocol":"ICMP"}]}]}}`,
		`{"version":1,"ingress":{"isolated":true,"rules":[{"ports":[{"protocol":"TCP","first":90,"last":80}]}]}}`,
		`{"version":1,"ingress":{"isolated":true,"rules":[{"ports":[{"protocol":"TCP","last":80}]}]}}`,
		`{"version":1,"egress":{"isolated":true,"rules":[{"peers":[{"cidr":"10.0.0.0/8","except":["fd00::/8"]}]}]}}`,
		`{"version":1,"egress":{"isolated":true,"rules":[{"peers":[{}]}]}}`,
		`{"version":1,"services":[{"protocol":"TCP"}]}`,
		`{"version":1,"services":[{"protocol":"TCP","vip":"10.96.0.1:80","backends":[{}]}]}`,
		`{"version":1,"generation":-1}`,
		`not json`,
	} {
		if _, err := policy.Unmarshal([]byte(bad)); err == nil {
			t.Errorf("Unmarshal(%s): no error", bad)
		}
	}
}

// thousandRules is a policy of n ingress rules as the agent compiles a
// large namespace's: each from a /24 of pods (less one address) to one
// port, every tenth to a port range, the last one allowing last.
func thousandRules(n int, last netip.Addr) *policy.PodPolicy {
	d := policy.Direction{Isolated: true, Policies: []string{"ns/big"}}
	for i := range n - 1 {
		r := policy.Rule{Policy: "ns/big", Peers: []policy.Peer{{
			CIDR:   netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + i/250), byte(i % 250), 0}), 24),
			Except: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + i/250), byte(i % 250), 9}), 32)},
		}}}
		pr := policy.PortRange{Protocol: policy.TCP, First: uint16(1000 + i)}
		if i%10 == 0 {
			pr.Last = pr.First + 50
		}
		r.Ports = []policy.PortRange{pr}
		d.Rules = append(d.Rules, r)
	}
	d.Rules = append(d.Rules, policy.Rule{Policy: "ns/big", Peers: []policy.Peer{{CIDR: netip.PrefixFrom(last, last.BitLen())}}})
	return &policy.PodPolicy{Version: policy.FormatVersion, Ingress: d, Egress: d}
}

func TestThousandRules(t *testing.T) {
	m, err := policy.Compile(thousandRules(1000, addr("192.168.9.9")))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []verdict{
		{"last rule", policy.Ingress, "192.168.9.9", tcp, 5201, true},
		{"rule 500's port", policy.Ingress, "10.102.0.1", tcp, 1500, true},
		{"rule 500's except", policy.Ingress, "10.102.0.9", tcp, 1500, false},
		{"rule 501's peer, rule 502's port", policy.Ingress, "10.102.1.1", tcp, 1502, false},
		{"rule 490's range", policy.Ingress, "10.101.240.3", tcp, 1530, true},
		{"nobody", policy.Ingress, "172.16.0.1", tcp, 1500, false},
	} {
		if got, _ := m.Allow(c.dir, addr(c.peer), c.proto, c.port); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

// BenchmarkAllow1000 is one new flow's verdict against a 1,000-rule
// policy: allowed by the last rule (every table consulted), and denied.
func BenchmarkAllow1000(b *testing.B) {
	peerAddr := addr("192.168.9.9")
	m, err := policy.Compile(thousandRules(1000, peerAddr))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		peer netip.Addr
		port uint16
		want bool
	}{
		{"allowed-last-rule", peerAddr, 5201, true},
		{"allowed-range", addr("10.101.240.3"), 1530, true},
		{"denied", addr("172.16.0.1"), 1500, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ok, _ := m.Allow(policy.Ingress, c.peer, tcp, c.port); ok != c.want {
					b.Fatal("wrong verdict")
				}
			}
		})
	}
}

// BenchmarkCompile1000 is what a push of a 1,000-rule policy costs the
// stack before the swap.
func BenchmarkCompile1000(b *testing.B) {
	p := thousandRules(1000, addr("192.168.9.9"))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := policy.Compile(p); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzUnmarshal(f *testing.F) {
	seed, _ := policy.Marshal(thousandRules(3, addr("192.168.9.9")))
	f.Add(seed)
	f.Add([]byte(`{"version":1,"ingress":{"isolated":true,"rules":[{"peers":[{"cidr":"::/0","except":["::/1","8000::/2"]}],"ports":[{"protocol":"UDP","first":1,"last":65535}]}]},"node":["10.0.0.1"]}`))
	f.Add([]byte(`{"version":1,"egress":{"isolated":true},"services":[{"protocol":"TCP","vip":"10.96.0.1:443","backends":[{"addr":"10.0.0.1:6443"}]}]}`))
	probes := []netip.Addr{addr("0.0.0.0"), addr("10.0.0.1"), addr("255.255.255.255"), addr("::"), addr("fd00::1"), addr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := policy.Unmarshal(b)
		if err != nil {
			return
		}
		m, err := policy.Compile(p)
		if err != nil {
			t.Fatalf("Unmarshal accepted what Compile refuses: %v", err)
		}
		for _, a := range probes {
			for _, proto := range []uint8{tcp, udp, sctp, icmp} {
				for _, port := range []uint16{0, 1, 80, 65535} {
					m.Allow(policy.Ingress, a, proto, port)
					m.Allow(policy.Egress, a, proto, port)
				}
			}
			m.ResolveService(netip.AddrPortFrom(a, 80), tcp, 7)
		}
		again, err := policy.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		q, err := policy.Unmarshal(again)
		if err != nil {
			t.Fatalf("re-reading what was written: %v\n%s", err, again)
		}
		if !policy.Equal(p, q) {
			t.Fatalf("round trip changed the policy:\n%s", again)
		}
	})
}

func Example() {
	p := &policy.PodPolicy{Version: policy.FormatVersion, Ingress: policy.Direction{Isolated: true,
		Policies: []string{"shop/db-ingress"}, Rules: []policy.Rule{{Policy: "shop/db-ingress",
			Peers: []policy.Peer{{CIDR: netip.MustParsePrefix("10.244.0.0/16")}},
			Ports: []policy.PortRange{{Protocol: policy.TCP, First: 5432}}}}}}
	m, _ := policy.Compile(p)
	ok, _ := m.Allow(policy.Ingress, netip.MustParseAddr("10.244.3.7"), policy.ProtoTCP, 5432)
	fmt.Println(ok)
	ok, label := m.Allow(policy.Ingress, netip.MustParseAddr("10.245.0.1"), policy.ProtoTCP, 5432)
	fmt.Println(ok, label)
	// Output:
	// true
	// false shop/db-ingress
}
