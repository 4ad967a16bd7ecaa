// SPDX-License-Identifier: Apache-2.0

package sockmap

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The Service rig: pods A and B each on a veth to a node namespace,
// which routes between them and translates a cluster IP to pod B as
// kube-proxy does (nftables DNAT in prerouting). The kernel's TCP in the
// pods stands in for their stacks: the client's socket is A:e → VIP:80,
// the server's B:8080 ← A:e, as through two stacks.
var (
	svcA     = [2]netip.Prefix{netip.MustParsePrefix("10.251.81.1/30"), netip.MustParsePrefix("fd00:251:81::1/64")}
	svcNodeA = [2]netip.Prefix{netip.MustParsePrefix("10.251.81.2/30"), netip.MustParsePrefix("fd00:251:81::2/64")}
	svcB     = [2]netip.Prefix{netip.MustParsePrefix("10.251.82.1/30"), netip.MustParsePrefix("fd00:251:82::1/64")}
	svcNodeB = [2]netip.Prefix{netip.MustParsePrefix("10.251.82.2/30"), netip.MustParsePrefix("fd00:251:82::2/64")}
	svcVIP   = [2]netip.AddrPort{netip.MustParseAddrPort("10.251.83.10:80"), netip.MustParseAddrPort("[fd00:251:83::10]:80")}
)

const svcBackendPort = 8080

type serviceRig struct {
	*rig
	a, b   pod
	node   ns.NetNS
	toB    string // the node's end of pod B's link
	toA    string
	direct func(*Node, pod) error
}

// newServiceRig builds the rig; enableA and enableB put the pods in the
// redirect (nil: left out). The service program goes on the node's end
// of pod B's link, as ADD puts it on a direct pod's.
func newServiceRig(t *testing.T, enableA, enableB func(*Node, pod) error) *serviceRig {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (Debian's nftables) for the node's DNAT")
	}
	r := newRig(t, false)
	if spec, err := btf.LoadKernelSpec(); err == nil {
		if _, err := ctLayoutIn(spec); err != nil {
			t.Skipf("no Service joins on this kernel: %v", err)
		}
	}
	bNS, bCookie := newPodNS(t)
	nodeNS, _ := newPodNS(t)
	s := &serviceRig{rig: r, a: pod{netns: r.netns, cookie: r.cookie}, b: pod{netns: bNS, cookie: bCookie}, node: nodeNS}
	suffix := time.Now().UnixNano() % 100000
	s.toA, s.toB = fmt.Sprintf("usn-sa%d", suffix), fmt.Sprintf("usn-sb%d", suffix)
	for _, l := range []struct {
		p        *pod
		hostName string
		pod, gw  [2]netip.Prefix
	}{{&s.a, s.toA, svcA, svcNodeA}, {&s.b, s.toB, svcB, svcNodeB}} {
		if err := nodeNS.Do(func(ns.NetNS) error {
			veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: l.hostName}, PeerName: l.hostName + "p"}
			if err := netlink.LinkAdd(veth); err != nil {
				return err
			}
			host, err := netlink.LinkByName(l.hostName)
			if err != nil {
				return err
			}
			for _, g := range l.gw {
				if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: prefixNet(g), Flags: unix.IFA_F_NODAD}); err != nil {
					return err
				}
			}
			if err := netlink.LinkSetUp(host); err != nil {
				return err
			}
			peer, err := netlink.LinkByName(l.hostName + "p")
			if err != nil {
				return err
			}
			return netlink.LinkSetNsFd(peer, int(l.p.netns.Fd()))
		}); err != nil {
			t.Fatal(err)
		}
		if err := l.p.netns.Do(func(ns.NetNS) error {
			link, err := netlink.LinkByName(l.hostName + "p")
			if err != nil {
				return err
			}
			for _, a := range l.pod {
				if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: prefixNet(a), Flags: unix.IFA_F_NODAD}); err != nil {
					return err
				}
				l.p.addrs = append(l.p.addrs, a.Addr())
			}
			if err := netlink.LinkSetUp(link); err != nil {
				return err
			}
			for _, g := range l.gw {
				if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: g.Addr().AsSlice()}); err != nil {
					return fmt.Errorf("default route via %s: %w", g.Addr(), err)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	rules := fmt.Sprintf(`table ip usnsvc {
	chain pre { type nat hook prerouting priority dstnat; ip daddr %s tcp dport %d dnat to %s:%d; }
}
table ip6 usnsvc {
	chain pre { type nat hook prerouting priority dstnat; ip6 daddr %s tcp dport %d dnat to [%s]:%d; }
}
`, svcVIP[0].Addr(), svcVIP[0].Port(), svcB[0].Addr(), svcBackendPort, svcVIP[1].Addr(), svcVIP[1].Port(), svcB[1].Addr(), svcBackendPort)
	s.nft(rules)
	if err := nodeNS.Do(func(ns.NetNS) error {
		for _, p := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
				return err
			}
		}
		return r.node.AttachServices(s.toB)
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		p      pod
		enable func(*Node, pod) error
	}{{s.a, enableA}, {s.b, enableB}} {
		if c.enable != nil {
			if err := c.enable(r.node, c.p); err != nil {
				t.Fatal(err)
			}
		}
	}
	return s
}

