package sourceguard

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// effectOf is the effect c's frame has when it is not dropped.
func (c frameCase) effectOf(r *rig) effect {
	_, e := c.frame(r, "effect of "+c.name)
	return e
}

// frameCase is one frame the pod sends and what it does unless dropped.
type frameCase struct {
	name string
	// frame builds the frame; its effect on the node, zero when the test
	// cannot observe one, and only the counter tells.
	frame func(r *rig, tag string) ([]byte, effect)
}

// forged are frames a subverted pod could send, each one the guard must
// drop and count.
var forged = []frameCase{
	{"IPv4 from another pod's address", func(r *rig, tag string) ([]byte, effect) {
		return udpFrame(r.nodeMAC, r.podMAC, otherIP4, nodeIP4, r.port, tag), effect{tag: tag}
	}},
	{"IPv4 from 0.0.0.0 to broadcast", func(r *rig, tag string) ([]byte, effect) {
		return udpFrame(broadcastMAC, r.podMAC, netip.IPv4Unspecified(), netip.MustParseAddr("255.255.255.255"), r.port, tag), effect{tag: tag}
	}},
	{"IPv6 from another pod's address", func(r *rig, tag string) ([]byte, effect) {
		return udpFrame(r.nodeMAC, r.podMAC, otherIP6, nodeIP6, r.port, tag), effect{tag: tag}
	}},
	{"another pod's source MAC", func(r *rig, tag string) ([]byte, effect) {
		return udpFrame(r.nodeMAC, otherMAC, podIP4, nodeIP4, r.port, tag), effect{tag: tag}
	}},
	{"priority-tagged 802.1Q (VLAN 0)", func(r *rig, tag string) ([]byte, effect) {
		f := udpFrame(r.nodeMAC, r.podMAC, podIP4, nodeIP4, r.port, tag)
		return vlanTagged(r.nodeMAC, r.podMAC, 0, unix.ETH_P_IP, f[14:]), effect{tag: tag}
	}},
	{"802.1Q VLAN 5", func(r *rig, tag string) ([]byte, effect) {
		f := udpFrame(r.nodeMAC, r.podMAC, podIP4, nodeIP4, r.port, tag)
		return vlanTagged(r.nodeMAC, r.podMAC, 5, unix.ETH_P_IP, f[14:]), effect{}
	}},
	{"MPLS", func(r *rig, tag string) ([]byte, effect) {
		f := udpFrame(r.nodeMAC, r.podMAC, podIP4, nodeIP4, r.port, tag)
		label := []byte{0, 0x10, 0x01, 64} // label 256, bottom of stack
		return ether(r.nodeMAC, r.podMAC, unix.ETH_P_MPLS_UC, append(label, f[14:]...)), effect{}
	}},
	{"ARP reply claiming another pod's address", func(r *rig, tag string) ([]byte, effect) {
		return ether(r.nodeMAC, r.podMAC, unix.ETH_P_ARP, arp(arpReply, r.podMAC, otherIP4, r.nodeMAC, nodeIP4)),
			effect{ip: otherIP4, mac: r.podMAC}
	}},
	{"ARP request from another pod's address", func(r *rig, tag string) ([]byte, effect) {
		return ether(broadcastMAC, r.podMAC, unix.ETH_P_ARP, arp(arpRequest, r.podMAC, thirdIP4, make(net.HardwareAddr, 6), nodeIP4)),
			effect{ip: thirdIP4, mac: r.podMAC}
	}},
	{"ARP pointing the pod's address at another MAC", func(r *rig, tag string) ([]byte, effect) {
		return ether(r.nodeMAC, r.podMAC, unix.ETH_P_ARP, arp(arpReply, otherMAC, podIP4, r.nodeMAC, nodeIP4)),
			effect{ip: podIP4, mac: otherMAC}
	}},
	{"neighbour advertisement for another pod's address", func(r *rig, tag string) ([]byte, effect) {
		return nd(allNodesMAC, r.podMAC, podIP6, allNodes, 136, naOverride, otherIP6, ndOpt(optTarget, r.podMAC)),
			effect{ip: otherIP6, mac: r.podMAC}
	}},
	{"neighbour advertisement pointing the pod's address at another MAC", func(r *rig, tag string) ([]byte, effect) {
		return nd(allNodesMAC, r.podMAC, podIP6, allNodes, 136, naOverride, podIP6, ndOpt(optTarget, otherMAC)),
			effect{ip: podIP6, mac: otherMAC}
	}},
	{"neighbour advertisement behind a hop-by-hop header", func(r *rig, tag string) ([]byte, effect) {
		body := append([]byte{naOverride, 0, 0, 0}, thirdIP6.AsSlice()...)
		body = append(body, ndOpt(optTarget, r.podMAC)...)
		hbh := []byte{unix.IPPROTO_ICMPV6, 0, 1, 4, 0, 0, 0, 0} // PadN
		p := ipv6(podIP6, allNodes, unix.IPPROTO_HOPOPTS, 255, hbh, icmpv6(podIP6, allNodes, 136, 0, body))
		return ether(allNodesMAC, r.podMAC, unix.ETH_P_IPV6, p), effect{ip: thirdIP6, mac: r.podMAC}
	}},
	{"neighbour solicitation from another pod's address", func(r *rig, tag string) ([]byte, effect) {
		return nd(r.nodeMAC, r.podMAC, otherIP6, nodeIP6, 135, 0, nodeIP6, ndOpt(optSource, r.podMAC)),
			effect{ip: otherIP6, mac: r.podMAC}
	}},
	{"neighbour solicitation with another MAC behind a nonce", func(r *rig, tag string) ([]byte, effect) {
		return nd(r.nodeMAC, r.podMAC, podIP6, nodeIP6, 135, 0, nodeIP6, ndOpt(optNonce, []byte{1, 2, 3, 4, 5, 6}), ndOpt(optSource, otherMAC)),
			effect{ip: podIP6, mac: otherMAC}
	}},
	{"duplicate address probe for the node's address", func(r *rig, tag string) ([]byte, effect) {
		return nd(allNodesMAC, r.podMAC, netip.IPv6Unspecified(), solicitedNode(nodeIP6), 135, 0, nodeIP6), effect{}
	}},
	{"router advertisement", func(r *rig, tag string) ([]byte, effect) {
		body := make([]byte, 12) // hop limit, flags, lifetime, reachable, retrans
		p := ipv6(podLL, allNodes, unix.IPPROTO_ICMPV6, 255, nil, icmpv6(podLL, allNodes, 134, 0, body))
		return ether(allNodesMAC, r.podMAC, unix.ETH_P_IPV6, p), effect{}
	}},
	{"redirect", func(r *rig, tag string) ([]byte, effect) {
		body := append(make([]byte, 4), podIP6.AsSlice()...) // reserved, target
		body = append(body, otherIP6.AsSlice()...)           // destination
		p := ipv6(podLL, nodeIP6, unix.IPPROTO_ICMPV6, 255, nil, icmpv6(podLL, nodeIP6, 137, 0, body))
		return ether(r.nodeMAC, r.podMAC, unix.ETH_P_IPV6, p), effect{}
	}},
}

