package policyctl

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestNodeAddrsLeaveOutIPVSVIPs runs nodeAddrs in a namespace laid out as
// a node under kube-proxy's IPVS mode: Service VIPs on kube-ipvs0 (this
// kernel has no dummy links, so it is one end of a veth pair) and the
// node's own address on the other end. Only the node's address is the
// node's.
func TestNodeAddrsLeaveOutIPVSVIPs(t *testing.T) {
	nettest.RequireRoot(t)
	netns := nettest.NewNS(t)
	var got []netip.Addr
	err := netns.Do(func(ns.NetNS) error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kube-ipvs0"}, PeerName: "nodeaddr-eth"}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("adding the veth pair: %w", err)
		}
		for link, addrs := range map[string][]string{
			"kube-ipvs0":   {"10.96.0.1/32", "10.96.0.10/32", "fd00:96::1/128"},
			"nodeaddr-eth": {"10.250.7.1/24", "2001:db8:7::1/64"},
		} {
			if err := linkWithAddrs(link, addrs); err != nil {
				return err
			}
		}
		var err error
		got, err = nodeAddrs()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("10.250.7.1"), netip.MustParseAddr("2001:db8:7::1")}
	if !slices.Equal(got, want) {
		t.Fatalf("nodeAddrs = %v, want %v (kube-ipvs0's VIPs left out)", got, want)
	}
}

func linkWithAddrs(name string, addrs []string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	for _, a := range addrs {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return fmt.Errorf("parsing %s: %w", a, err)
		}
		if err := netlink.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("adding %s to %s: %w", a, name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	return nil
}
