package podstack

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/stack/relay"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirelink/packetsock"
)

// fuzzStack is one whole pod stack (the wire leg, the relay, the pinger) whose wire
// link and TUN are socketpairs: a frame written to wirePeer is what the
// pod's eth0 would receive from the network (read by the stack's
// linkReader, as in the stack process); what the stack sends arrives at
// sentPeer.
type fuzzStack struct {
	s        *Stack
	wirePeer int
	sentPeer int
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
	sent, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
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
		Spec: spec,
		Link: &packetsock.Link{FD: wire[0], TX: sent[0]},
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
	// and dropped, so its writes never block; the replies to the probes
	// are noted.
	for _, fd := range []int{sent[1], tun[1]} {
		go func() {
			buf := make([]byte, 1<<16)
			for {
				n, err := unix.Read(fd, buf)
				if err != nil && err != unix.EAGAIN && err != unix.EINTR {
					return
				}
				if n > 0 && fd == sent[1] {
					if seq, ok := probeReply(buf[:n]); ok {
						fuzzReplied.Store(uint32(seq))
					}
				}
				unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 100)
			}
		}()
	}
	return &fuzzStack{s: s, wirePeer: wire[1], sentPeer: sent[1]}, nil
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

// The probe is an ICMP echo request to the pod, which netstack answers
// itself; its identifier and data (probeData) are what no fuzzed frame
// carries by chance, its sequence number counts the inputs.
const probeID = 0xc0de

var (
	probeData   = []byte("cni-usernet fuzz probe")
	fuzzSeq     uint16
	fuzzReplied atomic.Uint32 // sequence number of the last probe answered
)

func fuzzProbe(seq uint16) []byte {
	icmp := make([]byte, header.ICMPv4MinimumSize+len(probeData))
	h := header.ICMPv4(icmp)
	h.SetType(header.ICMPv4Echo)
	h.SetIdent(probeID)
	h.SetSequence(seq)
	copy(h.Payload(), probeData)
	h.SetChecksum(^checksum.Checksum(icmp, 0))
	return fuzzFrame(header.ICMPv4ProtocolNumber, 0, 0, icmp)
}

// probeReply returns the sequence number of frame when it is netstack's
// echo reply to a probe.
func probeReply(frame []byte) (uint16, bool) {
	if len(frame) < header.EthernetMinimumSize+header.IPv4MinimumSize+header.ICMPv4MinimumSize ||
		header.Ethernet(frame).Type() != header.IPv4ProtocolNumber {
		return 0, false
	}
	ip := header.IPv4(frame[header.EthernetMinimumSize:])
	if !ip.IsValid(len(ip)) || ip.TransportProtocol() != header.ICMPv4ProtocolNumber {
		return 0, false
	}
	h := header.ICMPv4(ip.Payload())
	if len(h) < header.ICMPv4MinimumSize || h.Type() != header.ICMPv4EchoReply || h.Ident() != probeID || !bytes.Equal(h.Payload(), probeData) {
		return 0, false
	}
	return h.Sequence(), true
}

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
		// A probe after the fuzzed frame: netstack handles a link's frames
		// in order, so once it has answered the probe it has handled (or
		// dropped) the fuzzed frame, a crash points at this input, and a
		// stack that stopped reading or processing fails here.
		fuzzSeq++
		seq := fuzzSeq
		for _, fr := range [][]byte{frame, fuzzProbe(seq)} {
			if _, err := unix.Write(fuzzS.wirePeer, fr); err != nil {
				t.Fatalf("writing a frame: %v", err)
			}
		}
		for deadline := time.Now().Add(2 * time.Second); uint16(fuzzReplied.Load()) != seq; {
			if time.Now().After(deadline) {
				t.Fatalf("no echo reply to probe %d within 2s after a %d-byte frame", seq, len(frame))
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
