package ethtool

import (
	"errors"
	"fmt"
	"os/exec"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// newTestNS returns a throwaway network namespace that t.Cleanup removes,
// skipping the test when not root.
func newTestNS(t *testing.T) ns.NetNS {
	t.Helper()
	nettest.RequireRoot(t)
	return nettest.NewNS(t)
}

func TestDetectVeth(t *testing.T) {
	netns := newTestNS(t)
	const name, peer = "gso0", "gso1"

	err := netns.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
			return fmt.Errorf("adding veth %s: %v", name, err)
		}

		// A fresh veth offers GSO.
		l, err := Detect(name)
		if err != nil {
			return fmt.Errorf("Detect(%s): %v", name, err)
		}
		if !l.GSO || l.MaxSize == 0 || l.MaxSegs == 0 || !l.Offers() {
			t.Errorf("fresh veth: got %+v, Offers %v, want GSO on, non-zero limits, Offers true", l, l.Offers())
		}
		if d, err := offload.Decide(offload.ModeAuto, l); err != nil || d.Mode != offload.ModeHardware {
			t.Errorf("offload.Decide(auto) on fresh veth: got %+v, %v, want mode hardware", d, err)
		}

		// With gso and tso switched off, auto falls back to software and
		// hardware is refused. ethtool inherits this thread's netns.
		if out, err := exec.Command("/usr/sbin/ethtool", "-K", name, "gso", "off", "tso", "off").CombinedOutput(); err != nil {
			return fmt.Errorf("ethtool -K %s gso off tso off: %v: %s", name, err, out)
		}
		l, err = Detect(name)
		if err != nil {
			return fmt.Errorf("Detect(%s) after gso off: %v", name, err)
		}
		if l.GSO || l.TSO || l.Offers() {
			t.Errorf("after gso off tso off: got %+v, Offers %v, want GSO and TSO off, Offers false", l, l.Offers())
		}
		if d, err := offload.Decide(offload.ModeAuto, l); err != nil || d.Mode != offload.ModeSoftware {
			t.Errorf("offload.Decide(auto) after gso off: got %+v, %v, want mode software", d, err)
		}
		if _, err := offload.Decide(offload.ModeHardware, l); !errors.Is(err, offload.ErrNoGSO) {
			t.Errorf("offload.Decide(hardware) after gso off: got error %v, want offload.ErrNoGSO", err)
		}
		if got := l.MaxBurst(1500); got != 0 {
			t.Errorf("MaxBurst(1500) after gso off: got %d, want 0", got)
		}

		// gso_max_segs is reported as set.
		link, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("looking up %s: %v", name, err)
		}
		if err := netlink.LinkSetGSOMaxSegs(link, 2); err != nil {
			return fmt.Errorf("setting gso_max_segs of %s: %v", name, err)
		}
		if l, err = Detect(name); err != nil {
			return fmt.Errorf("Detect(%s) after gso_max_segs 2: %v", name, err)
		}
		if l.MaxSegs != 2 {
			t.Errorf("after gso_max_segs 2: got MaxSegs %d, want 2", l.MaxSegs)
		}

		// The peer is untouched.
		if l, err = Detect(peer); err != nil || !l.Offers() {
			t.Errorf("Detect(%s): got %+v, %v, want GSO offered", peer, l, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestDetectMissingLink(t *testing.T) {
	netns := newTestNS(t)
	err := netns.Do(func(ns.NetNS) error {
		_, err := Detect("nosuchlink0")
		return err
	})
	if err == nil {
		t.Fatal("Detect(nosuchlink0): got nil error, want one")
	}
}
