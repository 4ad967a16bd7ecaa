package ingressdrop

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

const (
	linkA = "idrop-a"
	linkB = "idrop-b"
	addrA = "10.250.0.1"
	addrB = "10.250.0.2"
)

// newTestNS returns a throwaway network namespace that t.Cleanup removes,
// skipping the test when not root.
func newTestNS(t *testing.T) ns.NetNS {
	t.Helper()
	nettest.RequireRoot(t)
	return nettest.NewNS(t)
}

// vethPair joins two throwaway namespaces with a veth pair, linkA in a with
// addrA/24 and linkB in b with addrB/24, both up.
func vethPair(t *testing.T, a, b ns.NetNS) {
	t.Helper()
	err := a.Do(func(ns.NetNS) error {
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: linkA},
			PeerName:      linkB,
			PeerNamespace: netlink.NsFd(int(b.Fd())),
		}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("adding veth %s: %w", linkA, err)
		}
		return linkUp(linkA, addrA+"/24")
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Do(func(ns.NetNS) error { return linkUp(linkB, addrB+"/24") }); err != nil {
		t.Fatal(err)
	}
	// The kernel turns the carrier on, and attaches the qdisc that lets
	// frames out, from linkwatch up to a second later; wait for it so that
	// a failed dial means a drop, not a link still coming up.
	for _, l := range []struct {
		netns ns.NetNS
		name  string
	}{{a, linkA}, {b, linkB}} {
		if err := l.netns.Do(func(ns.NetNS) error { return waitOperUp(l.name) }); err != nil {
			t.Fatal(err)
		}
	}
}

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

