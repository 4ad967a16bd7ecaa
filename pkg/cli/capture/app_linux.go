package capture

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/pcap"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The app leg is the pod's own kernel (loopback between the stack's
// sockets and the applications, and the TUN). The capture command, root
// on the node, opens packet sockets there itself: the stack's seccomp
// sandbox refuses packet sockets, and has no business seeing the pod's
// kernel anyway. A packet socket stays in the namespace it was made in, so
// the command enters the pod's namespace only to open them.

// Device is an app leg device to capture on.
type Device struct {
	// Name is the device in the pod ("lo", "usernet0").
	Name string
	// Filter, when set, is attached to the socket (LoopbackFilter).
	Filter []bpf.RawInstruction
}

// packetSocket is an open SOCK_DGRAM packet socket on one device.
type packetSocket struct {
	fd      int
	ifIndex int
	// Kernel counters, summed: PACKET_STATISTICS resets on read.
	seen, dropped uint64
}

// socketReadTimeout is how long a read blocks before the reader checks
// whether the capture is over (closing a socket does not wake a blocked
// recvmsg).
const socketReadTimeout = 200 * time.Millisecond

// socketBufferBytes is the kernel's queue for a reader that is behind;
// beyond it the kernel drops and counts (PACKET_STATISTICS), and the
// pod's traffic goes on.
const socketBufferBytes = 4 << 20

// openInNetns opens a socket per device in the network namespace at
// netnsPath and looks up the indexes of names there.
func openInNetns(netnsPath string, devs []Device, names []string) ([]*packetSocket, map[string]int, error) {
	netns, err := ns.GetNS(netnsPath)
	if err != nil {
		return nil, nil, fmt.Errorf("opening the pod's network namespace %s: %w", netnsPath, err)
	}
	defer netns.Close()
	var socks []*packetSocket
	idx := map[string]int{}
	err = netns.Do(func(ns.NetNS) error {
		for _, n := range names {
			ifc, err := net.InterfaceByName(n)
			if err != nil {
				return fmt.Errorf("looking up %s in the pod: %w", n, err)
			}
			idx[n] = ifc.Index
		}
		for _, d := range devs {
			s, err := openPacketSocket(d)
			if err != nil {
				return err
			}
			socks = append(socks, s)
		}
		return nil
	})
	if err != nil {
		for _, s := range socks {
			unix.Close(s.fd)
		}
		return nil, nil, err
	}
	return socks, idx, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func openPacketSocket(d Device) (*packetSocket, error) {
	ifc, err := net.InterfaceByName(d.Name)
	if err != nil {
		return nil, fmt.Errorf("looking up %s in the pod: %w", d.Name, err)
	}
	// Protocol 0 receives nothing until bound: the filter is in place
	// before the first packet, which then comes from this device only.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening a packet socket for %s: %w", d.Name, err)
	}
	s := &packetSocket{fd: fd, ifIndex: ifc.Index}
	fail := func(what string, err error) (*packetSocket, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("%s on the packet socket for %s: %w", what, d.Name, err)
	}
	if len(d.Filter) > 0 {
		filter := make([]unix.SockFilter, len(d.Filter))
		for i, in := range d.Filter {
			filter[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
		}
		prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog); err != nil {
			return fail("attaching the filter", err)
		}
		runtime.KeepAlive(filter)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBufferBytes); err != nil {
		return fail("sizing the receive buffer", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		return fail("asking for timestamps", err)
	}
	tv := unix.NsecToTimeval(socketReadTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fail("setting the read timeout", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index}); err != nil {
		return fail("binding", err)
	}
	return s, nil
}

var errReadTimeout = errors.New("read timed out")

// read receives one packet as an SLL2 frame (the kernel gives a
// SOCK_DGRAM socket exactly the cooked header's fields).
func (s *packetSocket) read(buf, oob []byte, snapLen int) (pcap.Packet, error) {
	n, oobn, _, from, err := unix.Recvmsg(s.fd, buf, oob, unix.MSG_TRUNC)
	if err != nil {
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return pcap.Packet{}, errReadTimeout
		}
		return pcap.Packet{}, fmt.Errorf("reading the packet socket: %w", err)
	}
	ll, ok := from.(*unix.SockaddrLinklayer)
	if !ok {
		return pcap.Packet{}, fmt.Errorf("packet socket returned a %T address", from)
	}
	kept := min(n, len(buf), snapLen-pcap.SLL2HeaderLen)
	frame := make([]byte, pcap.SLL2HeaderLen+kept)
	pcap.SLL2(frame, htons(ll.Protocol), uint32(ll.Ifindex), ll.Hatype, ll.Pkttype, ll.Addr[:min(int(ll.Halen), 8)])
	copy(frame[pcap.SLL2HeaderLen:], buf[:kept])
	p := pcap.Packet{Time: time.Now(), Frame: frame, OrigLen: pcap.SLL2HeaderLen + n}
	if ts, ok := timestamp(oob[:oobn]); ok {
		p.Time = ts
	}
	return p, nil
}

// stats adds the kernel's counters since the last call.
func (s *packetSocket) stats() {
	st, err := unix.GetsockoptTpacketStats(s.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
	if err != nil {
		return
	}
	// tp_packets counts the dropped ones too.
	s.seen += uint64(st.Packets)
	s.dropped += uint64(st.Drops)
}

func (s *packetSocket) close() { unix.Close(s.fd) }
