package podstack

// The wire leg's netstack: its protocols, TCP as every pod's stack runs
// it, and the addresses, routes and neighbours taken over from the kernel.

import (
	"cmp"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// newStack creates the wire leg's netstack, bufMax being the largest TCP
// buffer.
func newStack(bufMax int) (*tcpipstack.Stack, error) {
	netProtos := []tcpipstack.NetworkProtocolFactory{
		ipv4.NewProtocol,
		ipv6.NewProtocolWithOptions(ipv6.Options{
			// The kernel did duplicate address detection before the
			// addresses were handed over.
			DADConfigs: tcpipstack.DADConfigurations{DupAddrDetectTransmits: 0},
			// Addresses and routes come from the spec only. netstack's
			// defaults would let any frame on the link that looks like a
			// router advertisement add routers, prefixes and SLAAC
			// addresses (zero values: all off).
			NDPConfigs: ipv6.NDPConfigurations{HandleRAs: ipv6.HandlingRAsDisabled},
		}),
		arp.NewProtocol,
	}
	s := tcpipstack.New(tcpipstack.Options{
		NetworkProtocols:   netProtos,
		TransportProtocols: []tcpipstack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
	})
	if err := setTCPOptions(s, bufMax); err != nil {
		s.Destroy()
		return nil, err
	}
	return s, nil
}

// delayedACK is how long the stack holds the acknowledgement of a request
// for the answer to carry it (hack/gvisor/patches/0001): a request and its
// answer then cost one frame each way instead of two from the stack. Two
// full-sized segments, out-of-order data, FINs and loss recovery are still
// acknowledged at once. The kernel delays an ACK at least 40 ms; a peer
// that waits for one (Nagle) waits no longer here than with a kernel pod.
const delayedACK = 2 * time.Millisecond

// setTCPOptions configures the stack's TCP as every pod's stack runs it.
func setTCPOptions(s *tcpipstack.Stack, bufMax int) error {
	opts := []tcpip.SettableTransportProtocolOption{
		ptr(tcpip.TCPDelayedACKOption(delayedACK)),
		ptr(tcpip.TCPSACKEnabled(true)),
		// Loss recovery by SACK and the retransmission timer, without
		// RACK (netstack's default once SACK is on). netstack's RACK marks
		// segments lost but its pipe (sender.SetPipe) still counts them in
		// flight: after a window's tail is lost with nothing above it for
		// the peer to SACK, every ACK of a retransmission re-entered
		// recovery with the whole tail "in flight", and the connection
		// sent one segment per RTO. Without RACK, software mode's pod→node
		// gains and the other rows stay level (docs/architecture.md,
		// "Queues", holds the interleaved run). Tailscale turned RACK off
		// in its netstack too.
		ptr(tcpip.TCPRecovery(0)),
		ptr(tcpip.TCPModerateReceiveBufferOption(true)),
		// A new connection's receive window starts at the largest buffer
		// instead of growing to it (memory is only taken as data queues,
		// and the bound already counts the largest). Against a 1 MiB
		// start, bulk both ways and redis gain, beyond the runs' spread
		// (docs/performance.md).
		&tcpip.TCPReceiveBufferSizeRangeOption{Min: 4096, Default: bufMax, Max: bufMax},
		&tcpip.TCPSendBufferSizeRangeOption{Min: 4096, Default: 1 << 20, Max: bufMax},
	}
	for _, opt := range opts {
		if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, opt); err != nil {
			return fmt.Errorf("setting TCP option %T: %s", opt, err)
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

func protoOf(a tcpip.Address) tcpip.NetworkProtocolNumber {
	if a.Len() == 16 {
		return ipv6.ProtocolNumber
	}
	return ipv4.ProtocolNumber
}

// configureWire installs the addresses, routes and neighbours the kernel had.
func configureWire(ns *tcpipstack.Stack, spec *podnet.Spec) error {
	hasV6 := false
	for _, p := range spec.Addrs {
		addr := tcpip.AddrFromSlice(p.Addr().AsSlice())
		pa := tcpip.ProtocolAddress{Protocol: protoOf(addr), AddressWithPrefix: tcpip.AddressWithPrefix{Address: addr, PrefixLen: p.Bits()}}
		if err := ns.AddProtocolAddress(wireNIC, pa, tcpipstack.AddressProperties{}); err != nil {
			return fmt.Errorf("adding address %s: %s", p, err)
		}
		hasV6 = hasV6 || p.Addr().Is6()
	}
	routes := slices.Clone(spec.Routes)
	if hasV6 {
		routes = append(routes, podnet.Route{Dst: mustPrefix("fe80::/64")})
	}
	// netstack takes the first matching route in table order: most specific
	// first, like a kernel's longest-prefix match.
	slices.SortStableFunc(routes, func(a, b podnet.Route) int { return cmp.Compare(b.Dst.Bits(), a.Dst.Bits()) })
	var table []tcpip.Route
	for _, r := range routes {
		sub, err := tcpip.NewSubnet(tcpip.AddrFromSlice(r.Dst.Addr().AsSlice()), tcpip.MaskFromBytes(net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())))
		if err != nil {
			return fmt.Errorf("route %s: %w", r.Dst, err)
		}
		tr := tcpip.Route{Destination: sub, NIC: wireNIC}
		if r.Gw.IsValid() {
			tr.Gateway = tcpip.AddrFromSlice(r.Gw.AsSlice())
		}
		table = append(table, tr)
	}
	ns.SetRouteTable(table)
	for _, n := range spec.Neighbors {
		mac, err := net.ParseMAC(n.MAC)
		if err != nil {
			return fmt.Errorf("neighbour %s: %w", n.IP, err)
		}
		addr := tcpip.AddrFromSlice(n.IP.AsSlice())
		if err := ns.AddStaticNeighbor(wireNIC, protoOf(addr), addr, tcpip.LinkAddress(mac)); err != nil {
			return fmt.Errorf("adding neighbour %s: %s", n.IP, err)
		}
	}
	return nil
}