func linkUp(name, cidr string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("adding %s to %s: %w", cidr, name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	return nil
}

// dial connects from netns to addr over TCP with a one second timeout.
func dial(netns ns.NetNS, addr string) error {
	return netns.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// dropped reports whether a dial failed the way it does when B's kernel
// never sees the SYN (or the ARP request): a timeout or an unreachable
// host, not a refusal, which would mean B's kernel answered.
func dropped(err error) bool {
	var ne net.Error
	return err != nil && !errors.Is(err, unix.ECONNREFUSED) &&
		(errors.As(err, &ne) && ne.Timeout() || errors.Is(err, unix.EHOSTUNREACH))
}

// dialRetry dials until it succeeds or 10 seconds pass: after a Remove, A
// may first have to resolve B's address again.
func dialRetry(netns ns.NetNS, addr string) error {
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if err = dial(netns, addr); err == nil {
			return nil
		}
	}
	return err
}

// listen accepts and closes TCP connections on addrB in netns until the test
// ends, and returns the address it listens on.
func listen(t *testing.T, netns ns.NetNS) string {
	t.Helper()
	var ln net.Listener
	err := netns.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(addrB, "0"))
		return err
	})
	if err != nil {
		t.Fatalf("listening on %s: %v", addrB, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// netdevTables lists the names of the netdev tables in netns.
func netdevTables(t *testing.T, netns ns.NetNS) []string {
	t.Helper()
	var names []string
	err := netns.Do(func(ns.NetNS) error {
		c, err := nftables.New(nftables.AsLasting())
		if err != nil {
			return err
		}
		defer c.CloseLasting()
		tables, err := c.ListTablesOfFamily(nftables.TableFamilyNetdev)
		if err != nil {
			return err
		}
		for _, tb := range tables {
			names = append(names, tb.Name)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("listing netdev tables: %v", err)
	}
	return names
}

// netdevChains counts the chains of table in netns.
func netdevChains(t *testing.T, netns ns.NetNS, table string) int {
	t.Helper()
	n := 0
	err := netns.Do(func(ns.NetNS) error {
		c, err := nftables.New(nftables.AsLasting())
		if err != nil {
			return err
		}
		defer c.CloseLasting()
		chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev)
		if err != nil {
			return err
		}
		for _, ch := range chains {
			if ch.Table != nil && ch.Table.Name == table {
				n++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("listing netdev chains: %v", err)
	}
	return n
}

func installed(t *testing.T, netns ns.NetNS, ifName string) bool {
	t.Helper()
	var ok bool
	err := netns.Do(func(ns.NetNS) error {
		var err error
		ok, err = Installed(ifName)
		return err
	})
	if err != nil {
		t.Fatalf("Installed(%s): %v", ifName, err)
	}
	return ok
}

func in(netns ns.NetNS, f func(string) error, ifName string) error {
	return netns.Do(func(ns.NetNS) error { return f(ifName) })
}

// packetSocket is an AF_PACKET socket bound to one link for protocol proto.
type packetSocket struct{ fd int }

func openPacketSocket(t *testing.T, netns ns.NetNS, ifName string, proto uint16) *packetSocket {
	t.Helper()
	var fd int
	err := netns.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName(ifName)
		if err != nil {
			return err
		}
		p := htons(proto)
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(p)); err != nil {
			return fmt.Errorf("opening AF_PACKET socket: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: p, Ifindex: link.Attrs().Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("binding AF_PACKET socket to %s: %w", ifName, err)
		}
		tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return &packetSocket{fd: fd}
}

// sawFrameTo reports whether, within wait, the socket receives an incoming
// ARP request for dst or an IPv4 packet addressed to dst.
func (s *packetSocket) sawFrameTo(dst net.IP, wait time.Duration) (bool, error) {
	buf := make([]byte, 65536)
	dst4 := dst.To4()
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); {
		n, from, err := unix.Recvfrom(s.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, err
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		if n < 14 {
			continue
		}
		frame := buf[:n]
		switch binary.BigEndian.Uint16(frame[12:14]) {
		case unix.ETH_P_IP:
			if len(frame) >= 14+20 && net.IP(frame[14+16:14+20]).Equal(dst4) {
				return true, nil
			}
		case unix.ETH_P_ARP:
			if len(frame) >= 14+28 && net.IP(frame[14+24:14+28]).Equal(dst4) {
				return true, nil
			}
		}
	}
	return false, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func TestInstallDropsIngress(t *testing.T) {
	a, b := newTestNS(t), newTestNS(t)
	vethPair(t, a, b)

	target := listen(t, b)

	if err := dial(a, target); err != nil {
		t.Fatalf("before Install: dialing %s from A: got %v, want success", target, err)
	}
	if installed(t, b, linkB) {
		t.Fatalf("before Install: Installed(%s) got true, want false", linkB)
	}

	// Install twice: one table with one chain.
	for i := range 2 {
		if err := in(b, Install, linkB); err != nil {
			t.Fatalf("Install(%s) #%d: %v", linkB, i+1, err)
		}
	}
	if got := netdevTables(t, b); len(got) != 1 || got[0] != TableName(linkB) {
		t.Errorf("after Install twice: got netdev tables %q, want [%q]", got, TableName(linkB))
	}
	if got := netdevChains(t, b, TableName(linkB)); got != 1 {
		t.Errorf("after Install twice: got %d chains, want 1", got)
	}
	if !installed(t, b, linkB) {
		t.Errorf("after Install: Installed(%s) got false, want true", linkB)
	}
	if got := netdevTables(t, a); len(got) != 0 {
		t.Errorf("after Install in B: got netdev tables %q in A, want none", got)
	}

	// The kernel in B no longer answers, but ETH_P_ALL taps still see the
	// frames A sends, and protocol-bound packet sockets do not.
	all := openPacketSocket(t, b, linkB, unix.ETH_P_ALL)
	ipOnly := openPacketSocket(t, b, linkB, unix.ETH_P_IP)
	if err := dial(a, target); !dropped(err) {
		t.Errorf("after Install: dialing %s from A: got %v, want a timeout", target, err)
	}
	if saw, err := all.sawFrameTo(net.ParseIP(addrB), time.Second); err != nil || !saw {
		t.Errorf("after Install: ETH_P_ALL socket on %s saw A's frames: got %v (%v), want true", linkB, saw, err)
	}
	if saw, err := ipOnly.sawFrameTo(net.ParseIP(addrB), 200*time.Millisecond); err != nil || saw {
		t.Errorf("after Install: ETH_P_IP socket on %s saw A's frames: got %v (%v), want false", linkB, saw, err)
	}

	// Remove once after two Installs: no table, traffic flows again.
	if err := in(b, Remove, linkB); err != nil {
		t.Fatalf("Remove(%s): %v", linkB, err)
	}
	if got := netdevTables(t, b); len(got) != 0 {
		t.Errorf("after Remove: got netdev tables %q, want none", got)
	}
	if installed(t, b, linkB) {
		t.Errorf("after Remove: Installed(%s) got true, want false", linkB)
	}
	if err := dialRetry(a, target); err != nil {
		t.Errorf("after Remove: dialing %s from A: got %v, want success", target, err)
	}
	if err := in(b, Remove, linkB); err != nil {
		t.Errorf("second Remove(%s): got %v, want nil", linkB, err)
	}
}

func TestRemoveWithoutInstall(t *testing.T) {
	netns := newTestNS(t)
	for _, name := range []string{"lo", "nosuchlink0"} {
		if err := in(netns, Remove, name); err != nil {
			t.Errorf("Remove(%s) without Install: got %v, want nil", name, err)
		}
	}
}

// TestInstallBeforeLink covers a link that does not exist yet. Older
// kernels refuse a netdev hook on a missing device; newer ones keep the hook
// by name and attach it when the device appears, so the link never
// passes a frame to the kernel.
func TestInstallBeforeLink(t *testing.T) {
	a, b := newTestNS(t), newTestNS(t)
	if err := in(b, Install, linkB); err != nil {
		if got := netdevTables(t, b); len(got) != 0 {
			t.Errorf("after failed Install: got netdev tables %q, want none", got)
		}
		t.Skipf("kernel binds netdev hooks only to existing links: Install(%s): %v", linkB, err)
	}
	vethPair(t, a, b)
	target := listen(t, b)
	if err := dial(a, target); !dropped(err) {
		t.Errorf("Install before the link existed: dialing %s from A: got %v, want a timeout", target, err)
	}
	if !installed(t, b, linkB) {
		t.Errorf("Installed(%s): got false, want true", linkB)
	}
	if err := in(b, Remove, linkB); err != nil {
		t.Fatalf("Remove(%s): %v", linkB, err)
	}
	if err := dialRetry(a, target); err != nil {
		t.Errorf("after Remove: dialing %s from A: got %v, want success", target, err)
	}
}

func TestInvalidName(t *testing.T) {
	for _, name := range []string{"", "a-name-that-is-too-long"} {
		if err := Install(name); err == nil {
			t.Errorf("Install(%q): got nil error, want one", name)
		}
		if err := Remove(name); err == nil {
			t.Errorf("Remove(%q): got nil error, want one", name)
		}
		if _, err := Installed(name); err == nil {
			t.Errorf("Installed(%q): got nil error, want one", name)
		}
	}
}

func TestSupported(t *testing.T) {
	netns := newTestNS(t)
	if err := netns.Do(func(ns.NetNS) error { return Supported() }); err != nil {
		t.Fatalf("Supported: %v", err)
	}
	if got := netdevTables(t, netns); len(got) != 0 {
		t.Errorf("after Supported: got netdev tables %q, want none", got)
	}
}
