package noderoutes

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
)

// lab is two nodes on different subnets joined by a router, each with a
// pod behind it, all in namespaces the test made and removes:
//
//	podA 10.244.1.5 -- nodeA 10.10.1.2/24 -- router 10.10.1.1, 10.10.2.1 -- nodeB 10.10.2.2/24 -- podB 10.244.2.5
//	fd10:0:0:1::5      fd01::2/64            fd01::1, fd02::1            fd02::2/64            fd10:0:0:2::5
//
// The router forwards between the node subnets and knows nothing of the
// pod CIDRs: only an overlay carries pod traffic across it.
type lab struct {
	nodeA, nodeB, podA, podB, router ns.NetNS
}

func newNS(t *testing.T) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(); testutils.UnmountNS(n) })
	return n
}

// in runs a command in the namespace n.
func in(n ns.NetNS, args ...string) (string, error) {
	out, err := exec.Command("nsenter", append([]string{"--net=" + n.Path()}, args...)...).CombinedOutput()
	return string(out), err
}

func mustIn(t *testing.T, n ns.NetNS, args ...string) string {
	t.Helper()
	out, err := in(n, args...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func newLab(t *testing.T) *lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	l := &lab{nodeA: newNS(t), nodeB: newNS(t), podA: newNS(t), podB: newNS(t)}
	router := newNS(t)
	l.router = router
	// veth joins a in namespace an to b in namespace bn.
	veth := func(an ns.NetNS, a string, bn ns.NetNS, b string) {
		mustIn(t, an, "ip", "link", "add", a, "type", "veth", "peer", "name", b, "netns", bn.Path())
		mustIn(t, an, "ip", "link", "set", a, "up")
		mustIn(t, bn, "ip", "link", "set", b, "up")
	}
	for _, n := range []ns.NetNS{l.nodeA, l.nodeB, l.podA, l.podB, router} {
		mustIn(t, n, "ip", "link", "set", "lo", "up")
	}
	for _, n := range []ns.NetNS{router, l.nodeA, l.nodeB, l.podA, l.podB} {
		// no duplicate address detection: addresses are usable at once
		mustIn(t, n, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0")
	}
	for _, n := range []ns.NetNS{router, l.nodeA, l.nodeB} {
		mustIn(t, n, "sysctl", "-qw", "net.ipv4.ip_forward=1")
		mustIn(t, n, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
	}
	veth(l.nodeA, "ul", router, "ra")
	veth(l.nodeB, "ul", router, "rb")
	for _, a := range [][]string{{"10.10.1.1/24", "ra"}, {"10.10.2.1/24", "rb"}, {"fd01::1/64", "ra"}, {"fd02::1/64", "rb"}} {
		mustIn(t, router, "ip", "addr", "add", a[0], "dev", a[1], "nodad")
	}
	for _, s := range []struct {
		node, pod      ns.NetNS
		underlay, gw   []string
		podGW, podAddr []string
	}{
		{l.nodeA, l.podA, []string{"10.10.1.2/24", "fd01::2/64"}, []string{"10.10.1.1", "fd01::1"},
			[]string{"10.244.1.1/24", "fd10:0:0:1::1/64"}, []string{"10.244.1.5/24", "fd10:0:0:1::5/64"}},
		{l.nodeB, l.podB, []string{"10.10.2.2/24", "fd02::2/64"}, []string{"10.10.2.1", "fd02::1"},
			[]string{"10.244.2.1/24", "fd10:0:0:2::1/64"}, []string{"10.244.2.5/24", "fd10:0:0:2::5/64"}},
	} {
		veth(s.node, "pod", s.pod, "eth0")
		for i := range 2 {
			mustIn(t, s.node, "ip", "addr", "add", s.underlay[i], "dev", "ul", "nodad")
			mustIn(t, s.node, "ip", "route", "add", "default", "via", s.gw[i])
			mustIn(t, s.node, "ip", "addr", "add", s.podGW[i], "dev", "pod", "nodad")
			mustIn(t, s.pod, "ip", "addr", "add", s.podAddr[i], "dev", "eth0", "nodad")
			mustIn(t, s.pod, "ip", "route", "add", "default", "via", strings.Split(s.podGW[i], "/")[0])
		}
	}
	return l
}

// nsManager runs every call on its Manager in the namespace n.
type nsManager struct {
	t   *testing.T
	n   ns.NetNS
	m   *Manager
	log *recorder
}

func (l *lab) manager(t *testing.T, n ns.NetNS, self string, o Options) *nsManager {
	t.Helper()
	rec := &recorder{}
	o.Self, o.Log = self, slog.New(rec)
	m, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	nm := &nsManager{t: t, n: n, m: m, log: rec}
	t.Cleanup(func() { nm.do(func() error { return m.RemoveAll() }) })
	return nm
}

func (nm *nsManager) do(f func() error) {
	nm.t.Helper()
	if err := nm.n.Do(func(ns.NetNS) error { return f() }); err != nil {
		nm.t.Fatal(err)
	}
}

func (nm *nsManager) sync(nodes ...Node) Status {
	nm.t.Helper()
	var st Status
	nm.do(func() (err error) { st, err = nm.m.Sync(nodes); return err })
	return st
}

// recorder keeps the messages logged, to tell a sync that changed
// something from one that did not.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	msg := rec.Message
	rec.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	r.msgs = append(r.msgs, msg)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.msgs
	r.msgs = nil
	return m
}

func ping(t *testing.T, from ns.NetNS, to string) {
	t.Helper()
	if out, err := in(from, "ping", "-c", "1", "-W", "2", to); err != nil {
		t.Errorf("ping %s: %v\n%s", to, err, out)
	}
}

func kinds(st Status) map[string]Kind {
	out := map[string]Kind{}
	for _, r := range st.Routes {
		out[r.Node] = r.Kind
	}
	return out
}

func TestVXLANAcrossSubnets(t *testing.T) {
	l := newLab(t)
	a := node("a", []string{"10.10.1.2"}, "10.244.1.0/24")
	b := node("b", []string{"10.10.2.2"}, "10.244.2.0/24")
	// c shares node A's subnet (it need not exist for a route via it).
	c := node("c", []string{"10.10.1.3"}, "10.244.3.0/24")
	mA := l.manager(t, l.nodeA, "a", Options{PodMTU: 1500})
	// B's pods get the MTU chosen from B's links, which fits the tunnel.
	auto := podMTUIn(t, l.nodeB, MTUOptions{InternalIPs: addrs("10.10.2.2"), PodCIDRs: prefixes("10.244.2.0/24")})
	mB := l.manager(t, l.nodeB, "b", Options{PodMTU: auto.MTU, PodMTUSource: auto.Source})
	router := l.router
	// Without the overlay the router drops pod traffic.
	if out, err := in(l.podA, "ping", "-c", "1", "-W", "1", "10.244.2.5"); err == nil {
		t.Fatalf("pod B reached with no route to it: the lab is wrong\n%s", out)
	}

	stA := mA.sync(a, b, c)
	if got, want := kinds(stA), map[string]Kind{"b": VXLAN, "c": Direct}; !reflect.DeepEqual(got, want) {
		t.Errorf("node A's routes %v, want %v (problems %v)", got, want, stA.Problems)
	}
	stB := mB.sync(a, b, c)
	if !reflect.DeepEqual(kinds(stB), map[string]Kind{"a": VXLAN, "c": VXLAN}) {
		t.Errorf("node B's routes %+v, problems %v", stB.Routes, stB.Problems)
	}
	if len(stB.Notes) != 0 || stB.PodMTU != auto || auto.MTU != 1450 {
		t.Errorf("node B: notes %+v, pods' MTU %+v; want no note, the MTU chosen (1450: ul's 1500 less VXLAN)", stB.Notes, stB.PodMTU)
	}
	ping(t, l.podA, "10.244.2.5")
	ping(t, l.podB, "10.244.1.5")

	dev := mustIn(t, l.nodeA, "ip", "-d", "link", "show", "usernet.vxlan")
	for _, want := range []string{"mtu 1450", "link/ether 0a:58:0a:0a:01:02", "vxlan id 4097", "local 10.10.1.2", "dev ul", "dstport 4789", "nolearning"} {
		if !strings.Contains(dev, want) {
			t.Errorf("device lacks %q:\n%s", want, dev)
		}
	}
	if addr := mustIn(t, l.nodeA, "ip", "-4", "addr", "show", "dev", "usernet.vxlan"); !strings.Contains(addr, "inet 10.244.1.0/32") {
		t.Errorf("device address:\n%s", addr)
	}
	if r := mustIn(t, l.nodeA, "ip", "route", "show", "10.244.2.0/24"); !strings.Contains(r, "via 10.244.2.0 dev usernet.vxlan proto 117 onlink") {
		t.Errorf("route to B's pods: %q", r)
	}
	// The port takes datagrams from the other nodes only: one from the
	// router is dropped (counted), B's tunnel still works.
	guard := mustIn(t, l.nodeA, "nft", "list", "table", "inet", GuardTable)
	for _, want := range []string{"4789", "10.10.1.3", "10.10.2.2", "counter packets 0"} {
		if !strings.Contains(guard, want) {
			t.Errorf("guard lacks %q:\n%s", want, guard)
		}
	}
	mustIn(t, router, "python3", "-c", `import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"\x08"+b"\x00"*15, ("10.10.1.2", 4789))`)
	ping(t, l.podB, "10.244.1.5")
	if guard := mustIn(t, l.nodeA, "nft", "list", "chain", "inet", GuardTable, "input"); !strings.Contains(guard, "counter packets 1 ") {
		t.Errorf("the router's datagram was not dropped:\n%s", guard)
	}
	if len(stA.Notes) != 1 || stA.Notes[0].Topic != "mtu" || !strings.Contains(stA.Notes[0].Message, "--mtu to 1450") {
		t.Errorf("notes %+v, want one on the MTU", stA.Notes)
	}

	// A second sync changes nothing.
	mA.log.take()
	if st2 := mA.sync(a, b, c); !reflect.DeepEqual(st2, stA) {
		t.Errorf("second sync: %+v, want %+v", st2, stA)
	}
	if msgs := mA.log.take(); len(msgs) != 0 {
		t.Errorf("second sync logged %q, want nothing", msgs)
	}

	// B's InternalIP changes (on B's subnet); a fourth node behind the
	// router keeps the device in use when B goes.
	d := node("d", []string{"10.10.2.9"}, "10.244.4.0/24")
	b2 := node("b", []string{"10.10.2.3"}, "10.244.2.0/24")
	mA.sync(a, b2, c, d)
	fdb := mustIn(t, l.nodeA, "bridge", "fdb", "show", "dev", "usernet.vxlan")
	if !strings.Contains(fdb, "0a:58:0a:0a:02:03 dst 10.10.2.3 self permanent") || strings.Contains(fdb, "0a:58:0a:0a:02:02") {
		t.Errorf("FDB after B's address changed:\n%s", fdb)
	}
	if neigh := mustIn(t, l.nodeA, "ip", "neigh", "show", "dev", "usernet.vxlan"); !strings.Contains(neigh, "10.244.2.0 lladdr 0a:58:0a:0a:02:03 PERMANENT") {
		t.Errorf("neighbours after B's address changed:\n%s", neigh)
	}

	// B leaves: its route, neighbour and FDB entry go, D's stay.
	mA.sync(a, c, d)
	fdb = mustIn(t, l.nodeA, "bridge", "fdb", "show", "dev", "usernet.vxlan")
	neigh := mustIn(t, l.nodeA, "ip", "neigh", "show", "dev", "usernet.vxlan")
	routes := mustIn(t, l.nodeA, "ip", "route", "show", "proto", "117")
	if strings.Contains(fdb, "0a:58:0a:0a:02:03") || !strings.Contains(fdb, "0a:58:0a:0a:02:09 dst 10.10.2.9") {
		t.Errorf("FDB after B left:\n%s", fdb)
	}
	if strings.Contains(neigh, "10.244.2.0") || !strings.Contains(neigh, "10.244.4.0 lladdr 0a:58:0a:0a:02:09") {
		t.Errorf("neighbours after B left:\n%s", neigh)
	}
	if strings.Contains(routes, "10.244.2.0/24") || !strings.Contains(routes, "10.244.4.0/24 via 10.244.4.0 dev usernet.vxlan") {
		t.Errorf("routes after B left:\n%s", routes)
	}

	// Uninstall leaves neither routes nor the device.
	mA.do(func() error { return mA.m.RemoveAll() })
	if out, err := in(l.nodeA, "ip", "link", "show", "usernet.vxlan"); err == nil {
		t.Errorf("device left after RemoveAll:\n%s", out)
	}
	if routes := mustIn(t, l.nodeA, "ip", "route", "show", "proto", "117"); routes != "" {
		t.Errorf("routes left after RemoveAll:\n%s", routes)
	}
	if out, err := in(l.nodeA, "nft", "list", "table", "inet", GuardTable); err == nil {
		t.Errorf("guard left after RemoveAll:\n%s", out)
	}
}

// TestVXLANDeviceOnlyWhenNeeded: peers all on-link make no device, and
// the device goes with the last peer that needed it.
func TestVXLANDeviceOnlyWhenNeeded(t *testing.T) {
	l := newLab(t)
	a := node("a", []string{"10.10.1.2"}, "10.244.1.0/24")
	b := node("b", []string{"10.10.2.2"}, "10.244.2.0/24")
	c := node("c", []string{"10.10.1.3"}, "10.244.3.0/24")
	mA := l.manager(t, l.nodeA, "a", Options{})
	exists := func() bool {
		var err error
		mA.do(func() error { _, err = net.InterfaceByName("usernet.vxlan"); return nil })
		return err == nil
	}
	mA.sync(a, c)
	if exists() {
		t.Error("device made with no peer behind a router")
	}
	if out, err := in(l.nodeA, "nft", "list", "table", "inet", GuardTable); err == nil {
		t.Errorf("guard with no VXLAN peer:\n%s", out)
	}
	mA.sync(a, b, c)
	if !exists() {
		t.Fatal("no device for a peer behind a router")
	}
	mA.sync(a, c)
	if exists() {
		t.Error("device kept after its last peer left")
	}
	// encapsulation vxlan: even the on-link peer goes through it.
	mV := l.manager(t, l.nodeA, "a", Options{Encapsulation: EncapVXLAN})
	if st := mV.sync(a, c); !reflect.DeepEqual(kinds(st), map[string]Kind{"c": VXLAN}) {
		t.Errorf("encapsulation vxlan: routes %+v, problems %v", st.Routes, st.Problems)
	}
	// Other tunnel parameters make the device anew, peers and all.
	mN := l.manager(t, l.nodeA, "a", Options{Encapsulation: EncapVXLAN, VXLANVNI: 77, VXLANPort: 8472})
	mN.sync(a, c)
	dev := mustIn(t, l.nodeA, "ip", "-d", "link", "show", "usernet.vxlan")
	if !strings.Contains(dev, "vxlan id 77 ") || !strings.Contains(dev, "dstport 8472") {
		t.Errorf("device after the VNI and port changed:\n%s", dev)
	}
	if fdb := mustIn(t, l.nodeA, "bridge", "fdb", "show", "dev", "usernet.vxlan"); !strings.Contains(fdb, "0a:58:0a:0a:01:03 dst 10.10.1.3") {
		t.Errorf("FDB of the new device:\n%s", fdb)
	}
	if guard := mustIn(t, l.nodeA, "nft", "list", "set", "inet", GuardTable, "port"); !strings.Contains(guard, "8472") {
		t.Errorf("guard after the port changed:\n%s", guard)
	}
	// This node's InternalIP is on none of its links: no device can have
	// that local end, and the one of the old address goes.
	st := mN.sync(node("a", []string{"10.10.9.9"}, "10.244.1.0/24"), c)
	if exists() || len(st.Problems) != 1 || !strings.Contains(st.Problems[0].Reason, "10.10.9.9 is on none of its links") {
		t.Errorf("with an InternalIP on no link: device there %v, problems %v", exists(), st.Problems)
	}
}

// TestVXLANIPv6 is the same overlay on an IPv6 underlay, dual stack.
func TestVXLANIPv6(t *testing.T) {
	l := newLab(t)
	a := node("a", []string{"10.10.1.2", "fd01::2"}, "10.244.1.0/24", "fd10:0:0:1::/64")
	b := node("b", []string{"10.10.2.2", "fd02::2"}, "10.244.2.0/24", "fd10:0:0:2::/64")
	mA := l.manager(t, l.nodeA, "a", Options{PodMTU: 1500})
	mB := l.manager(t, l.nodeB, "b", Options{})
	if out, err := in(l.podA, "ping", "-c", "1", "-W", "1", "fd10:0:0:2::5"); err == nil {
		t.Fatalf("pod B reached with no route to it: the lab is wrong\n%s", out)
	}
	for _, m := range []*nsManager{mA, mB} {
		if st := m.sync(a, b); len(st.Routes) != 2 || len(st.Problems) != 0 {
			t.Fatalf("status %+v", st)
		}
	}
	ping(t, l.podA, "fd10:0:0:2::5")
	ping(t, l.podB, "fd10:0:0:1::5")
	ping(t, l.podA, "10.244.2.5")
	mA.log.take()
	mA.sync(a, b)
	if msgs := mA.log.take(); len(msgs) != 0 {
		t.Errorf("second sync logged %q, want nothing", msgs)
	}

	dev := mustIn(t, l.nodeA, "ip", "-d", "link", "show", "usernet.vxlan6")
	for _, want := range []string{"mtu 1430", "link/ether " + macOf(netip.MustParseAddr("fd01::2")).String(), "vxlan id 4097", "local fd01::2", "dstport 4789", "nolearning"} {
		if !strings.Contains(dev, want) {
			t.Errorf("device lacks %q:\n%s", want, dev)
		}
	}
	if r := mustIn(t, l.nodeA, "ip", "-6", "route", "show", "fd10:0:0:2::/64"); !strings.Contains(r, "via fd10:0:0:2:: dev usernet.vxlan6 proto 117") {
		t.Errorf("route to B's pods: %q", r)
	}
	mA.do(func() error { return mA.m.RemoveAll() })
	if out, err := in(l.nodeA, "ip", "link", "show", "usernet.vxlan6"); err == nil {
		t.Errorf("device left after RemoveAll:\n%s", out)
	}
}