// nft loads rules into the node namespace.
func (s *serviceRig) nft(rules string) {
	s.t.Helper()
	cmd := exec.Command("nsenter", "--net="+s.node.Path(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		s.t.Fatalf("nft: %v: %s", err, out)
	}
}

// dialService connects an application of from to the Service's cluster
// IP of family (0: IPv4, 1: IPv6), which pod B's listener at port 8080
// answers; both ends are established when it returns.
func (s *serviceRig) dialService(from pod, family int) (client, server *net.TCPConn) {
	s.t.Helper()
	var ln net.Listener
	if err := s.b.netns.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(s.b.addrs[family], svcBackendPort).String())
		return err
	}); err != nil {
		s.t.Fatal(err)
	}
	defer ln.Close()
	if err := from.netns.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", svcVIP[family].String(), 5*time.Second)
		if err != nil {
			return err
		}
		client = c.(*net.TCPConn)
		return nil
	}); err != nil {
		s.t.Fatal(err)
	}
	c, err := ln.Accept()
	if err != nil {
		client.Close()
		s.t.Fatal(err)
	}
	server = c.(*net.TCPConn)
	s.t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func (s *serviceRig) statsOf(p pod) Stats {
	s.t.Helper()
	st, err := s.rig.node.Stats(p.cookie)
	if err != nil {
		s.t.Fatal(err)
	}
	return st
}

// entries lists the services map: each key's local address and port.
func (s *serviceRig) entries() []string {
	s.t.Helper()
	var out []string
	var key [svcKeySize]byte
	var val [svcValSize]byte
	it := s.rig.node.services.Iterate()
	for it.Next(&key, &val) {
		out = append(out, fmt.Sprintf("%s:%d→%s:%d (flags %d)",
			netip.AddrFrom16([16]byte(key[tailLIP:tailLIP+16])).Unmap(), binary.NativeEndian.Uint32(key[tailLPort:]),
			netip.AddrFrom16([16]byte(val[tailLIP:tailLIP+16])).Unmap(), binary.NativeEndian.Uint32(val[tailLPort:]),
			binary.NativeEndian.Uint32(val[svcFlags:])))
	}
	if err := it.Err(); err != nil {
		s.t.Fatal(err)
	}
	return out
}

