package sourceguard

import (
	"errors"
	"fmt"
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

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
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
