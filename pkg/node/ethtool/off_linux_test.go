package ethtool

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestLinkOffloadsOff turns the offloads off on a real veth and reads them
// back through the ioctl and, where installed, through ethtool(8).
func TestLinkOffloadsOff(t *testing.T) {
	netns := newTestNS(t)
	const name, peer = "off0", "off1"
	features := []struct {
		name string
		get  uint32
		// how ethtool -k names it
		ethtool string
	}{
		{"TSO", unix.ETHTOOL_GTSO, "tcp-segmentation-offload"},
		{"GSO", unix.ETHTOOL_GGSO, "generic-segmentation-offload"},
		{"SG", unix.ETHTOOL_GSG, "scatter-gather"},
	}
	read := func(ifName string) (map[string]bool, error) {
		fd, err := ioctlSocket()
		if err != nil {
			return nil, err
		}
		defer unix.Close(fd)
		got := map[string]bool{}
		for _, f := range features {
			if got[f.name], err = ethtoolGet(fd, ifName, f.get); err != nil {
				return nil, fmt.Errorf("reading %s of %s: %v", f.name, ifName, err)
			}
		}
		return got, nil
	}
	err := netns.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
			return fmt.Errorf("adding veth %s: %v", name, err)
		}
		before, err := read(name)
		if err != nil {
			return err
		}
		for _, f := range features {
			if !before[f.name] {
				return fmt.Errorf("fresh veth has %s off already, so the test would prove nothing: %v", f.name, before)
			}
		}
		if err := LinkOffloadsOff(name); err != nil {
			return fmt.Errorf("LinkOffloadsOff(%s): %v", name, err)
		}
		after, err := read(name)
		if err != nil {
			return err
		}
		for _, f := range features {
			if after[f.name] {
				t.Errorf("%s of %s after LinkOffloadsOff: got on, want off", f.name, name)
			}
		}
		if p, err := read(peer); err != nil || !p["TSO"] || !p["GSO"] || !p["SG"] {
			t.Errorf("peer %s: got %v, %v, want all on (untouched)", peer, p, err)
		}
		// Every feature ethtool -K would turn off, by name, including
		// those the legacy commands do not know.
		fd, err := ioctlSocket()
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		names, err := featureNames(fd, name)
		if err != nil {
			return err
		}
		active, err := activeFeatures(fd, name, len(names))
		if err != nil {
			return err
		}
		matched := 0
		for bit, n := range names {
			if matchesAny(n, offPatterns) {
				matched++
				if active[bit] {
					t.Errorf("feature %s of %s: got on, want off", n, name)
				}
			}
		}
		if matched < 3 {
			t.Errorf("only %d feature names matched %v in %v", matched, offPatterns, names)
		}
		if i := slices.Index(names, "tx-checksum-ip-generic"); i < 0 || !active[i] {
			t.Errorf("tx-checksum-ip-generic of %s: got index %d, want it present and left on", name, i)
		}
		// ethtool(8) is an independent reader where the machine has it.
		if path, err := exec.LookPath("ethtool"); err == nil {
			out, err := exec.Command(path, "-k", name).CombinedOutput()
			if err != nil {
				return fmt.Errorf("ethtool -k %s: %v: %s", name, err, out)
			}
			for _, f := range features {
				if !strings.Contains(string(out), "\n"+f.ethtool+": off") {
					t.Errorf("ethtool -k %s: want %q off, got:\n%s", name, f.ethtool, out)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestLinkOffloadsOffMissingLink(t *testing.T) {
	netns := newTestNS(t)
	err := netns.Do(func(ns.NetNS) error { return LinkOffloadsOff("nosuchlink0") })
	if err == nil {
		t.Fatal("LinkOffloadsOff(nosuchlink0): got nil error, want one")
	}
}

// TestLinkTSOOff turns only TSO off (software GSO mode): GSO and
// scatter-gather, which let the kernel's GSO split a packet without copying
// it, stay on.
func TestLinkTSOOff(t *testing.T) {
	netns := newTestNS(t)
	const name, peer = "tso0", "tso1"
	err := netns.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
			return fmt.Errorf("adding veth %s: %v", name, err)
		}
		if err := LinkTSOOff(name); err != nil {
			return fmt.Errorf("LinkTSOOff(%s): %v", name, err)
		}
		fd, err := ioctlSocket()
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for _, f := range []struct {
			name string
			cmd  uint32
			want bool
		}{{"TSO", unix.ETHTOOL_GTSO, false}, {"GSO", unix.ETHTOOL_GGSO, true}, {"SG", unix.ETHTOOL_GSG, true}} {
			got, err := ethtoolGet(fd, name, f.cmd)
			if err != nil {
				return fmt.Errorf("reading %s of %s: %v", f.name, name, err)
			}
			if got != f.want {
				t.Errorf("%s of %s after LinkTSOOff: got %v, want %v", f.name, name, got, f.want)
			}
		}
		if on, err := ethtoolGet(fd, peer, unix.ETHTOOL_GTSO); err != nil || !on {
			t.Errorf("TSO of peer %s: got %v, %v, want on (untouched)", peer, on, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Do(func(ns.NetNS) error { return LinkTSOOff("nosuchlink0") }); err == nil || !strings.Contains(err.Error(), "nosuchlink0") {
		t.Errorf("LinkTSOOff(nosuchlink0): got %v, want an error naming the link", err)
	}
}

// TestLinkGROOn turns GRO on on a fresh veth, where it is off (a veth
// has no NAPI until GRO or XDP asks for one), and reads it back through
// ethtool(8) where installed; the other offloads stay as they were.
func TestLinkGROOn(t *testing.T) {
	netns := newTestNS(t)
	const name, peer = "gro0", "gro1"
	err := netns.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
			return fmt.Errorf("adding veth %s: %v", name, err)
		}
		groActive := func() (bool, error) {
			fd, err := ioctlSocket()
			if err != nil {
				return false, err
			}
			defer unix.Close(fd)
			names, err := featureNames(fd, name)
			if err != nil {
				return false, err
			}
			active, err := activeFeatures(fd, name, len(names))
			if err != nil {
				return false, err
			}
			return active[slices.Index(names, groFeature)], nil
		}
		if on, err := groActive(); err != nil || on {
			return fmt.Errorf("a fresh veth's GRO: on %v, %v; want off, or the test proves nothing", on, err)
		}
		on, err := LinkGROOn(name)
		if err != nil || !on {
			return fmt.Errorf("LinkGROOn(%s): on %v, %v", name, on, err)
		}
		if on, err := groActive(); err != nil || !on {
			return fmt.Errorf("GRO read back: on %v, %v", on, err)
		}
		fd, err := ioctlSocket()
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if tso, err := ethtoolGet(fd, name, unix.ETHTOOL_GTSO); err != nil || !tso {
			return fmt.Errorf("TSO after GRO on: %v, %v; want it left on", tso, err)
		}
		if out, err := exec.Command("ethtool", "-k", name).Output(); err == nil &&
			!strings.Contains(string(out), "generic-receive-offload: on") {
			return fmt.Errorf("ethtool -k %s says GRO is not on:\n%s", name, out)
		}
		_, err = LinkGROOn("nosuchlink0")
		if err == nil {
			return fmt.Errorf("LinkGROOn on a missing link succeeded")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
