package attack

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// link is what the attacks need of a link the pod sees.
type link struct {
	Name  string
	Index int
	// Kind is netlink's type of the link ("veth", "tuntap", "device" for
	// loopback, ...), Encap its link-layer type ("ether", "loopback",
	// "none").
	Kind, Encap string
	MAC         net.HardwareAddr
	Up          bool
}

// ethernet says whether frames on the link carry an Ethernet header
// (loopback's is all zeros).
func (l link) ethernet() bool { return l.Encap == "ether" || l.Encap == "loopback" }

func (l link) loopback() bool { return l.Encap == "loopback" }

// tun says whether the link is a TUN (the stack's side for the
// applications), which carries bare IP packets.
func (l link) tun() bool { return l.Kind == "tuntap" }

func (l link) String() string {
	s := fmt.Sprintf("%s (%s, %s", l.Name, l.Kind, l.Encap)
	if len(l.MAC) > 0 {
		s += " " + l.MAC.String()
	}
	if !l.Up {
		s += ", down"
	}
	return s + ")"
}

// listLinks reads the links of the calling thread's namespace. (Listing
// them is also what has the kernel give ids to the namespaces a veth's
// peer lives in, which Foreign uses.)
func listLinks() ([]link, error) {
	ls, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	var out []link
	for _, l := range ls {
		a := l.Attrs()
		out = append(out, link{Name: a.Name, Index: a.Index, Kind: l.Type(), Encap: a.EncapType,
			MAC: a.HardwareAddr, Up: a.Flags&net.FlagUp != 0})
	}
	return out, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// frame is one frame a linkSock read: its Ethernet type and network-layer
// bytes, and the link-layer source where the link has one.
type frame struct {
	etherType uint16
	srcMAC    net.HardwareAddr
	b         []byte
}

// maxFrames bounds what a linkSock keeps: the answers sought come within
// a second of a handful of packets sent.
const maxFrames = 4096

// linkSock is a packet socket on one link, sending the attacks' packets
// and keeping what the link receives for answers.
type linkSock struct {
	link link
	fd   int
	// gw is where IP packets are addressed on an Ethernet link: the
	// node's link-layer address if it answered, else broadcast.
	gw net.HardwareAddr

	mu     sync.Mutex // guards in
	in     []frame
	closed chan struct{}
	done   chan struct{}
}

// openLinkSock opens an ETH_P_ALL packet socket on l: SOCK_RAW with the
// Ethernet header where the link has one, SOCK_DGRAM (network-layer
// packets) on a TUN.
func openLinkSock(l link) (*linkSock, error) {
	typ := unix.SOCK_DGRAM
	if l.ethernet() {
		typ = unix.SOCK_RAW
	}
	fd, err := unix.Socket(unix.AF_PACKET, typ|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return nil, fmt.Errorf("opening a packet socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding a packet socket to %s: %w", l.Name, err)
	}
	tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("setting a receive timeout: %w", err)
	}
	s := &linkSock{link: l, fd: fd, closed: make(chan struct{}), done: make(chan struct{})}
	go s.read()
	return s, nil
}

func (s *linkSock) read() {
	defer close(s.done)
	buf := make([]byte, 65536)
	for {
		select {
		case <-s.closed:
			return
		default:
		}
		n, from, err := unix.Recvfrom(s.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		ll, _ := from.(*unix.SockaddrLinklayer)
		if ll == nil || ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		f := frame{etherType: htons(ll.Protocol), b: buf[:n]}
		if s.link.ethernet() {
			if n < header.EthernetMinimumSize {
				continue
			}
			eth := header.Ethernet(buf[:n])
			f.etherType = uint16(eth.Type())
			f.srcMAC = net.HardwareAddr(eth.SourceAddress())
			f.b = buf[header.EthernetMinimumSize:n]
		}
		f.b = append([]byte(nil), f.b...)
		f.srcMAC = append(net.HardwareAddr(nil), f.srcMAC...)
		s.mu.Lock()
		if len(s.in) < maxFrames {
			s.in = append(s.in, f)
		}
		s.mu.Unlock()
	}
}

// Close stops the reader and closes the socket.
func (s *linkSock) Close() {
	close(s.closed)
	<-s.done
	unix.Close(s.fd)
}

// frames is a copy of what the link received so far.
func (s *linkSock) frames() []frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]frame(nil), s.in...)
}

// send sends an IP packet: in a frame to gw where the link has Ethernet,
// as it is on a TUN.
func (s *linkSock) send(ip []byte) error {
	return s.sendTo(s.gw, EtherType(ip), ip)
}

// sendTo sends payload of the Ethernet type to dst (ignored on a link
// without link-layer addresses).
func (s *linkSock) sendTo(dst net.HardwareAddr, etherType uint16, payload []byte) error {
	if s.link.ethernet() {
		src := s.link.MAC
		if len(src) != 6 {
			src = make(net.HardwareAddr, 6)
		}
		if len(dst) != 6 {
			dst = Broadcast
		}
		_, err := unix.Write(s.fd, Frame(dst, src, etherType, payload))
		return err
	}
	return unix.Sendto(s.fd, payload, 0, &unix.SockaddrLinklayer{Protocol: htons(etherType), Ifindex: s.link.Index})
}

// resolve finds the node's link-layer address on an Ethernet link the way
// any host would, with an ARP request (or an NDP solicitation) from the
// pod's own address, and keeps it in gw; broadcast when nothing answers.
func (s *linkSock) resolve(self, node Pair) {
	s.gw = Broadcast
	if !s.link.ethernet() || s.link.loopback() {
		s.gw = make(net.HardwareAddr, 6)
		return
	}
	mac := s.link.MAC
	if node.V4.IsValid() && self.V4.IsValid() {
		s.sendTo(Broadcast, uint16(header.ARPProtocolNumber),
			ARPPacket(header.ARPRequest, mac, self.V4, make(net.HardwareAddr, 6), node.V4))
	}
	if node.V6.IsValid() && self.V6.IsValid() {
		sn := SolicitedNode(node.V6)
		s.sendTo(MulticastMAC(sn), uint16(header.IPv6ProtocolNumber), NSPacket(self.V6, sn, node.V6, mac))
	}
	for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, f := range s.frames() {
			seg, ok := Parse(f.etherType, f.b)
			if !ok || len(f.srcMAC) != 6 {
				continue
			}
			from := seg.Src.Addr()
			if (from == node.V4 && f.etherType == uint16(header.ARPProtocolNumber)) || (from == node.V6 && node.V6.IsValid()) {
				s.gw = f.srcMAC
				return
			}
		}
	}
}

// answer is the answer the link received to a packet of proto from src
// to dst, described ("UDP", "SYN-ACK", "RST"); "" if none.
func (s *linkSock) answer(proto uint8, src, dst netip.AddrPort) string {
	for _, f := range s.frames() {
		if seg, ok := Parse(f.etherType, f.b); ok && seg.IsAnswer(proto, src, dst) {
			return seg.Kind()
		}
	}
	return ""
}
