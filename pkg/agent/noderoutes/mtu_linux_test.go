package noderoutes

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// mtuNode is a node's namespace with two links to a peer namespace: big
// (MTU 9000) and small (MTU 1500), up, with the addresses and routes
// setup gives as ip(8) arguments. Both namespaces are the test's own.
func mtuNode(t *testing.T, setup ...[]string) ns.NetNS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	node, peer := newNS(t), newNS(t)
	for _, l := range []struct {
		name string
		mtu  string
	}{{"big", "9000"}, {"small", "1500"}} {
		mustIn(t, node, "ip", "link", "add", l.name, "mtu", l.mtu, "type", "veth", "peer", "name", l.name, "netns", peer.Path())
		mustIn(t, node, "ip", "link", "set", l.name, "up")
		mustIn(t, peer, "ip", "link", "set", l.name, "up")
	}
	mustIn(t, node, "ip", "link", "set", "lo", "up")
	for _, c := range setup {
		mustIn(t, node, append([]string{"ip"}, c...)...)
	}
	return node
}

// podMTUIn is PodMTU in the namespace n.
func podMTUIn(t *testing.T, n ns.NetNS, o MTUOptions) MTUChoice {
	t.Helper()
	var c MTUChoice
	err := n.Do(func(ns.NetNS) error {
		var err error
		c, err = PodMTU(o)
		return err
	})
	if err != nil {
		t.Fatalf("PodMTU(%+v): %v", o, err)
	}
	return c
}

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// The InternalIP on the 9000-byte link and the default route on the
// 1500-byte one: the smaller decides, less VXLAN's 50 bytes (the pods'
// packets to a node behind a router leave through the default route
// inside a tunnel); with --encapsulation never the link's MTU whole. An
// explicit MTU is taken as it is.
func TestPodMTUSmallestLinkLessVXLAN(t *testing.T) {
	n := mtuNode(t,
		[]string{"addr", "add", "10.9.0.1/24", "dev", "big"},
		[]string{"addr", "add", "10.8.0.1/24", "dev", "small"},
		[]string{"route", "add", "default", "via", "10.8.0.254", "dev", "small"})
	o := MTUOptions{InternalIPs: addrs("10.9.0.1"), PodCIDRs: prefixes("10.244.0.0/24")}
	c := podMTUIn(t, n, o)
	if c.MTU != 1450 {
		t.Errorf("auto: got %d (%s), want 1450: small's 1500 less VXLAN's 50", c.MTU, c.Source)
	}
	for _, w := range []string{"small", "IPv4 default route", "1500 - 50 VXLAN over IPv4"} {
		if !strings.Contains(c.Source, w) {
			t.Errorf("auto: source %q does not say %q", c.Source, w)
		}
	}

	o.Encapsulation = EncapNever
	if c := podMTUIn(t, n, o); c.MTU != 1500 || !strings.Contains(c.Source, "no encapsulation") {
		t.Errorf("never: got %d (%s), want 1500, no encapsulation", c.MTU, c.Source)
	}

	// Without the default route, only the InternalIP's link is left.
	mustIn(t, n, "ip", "route", "del", "default")
	o.Encapsulation = EncapAuto
	if c := podMTUIn(t, n, o); c.MTU != 8950 || !strings.Contains(c.Source, "big (InternalIP 10.9.0.1) 9000") {
		t.Errorf("InternalIP's link alone: got %d (%s), want 8950 from big", c.MTU, c.Source)
	}

	o.MTU = 1400
	if c := podMTUIn(t, n, o); c.MTU != 1400 || c.Source != "--mtu" {
		t.Errorf("explicit 1400: got %d (%s), want 1400 from --mtu", c.MTU, c.Source)
	}
}

// Over an IPv6 underlay VXLAN takes 70 bytes; dual stack, the IPv6
// tunnel's overhead decides for both families (one link MTU per pod).
func TestPodMTUIPv6Underlay(t *testing.T) {
	n := mtuNode(t,
		[]string{"-6", "addr", "add", "fd09::1/64", "dev", "big", "nodad"},
		[]string{"-6", "addr", "add", "fd08::1/64", "dev", "small", "nodad"},
		[]string{"-6", "route", "add", "default", "via", "fd08::fe", "dev", "small"})
	o := MTUOptions{InternalIPs: addrs("fd09::1"), PodCIDRs: prefixes("fd10::/64")}
	if c := podMTUIn(t, n, o); c.MTU != 1430 || !strings.Contains(c.Source, "70 VXLAN over IPv6") {
		t.Errorf("IPv6 only: got %d (%s), want 1430: small's 1500 less 70", c.MTU, c.Source)
	}

	mustIn(t, n, "ip", "addr", "add", "10.9.0.1/24", "dev", "small")
	mustIn(t, n, "ip", "route", "add", "default", "via", "10.9.0.254")
	o = MTUOptions{InternalIPs: addrs("10.9.0.1", "fd09::1"), PodCIDRs: prefixes("10.244.0.0/24", "fd10::/64")}
	if c := podMTUIn(t, n, o); c.MTU != 1430 {
		t.Errorf("dual stack: got %d (%s), want 1430", c.MTU, c.Source)
	}
	// IPv4 pods only: their tunnel is IPv4's, whatever the node's IPv6.
	o.PodCIDRs = prefixes("10.244.0.0/24")
	if c := podMTUIn(t, n, o); c.MTU != 1450 {
		t.Errorf("IPv4 pods on a dual-stack node: got %d (%s), want 1450", c.MTU, c.Source)
	}
}

// A node whose InternalIP is a /32 on lo (65536 bytes) takes its MTU from
// the links that carry its routes, and from Ethernet's 1500 when none
// does: never from loopback.
func TestPodMTUInternalIPOnLoopback(t *testing.T) {
	n := mtuNode(t,
		[]string{"addr", "add", "10.242.0.1/32", "dev", "lo"},
		[]string{"route", "add", "10.242.0.2/32", "dev", "small"},
		[]string{"route", "add", "default", "dev", "big"})
	o := MTUOptions{InternalIPs: addrs("10.242.0.1"), PodCIDRs: prefixes("10.244.0.0/24")}
	if c := podMTUIn(t, n, o); c.MTU != 8950 || !strings.Contains(c.Source, "big (IPv4 default route) 9000") {
		t.Errorf("default route on big: got %d (%s), want 8950", c.MTU, c.Source)
	}
	mustIn(t, n, "ip", "route", "del", "default")
	c := podMTUIn(t, n, o)
	if c.MTU != 1450 || !strings.Contains(c.Source, "no link but loopback") {
		t.Errorf("no default route: got %d (%s), want 1450 (1500 less VXLAN)", c.MTU, c.Source)
	}
}
