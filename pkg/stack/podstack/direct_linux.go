package podstack

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// virtioNetHdrLen is struct virtio_net_hdr, which a packet socket with
// PACKET_VNET_HDR expects before every frame (all zero: no GSO, checksum
// complete).
const virtioNetHdrLen = 10

// directWriter writes single frames to the pod's link past netstack's
// queue (relay.Leg.WriteDirect), never blocking: a full socket drops.
type directWriter struct {
	fd      int
	vnetHdr bool
	mac     net.HardwareAddr
}

func (w *directWriter) write(to tcpip.LinkAddress, proto tcpip.NetworkProtocolNumber, ip []byte) error {
	off := 0
	if w.vnetHdr {
		off = virtioNetHdrLen
	}
	frame := make([]byte, off+header.EthernetMinimumSize+len(ip))
	header.Ethernet(frame[off:]).Encode(&header.EthernetFields{
		SrcAddr: tcpip.LinkAddress(w.mac), DstAddr: to, Type: proto,
	})
	copy(frame[off+header.EthernetMinimumSize:], ip)
	if err := unix.Send(w.fd, frame, unix.MSG_DONTWAIT); err != nil {
		return fmt.Errorf("writing a frame past the queue: %w", err)
	}
	return nil
}