// allowed are frames a pod sends in normal operation: the guard must let
// each through and not count it.
var allowed = []frameCase{
	{"IPv4 from the pod's address", func(r *rig, tag string) ([]byte, effect) {
		return r.udpFrom(podIP4, tag), effect{tag: tag}
	}},
	{"IPv6 from the pod's address", func(r *rig, tag string) ([]byte, effect) {
		return r.udpFrom(podIP6, tag), effect{tag: tag}
	}},
	{"IPv6 from a link-local address", func(r *rig, tag string) ([]byte, effect) {
		return r.udpFrom(podLL, tag), effect{tag: tag}
	}},
	{"gratuitous ARP for the pod's address", func(r *rig, tag string) ([]byte, effect) {
		return ether(broadcastMAC, r.podMAC, unix.ETH_P_ARP, arp(arpReply, r.podMAC, podIP4, broadcastMAC, podIP4)),
			effect{ip: podIP4, mac: r.podMAC}
	}},
	{"neighbour advertisement for the pod's address", func(r *rig, tag string) ([]byte, effect) {
		return nd(allNodesMAC, r.podMAC, podIP6, allNodes, 136, naOverride, podIP6, ndOpt(optTarget, r.podMAC)),
			effect{ip: podIP6, mac: r.podMAC}
	}},
	{"neighbour advertisement for a link-local address", func(r *rig, tag string) ([]byte, effect) {
		return nd(allNodesMAC, r.podMAC, podLL, allNodes, 136, naOverride, podLL, ndOpt(optTarget, r.podMAC)),
			effect{ip: podLL, mac: r.podMAC}
	}},
	{"neighbour advertisement without options", func(r *rig, tag string) ([]byte, effect) {
		return nd(allNodesMAC, r.podMAC, podIP6, allNodes, 136, 0, podIP6), effect{}
	}},
	{"neighbour solicitation from the pod's address", func(r *rig, tag string) ([]byte, effect) {
		return nd(r.nodeMAC, r.podMAC, podIP6, nodeIP6, 135, 0, nodeIP6, ndOpt(optSource, r.podMAC)),
			effect{ip: podIP6, mac: r.podMAC}
	}},
	{"duplicate address probe for the pod's address", func(r *rig, tag string) ([]byte, effect) {
		return nd(allNodesMAC, r.podMAC, netip.IPv6Unspecified(), solicitedNode(podIP6), 135, 0, podIP6, ndOpt(optNonce, []byte{1, 2, 3, 4, 5, 6})), effect{}
	}},
	{"router solicitation", func(r *rig, tag string) ([]byte, effect) {
		p := ipv6(podLL, allRouters, unix.IPPROTO_ICMPV6, 255, nil, icmpv6(podLL, allRouters, 133, 0, make([]byte, 4)))
		return ether(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 2}, r.podMAC, unix.ETH_P_IPV6, p), effect{}
	}},
}

