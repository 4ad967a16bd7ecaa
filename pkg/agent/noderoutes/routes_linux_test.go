package noderoutes

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
)

// inNode runs f in a fresh network namespace with one veth to a peer
// namespace, as two nodes on a shared link: this node 10.9.0.1/24 and
// fd09::1/64, the peer .2 / ::2. A router 10.9.0.254 stands for a path
// that is not a shared link (10.77.0.0/16 and fd77::/64 are behind it).
// Everything lives in namespaces the test made and removes.
func inNode(t *testing.T, f func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	self, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { self.Close(); testutils.UnmountNS(self) })
	peer, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close(); testutils.UnmountNS(peer) })
	err = self.Do(func(ns.NetNS) error {
		la := netlink.NewLinkAttrs()
		la.Name = "n1"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "n2", PeerNamespace: netlink.NsFd(int(peer.Fd()))}); err != nil {
			return err
		}
		// no DAD: the v6 address is usable at once
		os.WriteFile("/proc/sys/net/ipv6/conf/n1/accept_dad", []byte("0"), 0o644)
		for _, c := range [][]string{
			{"link", "set", "lo", "up"},
			{"link", "set", "n1", "up"},
			{"addr", "add", "10.9.0.1/24", "dev", "n1"},
			{"-6", "addr", "add", "fd09::1/64", "dev", "n1", "nodad"},
			{"route", "add", "10.77.0.0/16", "via", "10.9.0.254"},
			{"-6", "route", "add", "fd77::/64", "via", "fd09::fe"},
		} {
			if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
				return errors.New(strings.Join(c, " ") + ": " + string(out))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := self.Do(func(ns.NetNS) error { f(); return nil }); err != nil {
		t.Fatal(err)
	}
}

func ipRoutes(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func TestSyncFollowsNodes(t *testing.T) {
	inNode(t, func() {
		m, err := New(Options{Self: "a"})
		if err != nil {
			t.Fatal(err)
		}
		a := node("a", []string{"10.9.0.1", "fd09::1"}, "10.244.0.0/24", "fd10::/64")
		b := node("b", []string{"10.9.0.2", "fd09::2"}, "10.244.1.0/24", "fd10:0:0:1::/64")
		st, err := m.Sync([]Node{a, b})
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Routes) != 2 || len(st.Problems) != 0 {
			t.Fatalf("status %+v", st)
		}
		v4 := ipRoutes(t, "route", "show", "proto", "117")
		if !strings.Contains(v4, "10.244.1.0/24 via 10.9.0.2 dev n1") {
			t.Errorf("IPv4 route missing:\n%s", v4)
		}
		v6 := ipRoutes(t, "-6", "route", "show", "proto", "117")
		if !strings.Contains(v6, "fd10:0:0:1::/64 via fd09::2 dev n1") {
			t.Errorf("IPv6 route missing:\n%s", v6)
		}
		// Idempotent.
		if st2, err := m.Sync([]Node{a, b}); err != nil || !reflect.DeepEqual(st, st2) {
			t.Errorf("second sync: %+v, %v", st2, err)
		}
		// The node changes its address and its CIDR.
		b2 := node("b", []string{"10.9.0.3"}, "10.244.2.0/24")
		if _, err := m.Sync([]Node{a, b2}); err != nil {
			t.Fatal(err)
		}
		got, _ := m.Current()
		want := []Route{{Dst: netip.MustParsePrefix("10.244.2.0/24"), Via: netip.MustParseAddr("10.9.0.3"), Kind: Direct}}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("after the change: %v, want %v", got, want)
		}
		// The node is deleted.
		if _, err := m.Sync([]Node{a}); err != nil {
			t.Fatal(err)
		}
		if got, _ := m.Current(); len(got) != 0 {
			t.Errorf("after the deletion: %v", got)
		}
	})
}

// TestSyncReportsUnreachable is encapsulation never: a peer behind a
// router gets no route (host-gw only).
func TestSyncReportsUnreachable(t *testing.T) {
	inNode(t, func() {
		m, _ := New(Options{Self: "a", Encapsulation: EncapNever})
		far := node("far", []string{"10.77.0.5", "fd77::5"}, "10.244.7.0/24", "fd10:0:0:7::/64")
		lost := node("lost", []string{"192.0.2.9"}, "10.244.8.0/24")  // no route at all
		me := node("me-again", []string{"10.9.0.1"}, "10.244.9.0/24") // claims our address
		st, err := m.Sync([]Node{node("a", []string{"10.9.0.1"}, "10.244.0.0/24"), far, lost, me})
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Routes) != 0 {
			t.Errorf("routes %v, want none", st.Routes)
		}
		why := map[string]string{}
		for _, p := range st.Problems {
			why[p.Dst.String()] = p.Reason
		}
		for dst, want := range map[string]string{
			"10.244.7.0/24":   "through the router 10.9.0.254",
			"fd10:0:0:7::/64": "through the router fd09::fe",
			"10.244.8.0/24":   "no route to its InternalIP 192.0.2.9",
			"10.244.9.0/24":   "is an address of this node",
		} {
			if !strings.Contains(why[dst], want) {
				t.Errorf("%s: problem %q, want it to say %q", dst, why[dst], want)
			}
		}
	})
}

