package sourceguard

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/test/nettest"
)

// The rig: a "node" and a "pod" namespace joined by a veth. The node end
// is the host-side link the guard goes on; the pod end has the pod's
// addresses as kernel addresses, so the pod's kernel resolves and answers
// as a pod would, and an AF_PACKET socket on it sends whatever a subverted
// pod could.
const (
	nodeLink = "sg-node"
	podLink  = "sg-pod"
)

var (
	nodeIP4  = netip.MustParseAddr("10.251.0.1")
	podIP4   = netip.MustParseAddr("10.251.0.2")
	otherIP4 = netip.MustParseAddr("10.251.0.3")
	thirdIP4 = netip.MustParseAddr("10.251.0.4")
	nodeIP6  = netip.MustParseAddr("fd51::1")
	podIP6   = netip.MustParseAddr("fd51::2")
	otherIP6 = netip.MustParseAddr("fd51::3")
	thirdIP6 = netip.MustParseAddr("fd51::5")
	// podLL is a link-local source the pod may use; any in fe80::/10 is
	// allowed.
	podLL = netip.MustParseAddr("fe80::1234")

	// otherMAC is another pod's MAC, the one a subverted pod would claim.
	otherMAC = net.HardwareAddr{0x02, 0x51, 0, 0, 0, 0x99}
)

type rig struct {
	t               *testing.T
	node, pod       ns.NetNS
	nodeMAC, podMAC net.HardwareAddr
	nodeIndex       int
	podIndex        int
	// fd is an AF_PACKET socket on the pod end, opened in the pod's
	// namespace: it sends frames, built whole, to the node.
	fd int
	// port is where the node's UDP socket listens.
	port uint16
	// marker is the source of the datagrams settle sends: an address the
	// guard in place allows.
	marker netip.Addr

	mu   sync.Mutex
	seen map[string]bool // payloads the node's sockets received
	tags int
}

// newRig builds the namespaces and the veth. podIPv6 gives the pod's
// kernel IPv6 on its link; without it the kernel sends no IPv6 of its own
// (MLD reports go on for a while after a link comes up), so a test that
// guards only IPv4 counts only the drops of the frames it sends.
func newRig(t *testing.T, podIPv6 bool) *rig {
	t.Helper()
	nettest.RequireRoot(t)
	r := &rig{t: t, node: nettest.NewNS(t), pod: nettest.NewNS(t), seen: make(map[string]bool), marker: podIP4}
	r.inNode(func() error {
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: nodeLink},
			PeerName:      podLink,
			PeerNamespace: netlink.NsFd(int(r.pod.Fd())),
		}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("adding veth %s: %w", nodeLink, err)
		}
		// The node forwards (a node is a router) and accepts unsolicited
		// ARP replies and neighbour advertisements: the settings under
		// which forged ones poison its tables, so that the baseline shows
		// each forged frame having its effect.
		for _, s := range []string{
			"ipv6/conf/" + nodeLink + "/accept_dad=0",
			"ipv6/conf/" + nodeLink + "/forwarding=1",
			"ipv6/conf/" + nodeLink + "/accept_untracked_na=1",
			"ipv4/conf/" + nodeLink + "/arp_accept=1",
		} {
			if err := sysctl(s); err != nil {
				return err
			}
		}
		return configure(nodeLink, nodeIP4, nodeIP6, &r.nodeMAC, &r.nodeIndex)
	})
	r.inPod(func() error {
		settings := []string{
			"ipv6/conf/" + podLink + "/accept_dad=0",
			"ipv6/conf/" + podLink + "/router_solicitations=0",
		}
		ip6 := podIP6
		if !podIPv6 {
			settings = append(settings, "ipv6/conf/"+podLink+"/disable_ipv6=1")
			ip6 = netip.Addr{}
		}
		for _, s := range settings {
			if err := sysctl(s); err != nil {
				return err
			}
		}
		if err := configure(podLink, podIP4, ip6, &r.podMAC, &r.podIndex); err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening a packet socket: %w", err)
		}
		r.fd = fd
		t.Cleanup(func() { unix.Close(fd) })
		return nil
	})
	for _, l := range []struct {
		netns ns.NetNS
		name  string
	}{{r.node, nodeLink}, {r.pod, podLink}} {
		if err := nettest.In(l.netns, func() error { return waitOperUp(l.name) }); err != nil {
			t.Fatal(err)
		}
	}
	// One dual-stack socket: it takes IPv4 (broadcast too) and IPv6.
	c := nettest.ListenUDP(t, r.node, ":0")
	r.port = uint16(c.LocalAddr().(*net.UDPAddr).Port)
	go r.receive(c)
	return r
}