// solicitedNode is the solicited-node multicast address of a (RFC 4291).
func solicitedNode(a netip.Addr) netip.Addr {
	b := netip.MustParseAddr("ff02::1:ff00:0").As16()
	s := a.As16()
	copy(b[13:], s[13:])
	return netip.AddrFrom16(b)
}

// each runs f on every case as a subtest of t. The rig's helpers report to
// r.t, which must be the running test's: failing a parent from a subtest
// is not allowed.
func (r *rig) each(t *testing.T, cases []frameCase, f func(*testing.T, frameCase)) {
	prev := r.t
	defer func() { r.t = prev }()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r.t = t
			f(t, c)
		})
	}
}

// run sends c's frame and reports whether its effect showed, and by how
// much the guard's counter grew (0 without a guard).
func (r *rig) run(c frameCase, guarded bool) (bool, uint64) {
	r.t.Helper()
	frame, e := c.frame(r, r.tag(c.name))
	if e.ip.IsValid() {
		r.forget(e.ip)
	}
	var before uint64
	if guarded {
		before = r.dropped()
	}
	r.send(frame)
	r.settle()
	happened := e.observable() && r.happened(e)
	if !guarded {
		return happened, 0
	}
	return happened, r.dropped() - before
}

// TestGuard sends, from the pod, every forged and every normal frame,
// first without the guard (each forged frame that has an observable effect
// must have it, or the test would prove nothing) and then with it.
func TestGuard(t *testing.T) {
	r := newRig(t, true)
	parent := r.t

	t.Run("without the guard", func(t *testing.T) {
		r.each(t, append(slices.Clone(forged), allowed...), func(t *testing.T, c frameCase) {
			e := c.effectOf(r)
			if !e.observable() {
				t.Skip("no effect the test can see")
			}
			if happened, _ := r.run(c, false); !happened {
				t.Errorf("got no effect, want %s (so the test could not show a guard stopping it)", e)
			}
		})
	})

	r.install(podIP4, podIP6)
	t.Run("forged", func(t *testing.T) {
		r.each(t, forged, func(t *testing.T, c frameCase) {
			e := c.effectOf(r)
			happened, counted := r.run(c, true)
			if happened {
				t.Errorf("got %s, want it dropped", e)
			}
			if counted != 1 {
				t.Errorf("got the counter up by %d, want 1", counted)
			}
		})
	})
	t.Run("allowed", func(t *testing.T) {
		r.each(t, allowed, func(t *testing.T, c frameCase) {
			e := c.effectOf(r)
			happened, counted := r.run(c, true)
			if e.observable() && !happened {
				t.Errorf("got no effect, want %s", e)
			}
			if counted != 0 {
				t.Errorf("got the counter up by %d, want 0", counted)
			}
		})
	})
	t.Run("kernel traffic", func(t *testing.T) {
		r.t = t
		defer func() { r.t = parent }()
		before := r.dropped()
		kernelTraffic(t, r)
		if got := r.dropped() - before; got != 0 {
			t.Errorf("frames dropped during the pod kernel's traffic: got %d, want 0", got)
		}
	})
}

