package hostile

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// framer builds the hostile frames: Ethernet from the node's side of the
// veth to the pod's eth0, IPv4 to the pod's address from spoofed sources.
type framer struct {
	dstMAC, srcMAC net.HardwareAddr
	dst            tcpip.Address
	// spoof is the first address of the range the sources are drawn from;
	// the node namespace blackholes it, so nothing ever answers the pod.
	spoof netip.Prefix
	// synPort is the listening port half of the SYNs go to.
	synPort uint16
	rng     *rand.Rand
	ipID    uint16
}

func (f *framer) eth(b []byte, etherType tcpip.NetworkProtocolNumber) []byte {
	copy(b[0:6], f.dstMAC)
	copy(b[6:12], f.srcMAC)
	binary.BigEndian.PutUint16(b[12:14], uint16(etherType))
	return b[header.EthernetMinimumSize:]
}

// source draws a spoofed address from the blackholed range.
func (f *framer) source() tcpip.Address {
	a := f.spoof.Addr().As4()
	host := f.rng.Uint32() & (1<<(32-f.spoof.Bits()) - 1)
	v := binary.BigEndian.Uint32(a[:]) | host
	binary.BigEndian.PutUint32(a[:], v)
	return tcpip.AddrFrom4(a)
}

// ipv4 writes an IPv4 header for payloadLen bytes and returns the payload.
func (f *framer) ipv4(b []byte, src tcpip.Address, proto tcpip.TransportProtocolNumber, id uint16, flags uint8, fragOff uint16, payloadLen int) []byte {
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{
		TotalLength:    uint16(header.IPv4MinimumSize + payloadLen),
		ID:             id,
		Flags:          flags,
		FragmentOffset: fragOff,
		TTL:            64,
		Protocol:       uint8(proto),
		SrcAddr:        src,
		DstAddr:        f.dst,
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	return b[header.IPv4MinimumSize:]
}

// syn is a TCP SYN from a spoofed address and port: half to the listening
// port (each costs the relay a dial of the application and a handshake that
// never completes), half to random ports (each a refusal).
func (f *framer) syn(b []byte) int {
	src := f.source()
	port := f.synPort
	if f.rng.IntN(2) == 0 {
		port = uint16(1 + f.rng.IntN(65535))
	}
	p := f.ipv4(f.eth(b, header.IPv4ProtocolNumber), src, header.TCPProtocolNumber, f.nextID(), 0, 0, header.TCPMinimumSize)
	tcp := header.TCP(p)
	tcp.Encode(&header.TCPFields{
		SrcPort:    uint16(1024 + f.rng.IntN(64511)),
		DstPort:    port,
		SeqNum:     f.rng.Uint32(),
		DataOffset: header.TCPMinimumSize,
		Flags:      header.TCPFlagSyn,
		WindowSize: 65535,
	})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, f.dst, header.TCPMinimumSize)
	tcp.SetChecksum(^tcp.CalculateChecksum(xsum))
	return header.EthernetMinimumSize + header.IPv4MinimumSize + header.TCPMinimumSize
}

// udp is a datagram to one of udpPorts destination ports from a spoofed
// address and port: every one may open a relay flow.
func (f *framer) udp(b []byte, udpPorts int) int {
	src := f.source()
	const payload = 32
	p := f.ipv4(f.eth(b, header.IPv4ProtocolNumber), src, header.UDPProtocolNumber, f.nextID(), 0, 0, header.UDPMinimumSize+payload)
	u := header.UDP(p)
	u.Encode(&header.UDPFields{
		SrcPort: uint16(1024 + f.rng.IntN(64511)),
		DstPort: uint16(20000 + f.rng.IntN(udpPorts)),
		Length:  header.UDPMinimumSize + payload,
	})
	for i := range payload {
		p[header.UDPMinimumSize+i] = byte(f.rng.Uint32())
	}
	xsum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, src, f.dst, header.UDPMinimumSize+payload)
	xsum = payloadChecksum(p[header.UDPMinimumSize:header.UDPMinimumSize+payload], xsum)
	u.SetChecksum(^u.CalculateChecksum(xsum))
	return header.EthernetMinimumSize + header.IPv4MinimumSize + header.UDPMinimumSize + payload
}

