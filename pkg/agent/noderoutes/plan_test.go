package noderoutes

import (
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

func TestPlan(t *testing.T) {
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	for _, c := range []struct {
		name   string
		nodes  []Node
		routes []Route
		probs  []Problem
	}{
		{"alone", []Node{node("a", []string{"10.0.0.1"}, "10.244.0.0/24")}, nil, nil},
		{"self absent from the list", []Node{node("b", []string{"10.0.0.2"}, "10.244.1.0/24")},
			[]Route{{p("10.244.1.0/24"), a("10.0.0.2"), "b"}}, nil},
		{"dual stack, sorted by destination",
			[]Node{
				node("a", []string{"10.0.0.1", "fd00::1"}, "10.244.0.0/24", "fd10::/64"),
				node("c", []string{"fd00::3", "10.0.0.3"}, "10.244.2.0/24", "fd10:0:0:2::/64"),
				node("b", []string{"10.0.0.2", "fd00::2"}, "10.244.1.0/24", "fd10:0:0:1::/64"),
			},
			[]Route{
				{p("10.244.1.0/24"), a("10.0.0.2"), "b"},
				{p("10.244.2.0/24"), a("10.0.0.3"), "c"},
				{p("fd10:0:0:1::/64"), a("fd00::2"), "b"},
				{p("fd10:0:0:2::/64"), a("fd00::3"), "c"},
			}, nil},
		{"no InternalIP of the family",
			[]Node{node("a", []string{"10.0.0.1"}, "10.244.0.0/24"), node("b", []string{"10.0.0.2"}, "10.244.1.0/24", "fd10:0:0:1::/64")},
			[]Route{{p("10.244.1.0/24"), a("10.0.0.2"), "b"}},
			[]Problem{{"b", p("fd10:0:0:1::/64"), "the node has no IPv6 InternalIP"}}},
		{"no pod CIDR yet", []Node{node("a", []string{"10.0.0.1"}, "10.244.0.0/24"), node("b", []string{"10.0.0.2"})}, nil, nil},
		{"overlaps own", []Node{node("a", nil, "10.244.0.0/16"), node("b", []string{"10.0.0.2"}, "10.244.1.0/24")},
			nil, []Problem{{"b", p("10.244.1.0/24"), "overlaps this node's own pod CIDR"}}},
		{"same CIDR on two nodes",
			[]Node{node("c", []string{"10.0.0.3"}, "10.244.1.0/24"), node("b", []string{"10.0.0.2"}, "10.244.1.0/24")},
			[]Route{{p("10.244.1.0/24"), a("10.0.0.2"), "b"}},
			[]Problem{{"c", p("10.244.1.0/24"), "also the pod CIDR of node b"}}},
		{"unmasked CIDR and mapped address",
			[]Node{node("b", []string{"::ffff:10.0.0.2"}, "10.244.1.7/24")},
			[]Route{{p("10.244.1.0/24"), a("10.0.0.2"), "b"}}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			routes, probs := Plan("a", c.nodes)
			if !reflect.DeepEqual(routes, c.routes) {
				t.Errorf("routes %v, want %v", routes, c.routes)
			}
			if !reflect.DeepEqual(probs, c.probs) {
				t.Errorf("problems %v, want %v", probs, c.probs)
			}
		})
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