// waitEntries waits for the services map to hold n entries (a close
// reaches sock_ops from the kernel's own timers, after Close returns).
func (s *serviceRig) waitEntries(n int) {
	s.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := s.entries()
		if len(got) == n {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("services map holds %d entries, want %d: %v", len(got), n, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServiceJoinsTwoPods: a connection from a direct pod to a Service
// whose backend is another direct pod joins, IPv4 and IPv6, with every
// message whole and in order; the client's pod is charged one entry for
// it while it is open, and the close takes both ends' entries away.
func TestServiceJoinsTwoPods(t *testing.T) {
	s := newServiceRig(t, direct, direct)
	for family := range 2 {
		beforeA, beforeB := s.statsOf(s.a).Direct, s.statsOf(s.b).Direct
		client, server := s.dialService(s.a, family)
		if got := s.entries(); len(got) != 2 {
			t.Fatalf("IPv%d: services map %v, want the client's and the server's entries", 4+2*family, got)
		}
		if got := s.statsOf(s.a).Services; got != 1 {
			t.Errorf("IPv%d: pod A is charged %d translations, want 1", 4+2*family, got)
		}
		pingPong(t, client, server, 2000, 100)
		if got := s.statsOf(s.a).Direct - beforeA; got != 2000 {
			t.Errorf("IPv%d: pod A sent %d messages straight to pod B's application, want all 2000", 4+2*family, got)
		}
		if got := s.statsOf(s.b).Direct - beforeB; got != 2000 {
			t.Errorf("IPv%d: pod B answered %d messages straight to pod A's application, want all 2000", 4+2*family, got)
		}
		client.Close()
		server.Close()
		s.waitEntries(0)
		if got := s.statsOf(s.a).Services; got != 0 {
			t.Errorf("IPv%d: pod A is still charged %d translations after the close", 4+2*family, got)
		}
	}
}

// TestServiceNeedsDirectPods: a connection is joined only when both
// pods say direct; a client pod that did not gets no translation at all.
func TestServiceNeedsDirectPods(t *testing.T) {
	for _, c := range []struct {
		name        string
		a, b        func(*Node, pod) error
		translation bool
	}{
		{"client both", both, direct, false},
		{"client left out", nil, direct, false},
		{"backend both", direct, both, true},
		{"backend left out", direct, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newServiceRig(t, c.a, c.b)
			client, server := s.dialService(s.a, 0)
			pingPong(t, client, server, 200, 64)
			for _, p := range []pod{s.a, s.b} {
				if st, err := s.rig.node.Stats(p.cookie); err == nil && st.Direct != 0 {
					t.Errorf("stats %+v: joined a pod that did not say direct", st)
				}
			}
			if got := s.entries(); (len(got) != 0) != c.translation {
				t.Errorf("services map %v, want a translation: %v", got, c.translation)
			}
		})
	}
}

// TestServiceSourceTranslated: a connection the node translates at
// both ends (SNAT as well, as kube-proxy does for a pod reaching itself
// through its Service) reaches the backend from the node, not from the
// client: no translation is recorded, and it goes through TCP.
func TestServiceSourceTranslated(t *testing.T) {
	s := newServiceRig(t, direct, direct)
	s.nft(fmt.Sprintf(`table ip usnsvc {
	chain post { type nat hook postrouting priority srcnat; ip daddr %s tcp dport %d masquerade; }
}
`, svcB[0].Addr(), svcBackendPort))
	client, server := s.dialService(s.a, 0)
	if got := server.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); got != svcNodeB[0].Addr() {
		t.Fatalf("the server sees %s: the node did not masquerade", got)
	}
	pingPong(t, client, server, 200, 64)
	if got := s.entries(); len(got) != 0 {
		t.Errorf("services map %v: a translation for a connection the node also masqueraded", got)
	}
	if st := s.statsOf(s.a); st.Direct != 0 {
		t.Errorf("pod A: stats %+v: joined through a masquerade", st)
	}
}

// TestServiceOtherPodsTranslation: a direct pod that gives itself pod
// A's address and the cluster IP (CAP_NET_ADMIN) and opens and closes a
// socket with A's very four-tuple cannot take A's translation away: a
// close removes one only from its own pod's address. A keeps joining.
func TestServiceOtherPodsTranslation(t *testing.T) {
	s := newServiceRig(t, direct, direct)
	evilNS, evil := newPodNS(t)
	if err := s.rig.node.EnableDirect(evil, []netip.Addr{netip.MustParseAddr("10.251.84.1")}); err != nil {
		t.Fatal(err)
	}
	client, server := s.dialService(s.a, 0)
	pingPong(t, client, server, 10, 64)
	local := client.LocalAddr().(*net.TCPAddr).AddrPort()
	if err := evilNS.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, a := range []netip.Addr{local.Addr(), svcVIP[0].Addr()} {
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a, 32))}); err != nil {
				return err
			}
		}
		ln, err := net.Listen("tcp4", svcVIP[0].String())
		if err != nil {
			return err
		}
		defer ln.Close()
		dl := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local)}
		c, err := dl.Dial("tcp4", svcVIP[0].String())
		if err != nil {
			return err
		}
		a, err := ln.Accept()
		if err != nil {
			c.Close()
			return err
		}
		c.Close()
		a.Close()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the impostor's close reaches sock_ops
	if got := s.entries(); len(got) != 2 {
		t.Fatalf("services map %v after the impostor's close, want pod A's connection's two entries", got)
	}
	before := s.statsOf(s.a).Direct
	pingPong(t, client, server, 200, 64)
	if got := s.statsOf(s.a).Direct - before; got != 200 {
		t.Errorf("pod A sent %d of 200 messages straight to pod B after the impostor's close", got)
	}
}

