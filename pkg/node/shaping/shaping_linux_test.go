package shaping

import (
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
)

// TestApplyReadRemove shapes one end of a veth in a namespace of the
// test's own, reads the rate back, shapes it again (replaced, not added),
// and removes it, twice.
func TestApplyReadRemove(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(); testutils.UnmountNS(n) })
	err = n.Do(func(ns.NetNS) error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "shp0"}, PeerName: "shp1"}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		for _, rate := range []uint64{10_000_000, 50_000_000} {
			if err := Apply("shp0", rate, 512<<23); err != nil {
				return err
			}
			got, err := Rate("shp0")
			if err != nil {
				return err
			}
			if got != rate {
				t.Errorf("rate: got %d bit/s, want %d", got, rate)
			}
		}
		l, _ := netlink.LinkByName("shp0")
		qs, _ := netlink.QdiscList(l)
		tbfs := 0
		for _, q := range qs {
			if q.Type() == "tbf" {
				tbfs++
			}
		}
		if tbfs != 1 {
			t.Errorf("tbf qdiscs after two Applies: got %d, want 1", tbfs)
		}
		for range 2 {
			if err := Remove("shp0"); err != nil {
				return err
			}
		}
		if got, _ := Rate("shp0"); got != 0 {
			t.Errorf("rate after Remove: got %d, want 0", got)
		}
		if err := Remove("no-such-link"); err != nil {
			t.Errorf("Remove of a missing link: %v, want nil", err)
		}
		if err := Apply("shp0", 0, 0); err != nil {
			t.Errorf("Apply of rate 0 (unshaped): %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