// fragment is an IPv4 fragment that never completes a datagram: a first
// fragment with more to come, or a second fragment overlapping the first
// one of the previous call.
func (f *framer) fragment(b []byte, overlap bool, lastID uint16) (int, uint16) {
	src := tcpip.AddrFrom4([4]byte{198, 18, 0, 1})
	const payload = 256
	id, off := f.nextID(), uint16(0)
	if overlap {
		id, off = lastID, 128 // the first fragment covered 0..255
	}
	p := f.ipv4(f.eth(b, header.IPv4ProtocolNumber), src, header.UDPProtocolNumber, id, header.IPv4FlagMoreFragments, off, payload)
	for i := range payload {
		p[i] = byte(f.rng.Uint32())
	}
	return header.EthernetMinimumSize + header.IPv4MinimumSize + payload, id
}

// garbage is a frame of random bytes: random length; half addressed to the
// pod with an EtherType the stack parses (IPv4, IPv6, ARP), half entirely
// random.
func (f *framer) garbage(b []byte) int {
	n := header.EthernetMinimumSize + f.rng.IntN(1500-header.EthernetMinimumSize)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:i+8], f.rng.Uint64())
	}
	if f.rng.IntN(2) == 0 {
		types := []tcpip.NetworkProtocolNumber{header.IPv4ProtocolNumber, header.IPv6ProtocolNumber, header.ARPProtocolNumber}
		f.eth(b, types[f.rng.IntN(len(types))])
	}
	return n
}

func (f *framer) nextID() uint16 {
	f.ipID++
	return f.ipID
}

func payloadChecksum(b []byte, initial uint16) uint16 {
	return checksum.Checksum(b, initial)
}

// floodCounts is what a flood sent.
type floodCounts struct {
	SYN, UDP, Fragments, Garbage int
	UDPPorts                     int
	Duration                     time.Duration
}

func (c floodCounts) total() int { return c.SYN + c.UDP + c.Fragments + c.Garbage }

// floodOptions says how much to send and how fast.
type floodOptions struct {
	PerKind  int // frames of each kind
	UDPPorts int // distinct UDP destination ports
	Rate     int // frames per second, all kinds together
}

// flood writes PerKind frames of each kind, interleaved, on fd (an
// AF_PACKET socket bound to the node's side of the pod's veth), paced at
// Rate so that the veth's backlog queue (net.core.netdev_max_backlog)
// does not drop them before the stack sees them.
func flood(fd int, f *framer, o floodOptions, stop <-chan struct{}) (floodCounts, error) {
	c := floodCounts{UDPPorts: o.UDPPorts}
	buf := make([]byte, 1600)
	start := time.Now()
	var lastFragID uint16
	sent := 0
	for i := 0; i < 4*o.PerKind; i++ {
		var n int
		switch i % 4 {
		case 0:
			n = f.syn(buf)
			c.SYN++
		case 1:
			n = f.udp(buf, o.UDPPorts)
			c.UDP++
		case 2:
			overlap := c.Fragments%2 == 1
			n, lastFragID = f.fragment(buf, overlap, lastFragID)
			c.Fragments++
		case 3:
			n = f.garbage(buf)
			c.Garbage++
		}
		for {
			_, err := unix.Write(fd, buf[:n])
			if err == nil {
				break
			}
			if err == unix.ENOBUFS || err == unix.EAGAIN || err == unix.EINTR {
				time.Sleep(time.Millisecond)
				continue
			}
			return c, fmt.Errorf("writing frame %d: %w", i, err)
		}
		sent++
		// Pace: never more than Rate × elapsed frames.
		for sent > int(time.Since(start).Seconds()*float64(o.Rate)) {
			select {
			case <-stop:
				c.Duration = time.Since(start)
				return c, fmt.Errorf("flood stopped after %d frames", sent)
			default:
			}
			time.Sleep(500 * time.Microsecond)
		}
	}
	c.Duration = time.Since(start)
	return c, nil
}

// openPacketSocket opens an AF_PACKET socket for sending on ifindex. The
// caller must be in the namespace of the interface.
func openPacketSocket(ifindex int) (int, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("creating AF_PACKET socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("binding AF_PACKET socket to interface %d: %w", ifindex, err)
	}
	return fd, nil
}