// TestServiceCap: a pod at its cap of translations gets no more (its
// new connections go through the stacks); one under it does.
func TestServiceCap(t *testing.T) {
	s := newServiceRig(t, direct, direct)
	charge := func(n uint32) {
		var c counters
		if err := s.rig.node.counters.Lookup(s.a.cookie, &c); err != nil {
			t.Fatal(err)
		}
		binary.NativeEndian.PutUint32(c[nsServicesOff:], n)
		if err := s.rig.node.counters.Update(s.a.cookie, c, ebpf.UpdateExist); err != nil {
			t.Fatal(err)
		}
	}
	charge(MaxSocketsPerPod)
	client, server := s.dialService(s.a, 0)
	pingPong(t, client, server, 50, 64)
	if got := s.entries(); len(got) != 0 {
		t.Errorf("services map %v: a pod at its cap got a translation", got)
	}
	if st := s.statsOf(s.a); st.Direct != 0 || st.Services != MaxSocketsPerPod {
		t.Errorf("pod A at its cap: stats %+v", st)
	}
	charge(MaxSocketsPerPod - 1)
	client, server = s.dialService(s.a, 0)
	pingPong(t, client, server, 50, 64)
	if got := s.entries(); len(got) != 2 {
		t.Errorf("services map %v: a pod under its cap got no translation", got)
	}
	if st := s.statsOf(s.a); st.Direct != 50 || st.Services != MaxSocketsPerPod {
		t.Errorf("pod A one under its cap: stats %+v, want 50 messages joined and the cap reached", st)
	}
}

// TestServiceForgottenAtDisable: a pod's DEL takes the entries of its
// sockets away; the other end's entry, which names it, is inert without
// them and goes with its own socket's close.
func TestServiceForgottenAtDisable(t *testing.T) {
	s := newServiceRig(t, direct, direct)
	client, server := s.dialService(s.a, 0)
	pingPong(t, client, server, 10, 64)
	if got := s.entries(); len(got) != 2 {
		t.Fatalf("services map %v, want two entries", got)
	}
	if err := s.rig.node.Disable(s.b.cookie); err != nil {
		t.Fatal(err)
	}
	if got := s.entries(); len(got) != 1 || !strings.HasSuffix(got[0], "(flags 1)") {
		t.Errorf("services map %v after pod B's DEL, want pod A's client entry alone", got)
	}
	client.Close()
	server.Close()
	s.waitEntries(0)
	if got := s.statsOf(s.a).Services; got != 0 {
		t.Errorf("pod A is still charged %d translations after its close", got)
	}
}

// TestServiceNeedsBothEntries: a connection whose other end's entry is
// gone (its pod's DEL, a reused address) joins no more; what it sends
// goes through TCP, in order after what it redirected.
func TestServiceNeedsBothEntries(t *testing.T) {
	s := newServiceRig(t, direct, direct)
	client, server := s.dialService(s.a, 0)
	pingPong(t, client, server, 100, 64)
	before := s.statsOf(s.a).Direct
	if before != 100 {
		t.Fatalf("pod A joined %d of 100 messages", before)
	}
	var key [svcKeySize]byte
	var val [svcValSize]byte
	var serverKey []byte
	it := s.rig.node.services.Iterate()
	for it.Next(&key, &val) {
		if binary.NativeEndian.Uint32(val[svcFlags:])&svcClient == 0 {
			serverKey = append([]byte(nil), key[:]...)
		}
	}
	if serverKey == nil {
		t.Fatalf("no server entry in %v", s.entries())
	}
	if err := s.rig.node.services.Delete(serverKey); err != nil {
		t.Fatal(err)
	}
	pingPong(t, client, server, 100, 64)
	if got := s.statsOf(s.a).Direct; got != before {
		t.Errorf("pod A joined %d more messages without pod B's entry", got-before)
	}
}
