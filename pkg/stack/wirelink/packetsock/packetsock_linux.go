// Package packetsock opens the AF_PACKET socket through which the wire stack
// owns the pod's interface.
package packetsock

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// Options configures the socket.
type Options struct {
	// IfName is the interface to bind to. Required.
	IfName string
	// VnetHdr turns on PACKET_VNET_HDR: every frame carries a virtio-net
	// header, which lets the stack hand the kernel GSO frames (hardware
	// mode) and receive GRO'd frames with partial checksums. Zero: off.
	VnetHdr bool
	// BufferBytes sets SO_RCVBUF/SO_SNDBUF with the FORCE variants, which
	// are not capped by net.core.[rw]mem_max (212 KiB by default, too small
	// to absorb a burst at several Gbit/s). Zero: DefaultBufferBytes.
	BufferBytes int
	// SendOnly binds the socket to the interface with protocol 0: it
	// sends, and receives nothing (the kernel hooks no receive handler for
	// it). The link then has one socket read by the stack's own reader and
	// one that netstack's link endpoint writes through (see
	// podstack.Options.TXFD).
	SendOnly bool
}

// DefaultBufferBytes is runsc's figure: 4 MiB holds about 2,700 full-size
// frames, several milliseconds of traffic at 10 Gbit/s.
const DefaultBufferBytes = 4 << 20

// Open creates the socket, bound to the interface, and returns its fd.
func Open(o Options) (int, error) { return open(o, nil) }

// open is Open with prepare run on the socket before it is bound: a
// receive ring set up on a bound socket makes the kernel unhook the
// socket and wait for an RCU grace period (packet_set_ring's
// synchronize_net), a wait a stack's start should not make
// (docs/performance.md).
func open(o Options, prepare func(fd int) error) (int, error) {
	iface, err := net.InterfaceByName(o.IfName)
	if err != nil {
		return -1, fmt.Errorf("looking up %s: %w", o.IfName, err)
	}
	// Protocol 0 at creation and ETH_P_ALL at bind avoids receiving frames
	// of every interface between the two calls.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("creating AF_PACKET socket: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()
	if o.VnetHdr {
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
			return -1, fmt.Errorf("enabling PACKET_VNET_HDR on %s: %w", o.IfName, err)
		}
	}
	size := o.BufferBytes
	if size == 0 {
		size = DefaultBufferBytes
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, size)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, size); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, size)
	}
	if prepare != nil {
		if err := prepare(fd); err != nil {
			return -1, err
		}
	}
	ll := unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: iface.Index}
	if o.SendOnly {
		// The kernel parses a SOCK_RAW frame's EtherType for its protocol
		// when the socket has none.
		ll.Protocol = 0
	}
	if err := unix.Bind(fd, &ll); err != nil {
		return -1, fmt.Errorf("binding AF_PACKET socket to %s: %w", o.IfName, err)
	}
	ok = true
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Drops reads how many frames the kernel dropped at fd because its receive
// buffer was full since the last call (PACKET_STATISTICS resets on read):
// what the stack could not read in time, a flood among it.
func Drops(fd int) (uint64, error) {
	st, err := unix.GetsockoptTpacketStats(fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
	if err != nil {
		return 0, fmt.Errorf("reading packet socket statistics: %w", err)
	}
	return uint64(st.Drops), nil
}
