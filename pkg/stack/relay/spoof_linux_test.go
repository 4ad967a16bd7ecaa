package relay

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/node/podkernel"
	"github.com/cni-usernet/cni-usernet/pkg/stack/podsock"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// podRig is a relay between a pod's kernel as the stack sets it up (a
// namespace of the test's with the TUN, the listeners on loopback and the
// divert rules) and a wire leg whose link is a channel the test reads:
// whatever the relay sends towards the network is in wire.
type podRig struct {
	ns   ns.NetNS
	r    *Relay
	link *channel.Endpoint
	// pod is the pod's address per family; prefix its length on the TUN
	// and the wire leg.
	pod    map[int]netip.Addr
	prefix map[int]int

	mu   sync.Mutex // guards wire
	wire [][]byte   // the IP packets the wire leg sent, in order
}

const rigTUN = "usernet0"

func newPodRig(t *testing.T) *podRig {
	t.Helper()
	nettest.RequireRoot(t)
	rig := &podRig{
		ns:     nettest.NewNS(t),
		pod:    map[int]netip.Addr{4: netip.MustParseAddr("10.0.0.2"), 6: netip.MustParseAddr("fd00::2")},
		prefix: map[int]int{4: 24, 6: 64},
	}
	// The spec as the stack collects it: the pod's addresses and the
	// interface's link-local one, which the TUN does not get.
	spec := &podnet.Spec{
		Addrs: []netip.Prefix{netip.PrefixFrom(rig.pod[4], 24), netip.PrefixFrom(rig.pod[6], 64), netip.MustParsePrefix("fe80::2/64")},
		Routes: []podnet.Route{
			{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gw: netip.MustParseAddr("10.0.0.1")},
			{Dst: netip.MustParsePrefix("::/0"), Gw: netip.MustParseAddr("fd00::1")},
		},
	}
	pod := PodSide{}
	err := nettest.In(rig.ns, func() error {
		tun, err := podkernel.OpenTUN(rigTUN)
		if err != nil {
			return err
		}
		pod.TUN = tun
		if err := podkernel.ConfigureTUN(rigTUN, 1500, spec); err != nil {
			return err
		}
		d := podkernel.Divert{TUN: rigTUN}
		for _, lo := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()} {
			tl, err := podsock.ListenTCP(netip.AddrPortFrom(lo, 0), 128)
			if err != nil {
				return err
			}
			pod.TCPListeners = append(pod.TCPListeners, tl)
			ul, err := podsock.ListenUDP(netip.AddrPortFrom(lo, 0))
			if err != nil {
				return err
			}
			pod.UDPListeners = append(pod.UDPListeners, ul)
			tcpAt, udpAt := tl.Addr().(*net.TCPAddr).AddrPort(), ul.LocalAddr().(*net.UDPAddr).AddrPort()
			if lo.Is4() {
				d.TCP4, d.UDP4 = tcpAt, udpAt
			} else {
				d.TCP6, d.UDP6 = tcpAt, udpAt
			}
		}
		return podkernel.InstallDivert(d)
	})
	if err != nil {
		pod.Close()
		t.Fatalf("setting the pod's kernel up: %v", err)
	}

	s := tcpipstack.New(tcpipstack.Options{
		NetworkProtocols:   []tcpipstack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []tcpipstack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
	})
	t.Cleanup(func() { s.Close(); s.Wait() })
	rig.link = channel.New(256, 1500, "")
	t.Cleanup(rig.link.Close)
	if err := s.CreateNIC(1, rig.link); err != nil {
		t.Fatal(err)
	}
	for _, p := range spec.Addrs {
		proto := ipv4.ProtocolNumber
		if p.Addr().Is6() {
			proto = ipv6.ProtocolNumber
		}
		pa := tcpip.ProtocolAddress{Protocol: proto, AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpipAddr(p.Addr()), PrefixLen: p.Bits()}}
		if err := s.AddProtocolAddress(1, pa, tcpipstack.AddressProperties{}); err != nil {
			t.Fatal(err)
		}
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: 1}, {Destination: header.IPv6EmptySubnet, NIC: 1}})

	var addrs []netip.Addr
	for _, p := range spec.PodIPs() {
		addrs = append(addrs, p.Addr())
	}
	r, err := New(Leg{Stack: s, NIC: 1, MTU: 1500}, pod, Options{PodAddrs: addrs, OutboundDialTimeout: 5 * time.Second})
	if err != nil {
		pod.Close()
		t.Fatal(err)
	}
	rig.r = r
	t.Cleanup(r.Close)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			pkt := rig.link.ReadContext(ctx)
			if pkt == nil {
				return
			}
			b := pkt.ToView().AsSlice()
			pkt.DecRef()
			rig.mu.Lock()
			rig.wire = append(rig.wire, b)
			rig.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return rig
}

// sentFrom reports whether the wire leg sent a packet from src of IP
// protocol proto, and the first one's bytes.
func (rig *podRig) sentFrom(src netip.Addr, proto uint8) ([]byte, bool) {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	for _, p := range rig.wire {
		s, _, ok := ipAddrs(p)
		if ok && s == src && l4Proto(p) == proto {
			return p, true
		}
	}
	return nil, false
}

