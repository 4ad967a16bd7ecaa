package noderoutes

import (
	"net"
	"net/netip"
	"reflect"
	"testing"
)

func node(name string, ips []string, cidrs ...string) Node {
	n := Node{Name: name}
	for _, s := range ips {
		n.InternalIPs = append(n.InternalIPs, netip.MustParseAddr(s))
	}
	for _, s := range cidrs {
		n.PodCIDRs = append(n.PodCIDRs, netip.MustParsePrefix(s))
	}
	return n
}

// direct is the route EncapNever plans: today's host-gw route.
func direct(dst, via, node string) Route {
	return Route{Dst: netip.MustParsePrefix(dst), Via: netip.MustParseAddr(via), Node: node, Kind: Direct, Reason: "encapsulation never"}
}

func TestPlan(t *testing.T) {
	p := netip.MustParsePrefix
	for _, c := range []struct {
		name   string
		nodes  []Node
		routes []Route
		probs  []Problem
	}{
		{"alone", []Node{node("a", []string{"10.0.0.1"}, "10.244.0.0/24")}, nil, nil},
		{"self absent from the list", []Node{node("b", []string{"10.0.0.2"}, "10.244.1.0/24")},
			[]Route{direct("10.244.1.0/24", "10.0.0.2", "b")}, nil},
		{"dual stack, sorted by destination",
			[]Node{
				node("a", []string{"10.0.0.1", "fd00::1"}, "10.244.0.0/24", "fd10::/64"),
				node("c", []string{"fd00::3", "10.0.0.3"}, "10.244.2.0/24", "fd10:0:0:2::/64"),
				node("b", []string{"10.0.0.2", "fd00::2"}, "10.244.1.0/24", "fd10:0:0:1::/64"),
			},
			[]Route{
				direct("10.244.1.0/24", "10.0.0.2", "b"),
				direct("10.244.2.0/24", "10.0.0.3", "c"),
				direct("fd10:0:0:1::/64", "fd00::2", "b"),
				direct("fd10:0:0:2::/64", "fd00::3", "c"),
			}, nil},
		{"no InternalIP of the family",
			[]Node{node("a", []string{"10.0.0.1"}, "10.244.0.0/24"), node("b", []string{"10.0.0.2"}, "10.244.1.0/24", "fd10:0:0:1::/64")},
			[]Route{direct("10.244.1.0/24", "10.0.0.2", "b")},
			[]Problem{{"b", p("fd10:0:0:1::/64"), "the node has no IPv6 InternalIP"}}},
		{"no pod CIDR yet", []Node{node("a", []string{"10.0.0.1"}, "10.244.0.0/24"), node("b", []string{"10.0.0.2"})}, nil, nil},
		{"overlaps own", []Node{node("a", nil, "10.244.0.0/16"), node("b", []string{"10.0.0.2"}, "10.244.1.0/24")},
			nil, []Problem{{"b", p("10.244.1.0/24"), "overlaps this node's own pod CIDR"}}},
		{"same CIDR on two nodes",
			[]Node{node("c", []string{"10.0.0.3"}, "10.244.1.0/24"), node("b", []string{"10.0.0.2"}, "10.244.1.0/24")},
			[]Route{direct("10.244.1.0/24", "10.0.0.2", "b")},
			[]Problem{{"c", p("10.244.1.0/24"), "also the pod CIDR of node b"}}},
		{"unmasked CIDR and mapped address",
			[]Node{node("b", []string{"::ffff:10.0.0.2"}, "10.244.1.7/24")},
			[]Route{direct("10.244.1.0/24", "10.0.0.2", "b")}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			routes, probs := Plan("a", c.nodes, Network{Encap: EncapNever})
			if !reflect.DeepEqual(routes, c.routes) {
				t.Errorf("routes %v, want %v", routes, c.routes)
			}
			if !reflect.DeepEqual(probs, c.probs) {
				t.Errorf("problems %v, want %v", probs, c.probs)
			}
		})
	}
}

