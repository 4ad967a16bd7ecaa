package podstack

import (
	"context"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/cni-usernet/cni-usernet/pkg/offload"
	"github.com/cni-usernet/cni-usernet/pkg/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/relay"
)

// fuzzStack is one whole pod stack (both legs, relay, pinger) whose wire
// link and TUN are socketpairs: a frame written to wirePeer is what the
// pod's eth0 would receive from the network.
type fuzzStack struct {
	s        *Stack
	wirePeer int
}

var (
	fuzzOnce sync.Once
	fuzzS    *fuzzStack
	fuzzErr  error
)

var (
	fuzzMAC   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
	fuzzPodIP = netip.MustParseAddr("10.250.0.2")
	fuzzGw    = netip.MustParseAddr("10.250.0.1")
)

func newFuzzStack() (*fuzzStack, error) {
	wire, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	tun, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	spec := &podnet.Spec{
		Version: podnet.SpecVersion,
		IfName:  "eth0",
		MAC:     fuzzMAC.String(),
		MTU:     1500,
		Addrs:   []netip.Prefix{netip.PrefixFrom(fuzzPodIP, 24), netip.MustParsePrefix("fd50::2/64")},
		Routes:  []podnet.Route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gw: fuzzGw}},
		Neighbors: []podnet.Neighbor{
			{IP: fuzzGw, MAC: "02:00:00:00:00:01"},
		},
	}
	s, err := Build(Options{
		Spec:   spec,
		LinkFD: wire[0],
		// The test runs in the machine's own network namespace: nothing
		// may be dialled there for the frames it makes up.
		Pod:          relay.PodSide{TUN: os.NewFile(uintptr(tun[0]), "tun"), Dialer: refusingDialer{}},
		GSO:          offload.Decision{Requested: offload.ModeOff, Mode: offload.ModeOff},
		WireQueueLen: 64,
	})
	if err != nil {
		return nil, err
	}
	// Whatever the stack sends (SYN-ACKs, RSTs, relayed datagrams) is read
	// and dropped, so its writes never block.
	for _, fd := range []int{wire[1], tun[1]} {
		go func() {
			buf := make([]byte, 1<<16)
			for {
				if _, err := unix.Read(fd, buf); err != nil && err != unix.EAGAIN && err != unix.EINTR {
					return
				}
				unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 100)
			}
		}()
	}
	return &fuzzStack{s: s, wirePeer: wire[1]}, nil
}

// frame builds an Ethernet frame to the fuzz stack carrying an IPv4
// packet; payload is the transport header and data.
func fuzzFrame(proto tcpip.TransportProtocolNumber, flags uint8, fragOff uint16, payload []byte) []byte {
	b := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize+len(payload))
	eth := header.Ethernet(b)
	eth.Encode(&header.EthernetFields{SrcAddr: "\x02\x00\x00\x00\x00\x01", DstAddr: tcpip.LinkAddress(fuzzMAC), Type: header.IPv4ProtocolNumber})
	ip := header.IPv4(b[header.EthernetMinimumSize:])
	ip.Encode(&header.IPv4Fields{
		TotalLength:    uint16(header.IPv4MinimumSize + len(payload)),
		ID:             7,
		Flags:          flags,
		FragmentOffset: fragOff,
		TTL:            64,
		Protocol:       uint8(proto),
		SrcAddr:        tcpip.AddrFrom4([4]byte{198, 18, 0, 9}),
		DstAddr:        tcpip.AddrFrom4(fuzzPodIP.As4()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	copy(b[header.EthernetMinimumSize+header.IPv4MinimumSize:], payload)
	return b
}

// fuzzProbe is an ICMP echo request to the pod, which the stack always reads.
var fuzzProbe = fuzzFrame(header.ICMPv4ProtocolNumber, 0, 0, []byte{8, 0, 0xf7, 0xfe, 0, 1, 0, 0})

// FuzzWireFrames feeds arbitrary frames to a whole pod stack through its
// wire link: every parser a frame from the network meets (Ethernet, ARP,
// IPv4/IPv6 with options and fragments, ICMP, TCP, UDP) and the relay's
// forwarders behind them. The stack must neither crash nor stop reading.
func FuzzWireFrames(f *testing.F) {
	syn := make([]byte, header.TCPMinimumSize)
	header.TCP(syn).Encode(&header.TCPFields{SrcPort: 40000, DstPort: 80, SeqNum: 1, DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagSyn, WindowSize: 65535})
	udp := make([]byte, header.UDPMinimumSize+4)
	header.UDP(udp).Encode(&header.UDPFields{SrcPort: 5353, DstPort: 20000, Length: uint16(len(udp))})
	f.Add(fuzzFrame(header.TCPProtocolNumber, 0, 0, syn))
	f.Add(fuzzFrame(header.UDPProtocolNumber, 0, 0, udp))
	f.Add(fuzzFrame(header.UDPProtocolNumber, header.IPv4FlagMoreFragments, 0, make([]byte, 64)))
	f.Add(fuzzFrame(header.UDPProtocolNumber, header.IPv4FlagMoreFragments, 32, make([]byte, 64)))
	f.Add(fuzzFrame(header.ICMPv4ProtocolNumber, 0, 0, []byte{8, 0, 0, 0, 0, 1, 0, 1}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1})
	f.Fuzz(func(t *testing.T, frame []byte) {
		fuzzOnce.Do(func() { fuzzS, fuzzErr = newFuzzStack() })
		if fuzzErr != nil {
			t.Fatalf("building the stack: %v", fuzzErr)
		}
		if len(frame) < header.EthernetMinimumSize || len(frame) > 1514 {
			return // the kernel hands the stack no such frames
		}
		before := fuzzS.s.WireStats.RxPackets.Load()
		// A well-formed frame after the fuzzed one: once the stack has
		// read it, it has read (or dropped) the fuzzed one, so a crash
		// points at this input, and a stack that stopped reading fails.
		for _, fr := range [][]byte{frame, fuzzProbe} {
			if _, err := unix.Write(fuzzS.wirePeer, fr); err != nil {
				t.Fatalf("writing a frame: %v", err)
			}
		}
		for deadline := time.Now().Add(2 * time.Second); fuzzS.s.WireStats.RxPackets.Load() == before; {
			if time.Now().After(deadline) {
				t.Fatalf("the stack read nothing within 2s after a %d-byte frame", len(frame))
			}
			time.Sleep(100 * time.Microsecond)
		}
	})
}

// refusingDialer answers every connection to the applications as if
// nothing listened, without opening a socket.
type refusingDialer struct{}

func (refusingDialer) DialTCP(context.Context, netip.AddrPort, netip.AddrPort) (*net.TCPConn, error) {
	return nil, syscall.ECONNREFUSED
}

func (refusingDialer) DialUDP(netip.AddrPort, netip.AddrPort) (*net.UDPConn, error) {
	return nil, syscall.ECONNREFUSED
}