// sources lists the sources of everything the wire leg sent.
func (rig *podRig) sources() []netip.Addr {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	var out []netip.Addr
	for _, p := range rig.wire {
		if s, _, ok := ipAddrs(p); ok {
			out = append(out, s)
		}
	}
	return out
}

func l4Proto(p []byte) uint8 {
	if p[0]>>4 == 4 {
		return p[9]
	}
	return p[6]
}

// sendRaw writes IP packets from the pod's namespace with a raw socket
// that takes the IP header as given (IP_HDRINCL), as a process that is
// root in its pod can: the kernel routes each by its destination, into
// the TUN, whatever its source.
func (rig *podRig) sendRaw(t *testing.T, pkts ...[]byte) {
	t.Helper()
	err := nettest.In(rig.ns, func() error {
		for _, p := range pkts {
			_, dst, _ := ipAddrs(p)
			fam, level, opt := unix.AF_INET6, unix.IPPROTO_IPV6, unix.IPV6_HDRINCL
			var to unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.As16()}
			if dst.Is4() {
				fam, level, opt = unix.AF_INET, unix.IPPROTO_IP, unix.IP_HDRINCL
				to = &unix.SockaddrInet4{Addr: dst.As4()}
			}
			fd, err := unix.Socket(fam, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
			if err != nil {
				return err
			}
			err = unix.SetsockoptInt(fd, level, opt, 1)
			if err == nil && fam == unix.AF_INET {
				// The limited broadcast is refused without it.
				err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_BROADCAST, 1)
			}
			if err == nil {
				err = unix.Sendto(fd, p, 0, to)
			}
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("sending %d bytes to %s: %w", len(p), dst, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// wholeSYN is a TCP SYN from src:sport to dst:dport, lengths and
// checksums filled in.
func wholeSYN(src, dst netip.Addr, sport, dport uint16) []byte {
	p, t := newIPPacket(src, dst, protoTCP, header.TCPMinimumSize)
	header.TCP(t).Encode(&header.TCPFields{SrcPort: sport, DstPort: dport, SeqNum: 1, DataOffset: header.TCPMinimumSize,
		Flags: header.TCPFlagSyn, WindowSize: 65535})
	binary.BigEndian.PutUint16(t[16:18], transportChecksum(src, dst, protoTCP, t))
	return p
}

// sendUDPFrom sends one datagram from the pod's namespace, from a socket
// bound to from: a transparent one (IP_TRANSPARENT, which needs
// CAP_NET_RAW in the pod) when from is not the pod's.
func (rig *podRig) sendUDPFrom(t *testing.T, from, to netip.AddrPort) {
	t.Helper()
	err := nettest.In(rig.ns, func() error {
		fam := unix.AF_INET6
		var sa, da unix.Sockaddr = &unix.SockaddrInet6{Addr: from.Addr().As16(), Port: int(from.Port())}, &unix.SockaddrInet6{Addr: to.Addr().As16(), Port: int(to.Port())}
		if to.Addr().Is4() {
			fam = unix.AF_INET
			sa, da = &unix.SockaddrInet4{Addr: from.Addr().As4(), Port: int(from.Port())}, &unix.SockaddrInet4{Addr: to.Addr().As4(), Port: int(to.Port())}
		}
		fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if fam == unix.AF_INET {
			err = unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_TRANSPARENT, 1)
		} else {
			err = unix.SetsockoptInt(fd, unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
		}
		if err != nil {
			return fmt.Errorf("making the socket transparent: %w", err)
		}
		if err := unix.Bind(fd, sa); err != nil {
			return fmt.Errorf("binding %s: %w", from, err)
		}
		return unix.Sendto(fd, []byte("spoof?"), 0, da)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// dialFromPod starts a TCP connection from the pod's own address (its
// SYN reaches the relay through the TUN) and leaves it to time out.
func (rig *podRig) dialFromPod(t *testing.T, to netip.AddrPort) {
	t.Helper()
	err := nettest.In(rig.ns, func() error {
		d := net.Dialer{Timeout: 50 * time.Millisecond}
		c, err := d.Dial("tcp", to.String())
		if err == nil {
			c.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (rig *podRig) waitSpoofed(t *testing.T, want int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); rig.r.stats.PodSpoofed.Load() < want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("PodSpoofed: got %d, want %d", rig.r.stats.PodSpoofed.Load(), want)
		}
	}
}

func (rig *podRig) waitSent(t *testing.T, what string, src netip.Addr, proto uint8) []byte {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if p, ok := rig.sentFrom(src, proto); ok {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: nothing from %s reached the wire (sent: %v)", what, src, rig.sources())
		}
	}
}

// spoofedSources are what a root process in the pod could write as its
// source: another pod, the node, the subnet's and the limited broadcast,
// the pod interface's link-local address (the wire leg holds it), another
// link-local one.
var spoofedSources = map[int][]netip.Addr{
	4: {netip.MustParseAddr("10.0.0.77"), netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.255"), netip.MustParseAddr("255.255.255.255")},
	6: {netip.MustParseAddr("fd00::77"), netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fe80::2"), netip.MustParseAddr("fe80::77")},
}

var remotes = map[int]netip.Addr{4: netip.MustParseAddr("10.1.0.9"), 6: netip.MustParseAddr("fd01::9")}

// checkNoSpoofedLeft fails if anything left the wire leg from an address
// that is not the pod's, after a grace for dials in progress.
func (rig *podRig) checkNoSpoofedLeft(t *testing.T) {
	t.Helper()
	time.Sleep(300 * time.Millisecond)
	for _, src := range rig.sources() {
		if src != rig.pod[4] && src != rig.pod[6] {
			t.Errorf("the wire leg sent a packet from %s", src)
		}
	}
}

// TestSpoofedSYNsDropped: SYNs the applications' leg hands the relay
// through the TUN from an address that is not the pod's are dropped and
// counted, and nothing is dialled for them; a connection from the pod's
// own address is dialled from it.
func TestSpoofedSYNsDropped(t *testing.T) {
	rig := newPodRig(t)
	var n int64
	for fam, srcs := range spoofedSources {
		for i, src := range srcs {
			rig.sendRaw(t, wholeSYN(src, remotes[fam], uint16(41000+i), 80))
			n++
		}
	}
	rig.waitSpoofed(t, n)
	for _, fam := range []int{4, 6} {
		rig.dialFromPod(t, netip.AddrPortFrom(remotes[fam], 80))
		p := rig.waitSent(t, fmt.Sprintf("IPv%d connection from the pod", fam), rig.pod[fam], protoTCP)
		ipLen, _, dst, _ := tcpHeaderAt(p)
		if h := header.TCP(p[ipLen:]); dst != remotes[fam] || h.DestinationPort() != 80 || h.Flags() != header.TCPFlagSyn {
			t.Errorf("IPv%d: the wire leg sent %s to %s:%d, want a SYN to %s:80", fam, h.Flags(), dst, h.DestinationPort(), remotes[fam])
		}
	}
	rig.checkNoSpoofedLeft(t)
	if got := rig.r.stats.PodSpoofed.Load(); got != n {
		t.Errorf("PodSpoofed: got %d, want %d", got, n)
	}
	if got := rig.r.Stats().Snapshot().PodSpoofed; got != n {
		t.Errorf("the snapshot's podSpoofed: got %d, want %d", got, n)
	}
}

// TestSpoofedEchoRequestsDropped: echo requests from addresses that are
// not the pod's are dropped and counted, not relayed; the pod's own are.
func TestSpoofedEchoRequestsDropped(t *testing.T) {
	rig := newPodRig(t)
	var n int64
	for fam, srcs := range spoofedSources {
		for i, src := range srcs {
			rig.sendRaw(t, request(src, remotes[fam], 7, uint16(i), []byte("spoofed")))
			n++
		}
	}
	rig.waitSpoofed(t, n)
	for _, fam := range []int{4, 6} {
		rig.sendRaw(t, request(rig.pod[fam], remotes[fam], 7, 100, []byte("legit")))
		proto := uint8(protoICMPv4)
		if fam == 6 {
			proto = protoICMPv6
		}
		rig.waitSent(t, fmt.Sprintf("IPv%d echo request from the pod", fam), rig.pod[fam], proto)
	}
	rig.checkNoSpoofedLeft(t)
	if got := rig.r.stats.PodSpoofed.Load(); got != n {
		t.Errorf("PodSpoofed: got %d, want %d", got, n)
	}
}

// TestSpoofedDatagramsDropped: datagrams from a transparent socket bound
// to an address that is not the pod's reach the relay's UDP listeners
// through the divert rules; they are dropped and counted, and no flow is
// opened. The pod's own datagrams open one.
func TestSpoofedDatagramsDropped(t *testing.T) {
	rig := newPodRig(t)
	var n int64
	for fam, srcs := range spoofedSources {
		for i, src := range srcs {
			if src.IsLinkLocalUnicast() || src.Is4() && src.As4()[3] == 255 {
				// No socket sends from them to a global destination: a
				// socket bound to a broadcast address sends from the
				// route's source, the pod's.
				continue
			}
			rig.sendUDPFrom(t, netip.AddrPortFrom(src, uint16(42000+i)), netip.AddrPortFrom(remotes[fam], 53))
			n++
		}
	}
	rig.waitSpoofed(t, n)
	for _, fam := range []int{4, 6} {
		rig.sendUDPFrom(t, netip.AddrPortFrom(rig.pod[fam], 43000), netip.AddrPortFrom(remotes[fam], 53))
		rig.waitSent(t, fmt.Sprintf("IPv%d datagram from the pod", fam), rig.pod[fam], protoUDP)
	}
	rig.checkNoSpoofedLeft(t)
	if got := rig.r.stats.PodSpoofed.Load(); got != n {
		t.Errorf("PodSpoofed: got %d, want %d", got, n)
	}
	if got := rig.r.stats.UDPTotal.Load(); got != 2 {
		t.Errorf("UDP flows opened: got %d, want 2 (the pod's own)", got)
	}
}