// kernelTraffic checks what the pod's kernel sends on its own: ARP and NDP
// (the node resolves the pod and the pod resolves the node, from empty
// neighbour tables), TCP both ways, and a bulk transfer whose segments
// cross the veth as GSO super-frames.
func kernelTraffic(t *testing.T, r *rig) {
	forgetAll := func() {
		r.forget(podIP4, podIP6)
		r.inPod(func() error {
			for _, ip := range []netip.Addr{nodeIP4, nodeIP6} {
				n := &netlink.Neigh{LinkIndex: r.podIndex, IP: ip.AsSlice()}
				if err := netlink.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
					return fmt.Errorf("deleting the pod's neighbour entry of %s: %w", ip, err)
				}
			}
			return nil
		})
	}
	for _, dir := range []struct {
		name       string
		from, to   ns.NetNS
		to4, to6   netip.Addr
		sendsBytes bool // the dialler writes (from the pod: GSO out of it)
	}{
		{"node to pod", r.node, r.pod, podIP4, podIP6, false},
		{"pod to node", r.pod, r.node, nodeIP4, nodeIP6, true},
	} {
		for _, ip := range []netip.Addr{dir.to4, dir.to6} {
			forgetAll()
			ln := nettest.Listen(t, dir.to, "tcp", nettest.HostPort(ip, 0))
			const size = 8 << 20
			done := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					done <- err
					return
				}
				defer c.Close()
				if dir.sendsBytes {
					n, err := io.Copy(io.Discard, c)
					if err == nil && n != size {
						err = fmt.Errorf("got %d bytes, want %d", n, size)
					}
					done <- err
					return
				}
				_, err = c.Write(make([]byte, size))
				done <- err
			}()
			c, err := nettest.Dial(dir.from, "tcp", ln.Addr().String(), 5*time.Second)
			if err != nil {
				t.Errorf("%s, dialling %s: %v", dir.name, ln.Addr(), err)
				continue
			}
			c.SetDeadline(time.Now().Add(20 * time.Second))
			if dir.sendsBytes {
				_, err = c.Write(make([]byte, size))
				c.Close()
			} else {
				var n int64
				n, err = io.Copy(io.Discard, c)
				c.Close()
				if err == nil && n != size {
					err = fmt.Errorf("got %d bytes, want %d", n, size)
				}
			}
			if err != nil {
				t.Errorf("%s over %s: %v", dir.name, ip, err)
			}
			if err := <-done; err != nil {
				t.Errorf("%s over %s, far end: %v", dir.name, ip, err)
			}
			// Both tables started empty: the node learnt the pod from
			// the pod's ARP or NDP request or reply, which passed.
			pod := podIP4
			if ip.Is6() {
				pod = podIP6
			}
			if got := r.neighbour(pod); got != r.podMAC.String() {
				t.Errorf("%s over %s, the node's neighbour entry for %s: got %q, want %s", dir.name, ip, pod, got, r.podMAC)
			}
		}
	}
}

// TestFamilies: a pod with addresses of one family sends nothing of the
// other, and what it sends of its own still passes.
func TestFamilies(t *testing.T) {
	r := newRig(t, false)
	parent := r.t
	defer func() { r.t = parent }()
	ipv4Cases := pick("IPv4 from the pod's address", "gratuitous ARP for the pod's address")
	ipv6Cases := pick("IPv6 from the pod's address", "IPv6 from a link-local address", "neighbour advertisement for the pod's address", "neighbour solicitation from the pod's address", "duplicate address probe for the pod's address")
	cases := []struct {
		name      string
		ips       []netip.Addr
		allowed   []frameCase
		forbidden []frameCase
	}{
		{"IPv4 only", []netip.Addr{podIP4}, ipv4Cases, append(slices.Clone(ipv6Cases), pick("router solicitation")...)},
		{"IPv6 only", []netip.Addr{podIP6}, ipv6Cases, ipv4Cases},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r.t = t
			r.install(tc.ips...)
			t.Run("dropped", func(t *testing.T) {
				r.each(t, tc.forbidden, func(t *testing.T, c frameCase) {
					if happened, counted := r.run(c, true); happened || counted != 1 {
						t.Errorf("got effect %v and the counter up by %d, want no effect and 1", happened, counted)
					}
				})
			})
			t.Run("allowed", func(t *testing.T) {
				r.each(t, tc.allowed, func(t *testing.T, c frameCase) {
					e := c.effectOf(r)
					if happened, counted := r.run(c, true); happened != e.observable() || counted != 0 {
						t.Errorf("got effect %v and the counter up by %d, want effect %v and 0", happened, counted, e.observable())
					}
				})
			})
		})
	}
}