func (r *rig) inNode(f func() error) {
	r.t.Helper()
	if err := nettest.In(r.node, f); err != nil {
		r.t.Fatalf("in the node namespace: %v", err)
	}
}

func (r *rig) inPod(f func() error) {
	r.t.Helper()
	if err := nettest.In(r.pod, f); err != nil {
		r.t.Fatalf("in the pod namespace: %v", err)
	}
}

func sysctl(setting string) error {
	i := len(setting) - 1
	for setting[i] != '=' {
		i--
	}
	if err := os.WriteFile("/proc/sys/net/"+setting[:i], []byte(setting[i+1:]), 0o644); err != nil {
		return fmt.Errorf("setting %s: %w", setting, err)
	}
	return nil
}

// configure gives link its addresses (ip6 only if valid; no duplicate
// address detection: the namespaces are the test's own) and sets it up.
func configure(name string, ip4, ip6 netip.Addr, mac *net.HardwareAddr, index *int) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	addrs := []*netlink.Addr{{IPNet: &net.IPNet{IP: ip4.AsSlice(), Mask: net.CIDRMask(24, 32)}}}
	if ip6.IsValid() {
		addrs = append(addrs, &netlink.Addr{IPNet: &net.IPNet{IP: ip6.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD})
	}
	for _, a := range addrs {
		if err := netlink.AddrAdd(link, a); err != nil {
			return fmt.Errorf("adding %s to %s: %w", a.IPNet, name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	*mac, *index = link.Attrs().HardwareAddr, link.Attrs().Index
	return nil
}

// waitOperUp waits for the carrier: linkwatch turns it on, and attaches
// the qdisc that lets frames out, up to a second after the link is set up.
func waitOperUp(name string) error {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		link, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("looking up %s: %w", name, err)
		}
		if link.Attrs().OperState == netlink.OperUp {
			return nil
		}
	}
	return fmt.Errorf("%s: not operationally up after 5s", name)
}

func (r *rig) receive(c *net.UDPConn) {
	buf := make([]byte, 2048)
	for {
		n, _, err := c.ReadFromUDP(buf)
		if err != nil {
			return
		}
		r.mu.Lock()
		r.seen[string(buf[:n])] = true
		r.mu.Unlock()
	}
}

// tag returns a payload no other datagram of the test carries.
func (r *rig) tag(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tags++
	return fmt.Sprintf("%s #%d", name, r.tags)
}

func (r *rig) received(tag string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[tag]
}

func (r *rig) send(frame []byte) {
	r.t.Helper()
	to := &unix.SockaddrLinklayer{Ifindex: r.podIndex, Halen: 6}
	copy(to.Addr[:], frame[0:6])
	if err := unix.Sendto(r.fd, frame, 0, to); err != nil {
		r.t.Fatalf("sending a %d-byte frame: %v", len(frame), err)
	}
}

// udpFrom is a datagram from the pod's MAC and src to the node's socket.
func (r *rig) udpFrom(src netip.Addr, tag string) []byte {
	dst, dstMAC := nodeIP4, r.nodeMAC
	if src.Is6() {
		dst = nodeIP6
	}
	return udpFrame(dstMAC, r.podMAC, src, dst, r.port, tag)
}

// settle sends a datagram the guard lets through and waits until the node
// received it. Frames sent before it have then been through the guard and
// the node's stack (each crossed the same veth from the same socket), so
// their effect, if any, is visible.
func (r *rig) settle() {
	r.t.Helper()
	tag := r.tag("marker")
	r.send(r.udpFrom(r.marker, tag))
	if !r.eventually(func() bool { return r.received(tag) }) {
		r.t.Fatalf("a datagram from the pod's %s did not reach the node: got nothing, want it delivered", r.marker)
	}
	time.Sleep(20 * time.Millisecond) // other CPUs' backlogs
}

// eventually polls ok for up to two seconds.
func (r *rig) eventually(ok func() bool) bool {
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if ok() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// neighbour returns the node's neighbour entry for ip on its link, "" if
// it has none it would use.
func (r *rig) neighbour(ip netip.Addr) string {
	r.t.Helper()
	family := netlink.FAMILY_V4
	if ip.Is6() {
		family = netlink.FAMILY_V6
	}
	var mac string
	r.inNode(func() error {
		neighs, err := netlink.NeighList(r.nodeIndex, family)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return fmt.Errorf("listing neighbours: %w", err)
		}
		for _, n := range neighs {
			if n.IP.Equal(ip.AsSlice()) && n.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED|netlink.NUD_NONE) == 0 && n.State != 0 {
				mac = n.HardwareAddr.String()
			}
		}
		return nil
	})
	return mac
}