func TestSyncLeavesForeignRoutes(t *testing.T) {
	inNode(t, func() {
		// Someone else (an overlay) routes 10.244.1.0/24 already.
		ipRoutes(t, "route", "add", "10.244.1.0/24", "via", "10.9.0.2", "proto", "static")
		ipRoutes(t, "route", "add", "10.250.0.0/24", "via", "10.9.0.2", "proto", "static")
		m, _ := New(Options{Self: "a"})
		st, err := m.Sync([]Node{node("b", []string{"10.9.0.2"}, "10.244.1.0/24")})
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Routes) != 0 || len(st.Problems) != 1 || !strings.Contains(st.Problems[0].Reason, "did not make") {
			t.Errorf("status %+v", st)
		}
		if err := m.RemoveAll(); err != nil {
			t.Fatal(err)
		}
		out := ipRoutes(t, "route", "show")
		for _, r := range []string{"10.244.1.0/24 via 10.9.0.2 dev n1 proto static", "10.250.0.0/24 via 10.9.0.2"} {
			if !strings.Contains(out, r) {
				t.Errorf("RemoveAll touched a route not ours (%s):\n%s", r, out)
			}
		}
	})
}

func TestRemoveAll(t *testing.T) {
	inNode(t, func() {
		m, _ := New(Options{Self: "a"})
		if err := m.RemoveAll(); err != nil { // nothing there: success
			t.Fatal(err)
		}
		b := node("b", []string{"10.9.0.2", "fd09::2"}, "10.244.1.0/24", "fd10:0:0:1::/64")
		if _, err := m.Sync([]Node{b}); err != nil {
			t.Fatal(err)
		}
		if got, _ := m.Current(); len(got) != 2 {
			t.Fatalf("routes %v, want 2", got)
		}
		if err := m.RemoveAll(); err != nil {
			t.Fatal(err)
		}
		if got, _ := m.Current(); len(got) != 0 {
			t.Errorf("after RemoveAll: %v", got)
		}
		// The link itself is not ours to touch.
		if _, err := net.InterfaceByName("n1"); err != nil {
			t.Error(err)
		}
	})
}

// A node whose address is a /32 (on lo, as on the project's lab, or on a
// NIC) and that reaches its neighbour by a link route shares that link
// with it: auto routes the neighbour's pods directly, without VXLAN.
// The same for IPv6, whose routes carry no scope (the project's lab in
// dual-stack: fd10:242::1/128 on lo, a route to fd10:242::2/128 over the
// link).
func TestLinkRouteIsOnLink(t *testing.T) {
	inNode(t, func() {
		for _, c := range [][]string{
			{"addr", "add", "10.242.0.1/32", "dev", "lo"},
			{"route", "add", "10.242.0.2/32", "dev", "n1", "scope", "link", "src", "10.242.0.1"},
			{"-6", "addr", "add", "fd10:242::1/128", "dev", "lo"},
			{"-6", "route", "add", "fd10:242::2/128", "dev", "n1", "src", "fd10:242::1"},
		} {
			ipRoutes(t, c...)
		}
		m, err := New(Options{Self: "one"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.RemoveAll() })
		st, err := m.Sync([]Node{
			node("one", []string{"10.242.0.1", "fd10:242::1"}, "10.244.0.0/24", "fd10:244::/64"),
			node("two", []string{"10.242.0.2", "fd10:242::2"}, "10.244.1.0/24", "fd10:244:0:1::/64"),
		})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"10.244.1.0/24": "10.242.0.2", "fd10:244:0:1::/64": "fd10:242::2"}
		if len(st.Routes) != len(want) {
			t.Fatalf("routes %+v (problems %v), want %v directly", st.Routes, st.Problems, want)
		}
		for _, r := range st.Routes {
			if r.Kind != Direct || want[r.Dst.String()] != r.Via.String() {
				t.Errorf("route %+v, want %v directly", r, want)
			}
		}
		for _, name := range []string{vxlanName4, vxlanName6} {
			if _, err := netlink.LinkByName(name); err == nil {
				t.Errorf("a VXLAN device (%s) for a neighbour on a link", name)
			}
		}
	})
}

// A node whose InternalIP is a /32 on lo, its peer behind a router: the
// VXLAN device is sized for the pods (the real links' MTU less the
// overhead), not for lo's 65536 bytes.
func TestVXLANOverLoopbackAddressTakesThePodMTU(t *testing.T) {
	inNode(t, func() {
		ipRoutes(t, "addr", "add", "10.242.0.1/32", "dev", "lo")
		m, err := New(Options{Self: "one", PodMTU: 1350})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.RemoveAll() })
		st, err := m.Sync([]Node{node("one", []string{"10.242.0.1"}, "10.244.0.0/24"), node("two", []string{"10.77.0.2"}, "10.244.1.0/24")})
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Routes) != 1 || st.Routes[0].Kind != VXLAN {
			t.Fatalf("routes %+v (problems %v), want one through VXLAN", st.Routes, st.Problems)
		}
		l, err := netlink.LinkByName(vxlanName4)
		if err != nil {
			t.Fatal(err)
		}
		if l.Attrs().MTU != 1350 {
			t.Errorf("%s MTU %d, want the pods' 1350", vxlanName4, l.Attrs().MTU)
		}
		if len(st.Notes) != 0 {
			t.Errorf("notes %v, want none: the pods fit the tunnel", st.Notes)
		}
	})
}