// TestPlanEncapsulation is the per-peer decision: direct for a peer on a
// connected subnet, VXLAN otherwise (auto), and what each mode forces.
func TestPlanEncapsulation(t *testing.T) {
	onLink := []netip.Prefix{netip.MustParsePrefix("10.10.1.2/24"), netip.MustParsePrefix("fd01::2/64")}
	self := node("a", []string{"10.10.1.2", "fd01::2"}, "10.244.1.0/24", "fd10:0:0:1::/64")
	near := node("near", []string{"10.10.1.3"}, "10.244.3.0/24")
	far := node("far", []string{"10.10.2.2", "fd02::2"}, "10.244.2.0/24", "fd10:0:0:2::/64")
	type want struct {
		kind     Kind
		via      string
		underlay string
		reason   string
	}
	for _, c := range []struct {
		encap Encapsulation
		nodes []Node
		want  map[string]want // by destination
		probs []string        // destinations with a problem
	}{
		{EncapAuto, []Node{self, near, far}, map[string]want{
			"10.244.3.0/24":   {Direct, "10.10.1.3", "", "its InternalIP 10.10.1.3 is on a subnet of this node"},
			"10.244.2.0/24":   {VXLAN, "10.244.2.0", "10.10.2.2", "its InternalIP 10.10.2.2 is on no subnet of this node"},
			"fd10:0:0:2::/64": {VXLAN, "fd10:0:0:2::", "fd02::2", "its InternalIP fd02::2 is on no subnet of this node"},
		}, nil},
		{"", []Node{self, near}, map[string]want{ // the zero value is auto
			"10.244.3.0/24": {Direct, "10.10.1.3", "", "its InternalIP 10.10.1.3 is on a subnet of this node"},
		}, nil},
		{EncapVXLAN, []Node{self, near}, map[string]want{
			"10.244.3.0/24": {VXLAN, "10.244.3.0", "10.10.1.3", "encapsulation vxlan"},
		}, nil},
		{EncapNever, []Node{self, far}, map[string]want{
			"10.244.2.0/24":   {Direct, "10.10.2.2", "", "encapsulation never"},
			"fd10:0:0:2::/64": {Direct, "fd02::2", "", "encapsulation never"},
		}, nil},
		// VXLAN's local end is this node's InternalIP of the family.
		{EncapAuto, []Node{node("a", []string{"10.10.1.2"}, "10.244.1.0/24"), far}, map[string]want{
			"10.244.2.0/24": {VXLAN, "10.244.2.0", "10.10.2.2", "its InternalIP 10.10.2.2 is on no subnet of this node"},
		}, []string{"fd10:0:0:2::/64"}},
		{EncapVXLAN, []Node{self, node("me", []string{"10.10.1.2"}, "10.244.9.0/24")}, nil, []string{"10.244.9.0/24"}},
	} {
		routes, probs := Plan("a", c.nodes, Network{Encap: c.encap, OnLink: onLink})
		got := map[string]want{}
		for _, r := range routes {
			w := want{r.Kind, r.Via.String(), "", r.Reason}
			if r.Underlay.IsValid() {
				w.underlay = r.Underlay.String()
			}
			got[r.Dst.String()] = w
		}
		if len(got) == 0 {
			got = nil
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q: routes %v, want %v", c.encap, got, c.want)
		}
		var gotProbs []string
		for _, p := range probs {
			gotProbs = append(gotProbs, p.Dst.String())
		}
		if !reflect.DeepEqual(gotProbs, c.probs) {
			t.Errorf("%q: problems %v, want on %v", c.encap, probs, c.probs)
		}
	}
}

func TestParseEncapsulation(t *testing.T) {
	for s, want := range map[string]Encapsulation{"": EncapAuto, "auto": EncapAuto, "vxlan": EncapVXLAN, "never": EncapNever} {
		if got, err := ParseEncapsulation(s); err != nil || got != want {
			t.Errorf("%q: %v, %v", s, got, err)
		}
	}
	if _, err := ParseEncapsulation("ipip"); err == nil {
		t.Error("ipip accepted")
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, c := range []struct {
		o  Options
		ok bool
	}{
		{Options{Self: "a"}, true},
		{Options{Self: "a", Protocol: 200}, true},
		{Options{}, false},
		{Options{Self: "a", Protocol: 4}, false},
		{Options{Self: "a", Protocol: 256}, false},
	} {
		if err := c.o.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v", c.o, err)
		}
	}
}

func TestMACOf(t *testing.T) {
	for _, c := range []struct{ ip, mac string }{
		{"10.10.2.2", "0a:58:0a:0a:02:02"},
		{"::ffff:192.0.2.255", "0a:58:c0:00:02:ff"},
	} {
		if got := macOf(netip.MustParseAddr(c.ip)).String(); got != c.mac {
			t.Errorf("macOf(%s) = %s, want %s", c.ip, got, c.mac)
		}
	}
	a, b := macOf(netip.MustParseAddr("fd00::1")), macOf(netip.MustParseAddr("fd00::2"))
	for _, m := range []net.HardwareAddr{a, b} {
		if m[0]&0x01 != 0 || m[0]&0x02 == 0 {
			t.Errorf("IPv6 MAC %s: want unicast, locally administered", m)
		}
	}
	if a.String() == b.String() {
		t.Errorf("two IPv6 addresses, one MAC %s", a)
	}
	if c := macOf(netip.MustParseAddr("fd00::1")); c.String() != a.String() {
		t.Errorf("not stable: %s, then %s", a, c)
	}
}