// forget deletes the node's neighbour entries for ips.
func (r *rig) forget(ips ...netip.Addr) {
	r.t.Helper()
	r.inNode(func() error {
		for _, ip := range ips {
			n := &netlink.Neigh{LinkIndex: r.nodeIndex, IP: ip.AsSlice()}
			if err := netlink.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("deleting the neighbour entry of %s: %w", ip, err)
			}
		}
		return nil
	})
}

func (r *rig) dropped() uint64 {
	r.t.Helper()
	var n uint64
	r.inNode(func() (err error) {
		n, err = Dropped(nodeLink)
		return err
	})
	return n
}

func (r *rig) install(ips ...netip.Addr) {
	r.t.Helper()
	r.inNode(func() error { return Install(Guard{Link: nodeLink, MAC: r.podMAC, IPs: ips}) })
	r.marker = ips[0]
}

// effect is what a frame does to the node when nothing stops it.
type effect struct {
	// tag, if not "", is the payload of a datagram that reaches the
	// node's socket.
	tag string
	// ip and mac, if ip is valid, are a neighbour entry the node learns.
	ip  netip.Addr
	mac net.HardwareAddr
}

// observable reports whether the test can see the effect; when not, only
// the counter tells whether the frame was dropped.
func (e effect) observable() bool {
	return e.tag != "" || e.ip.IsValid()
}

func (e effect) String() string {
	if e.tag != "" {
		return fmt.Sprintf("datagram %q delivered", e.tag)
	}
	return fmt.Sprintf("neighbour %s at %s", e.ip, e.mac)
}

func (r *rig) happened(e effect) bool {
	if e.tag != "" {
		return r.received(e.tag)
	}
	return r.neighbour(e.ip) == e.mac.String()
}

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

func (r *rig) tables() []string {
	r.t.Helper()
	var names []string
	r.inNode(func() (err error) {
		names, err = listTables()
		return err
	})
	return names
}

func listTables() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyNetdev)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, tb := range tables {
		names = append(names, tb.Name)
	}
	return names, nil
}

// chains lists the chains of the guard's table with their rule counts.
func (r *rig) chains() []string {
	r.t.Helper()
	var out []string
	r.inNode(func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev)
		if err != nil {
			return err
		}
		for _, ch := range chains {
			if ch.Table.Name != TableName(nodeLink) {
				continue
			}
			rules, err := c.GetRules(ch.Table, ch)
			if err != nil {
				return err
			}
			out = append(out, fmt.Sprintf("%s/%d", ch.Name, len(rules)))
		}
		return nil
	})
	slices.Sort(out)
	return out
}