// pick returns the allowed cases of these names.
func pick(names ...string) []frameCase {
	var out []frameCase
	for _, c := range allowed {
		if slices.Contains(names, c.name) {
			out = append(out, c)
		}
	}
	if len(out) != len(names) {
		panic(fmt.Sprintf("pick %q: found %d cases", names, len(out)))
	}
	return out
}

// TestInstallTwice: a second Install replaces the first whole (one table,
// the same chains, the new addresses only) and keeps the count.
func TestInstallTwice(t *testing.T) {
	r := newRig(t, false)
	r.install(podIP4, podIP6)
	r.send(r.udpFrom(otherIP4, r.tag("spoofed")))
	r.settle()
	if got := r.dropped(); got != 1 {
		t.Fatalf("drops after one forged frame: got %d, want 1", got)
	}
	first := r.chains()

	r.install(podIP4, podIP6)
	if got := r.chains(); !slices.Equal(got, first) {
		t.Errorf("chains after a second Install: got %v, want %v", got, first)
	}
	if got := r.tables(); !slices.Equal(got, []string{TableName(nodeLink)}) {
		t.Errorf("netdev tables after a second Install: got %v, want [%s]", got, TableName(nodeLink))
	}
	if got := r.dropped(); got != 1 {
		t.Errorf("drops after a second Install: got %d, want 1 (carried over)", got)
	}

	// The pod's address changed: the old one is now someone else's.
	r.install(otherIP4)
	tag := r.tag("old address")
	r.send(r.udpFrom(podIP4, tag))
	r.settle()
	if r.received(tag) {
		t.Errorf("a datagram from the replaced address %s: got it delivered, want it dropped", podIP4)
	}
	if got := r.dropped(); got != 2 {
		t.Errorf("drops after a frame from the replaced address: got %d, want 2", got)
	}
}

// TestRemove: Remove takes the guard away whole, twice is fine, and so is
// a link that never had one or no longer exists.
func TestRemove(t *testing.T) {
	r := newRig(t, false)
	r.install(podIP4, podIP6)
	for i := range 2 {
		r.inNode(func() error { return Remove(nodeLink) })
		if got := r.tables(); len(got) != 0 {
			t.Errorf("netdev tables after Remove #%d: got %v, want none", i+1, got)
		}
	}
	tag := r.tag("spoofed")
	r.send(r.udpFrom(otherIP4, tag))
	r.settle()
	if !r.received(tag) {
		t.Errorf("a forged datagram after Remove: got it dropped, want it delivered (the guard is gone)")
	}
	r.inNode(func() error {
		if _, err := Dropped(nodeLink); !errors.Is(err, ErrNotInstalled) {
			t.Errorf("Dropped after Remove: got error %v, want ErrNotInstalled", err)
		}
		if err := Remove("sg-unknown"); err != nil {
			t.Errorf("Remove of a link that never had a guard: got %v, want nil", err)
		}
		if err := Install(Guard{Link: nodeLink, MAC: r.podMAC, IPs: []netip.Addr{podIP4}}); err != nil {
			return err
		}
		link, err := netlink.LinkByName(nodeLink)
		if err != nil {
			return err
		}
		if err := netlink.LinkDel(link); err != nil {
			return err
		}
		if err := Remove(nodeLink); err != nil {
			t.Errorf("Remove after the link was deleted: got %v, want nil", err)
		}
		if err := Remove(nodeLink); err != nil {
			t.Errorf("second Remove after the link was deleted: got %v, want nil", err)
		}
		tables, err := listTables()
		if err != nil {
			return err
		}
		if len(tables) != 0 {
			t.Errorf("netdev tables after Remove of a deleted link: got %v, want none", tables)
		}
		return nil
	})
}

// TestInstallMissingLink: a guard for a link that does not exist is an
// error, whatever the kernel would accept, and leaves nothing behind.
func TestInstallMissingLink(t *testing.T) {
	nettest.RequireRoot(t)
	netns := nettest.NewNS(t)
	err := nettest.In(netns, func() error {
		err := Install(Guard{Link: "sg-missing", MAC: otherMAC, IPs: []netip.Addr{podIP4}})
		if err == nil {
			t.Errorf("Install on a missing link: got nil, want an error")
		}
		tables, err := listTables()
		if err != nil {
			return err
		}
		if len(tables) != 0 {
			t.Errorf("netdev tables after a failed Install: got %v, want none", tables)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
