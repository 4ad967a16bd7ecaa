package wirelink

// The send path: netstack's NIC hands a batch to the wire queue
// (wirequeue), which hands it to the gate (counted here), the capture tap
// and fdbased, which writes it to the send socket; and the single frames
// the relay writes past the queue (DirectWriter).

import (
	"fmt"
	"net"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirelink/packetsock"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// WritePackets counts before handing the batch on.
func (g *gate) WritePackets(pkts tcpipstack.PacketBufferList) (int, tcpip.Error) {
	// Summed first: one atomic add per batch, not per packet.
	var bytes, batches uint64
	for _, pkt := range pkts.AsSlice() {
		bytes += uint64(pkt.Size())
		if pkt.GSOOptions.Type != tcpipstack.GSONone && pkt.Data().Size() > int(pkt.GSOOptions.MSS) {
			batches++
		}
	}
	g.stats.TxBytes.Add(bytes)
	if batches > 0 {
		g.stats.TxGSOBatches.Add(batches)
	}
	n, err := g.Endpoint.WritePackets(pkts)
	g.stats.TxPackets.Add(uint64(n))
	if err != nil {
		g.stats.TxErrors.Add(1)
	}
	return n, err
}

// softwareGSOMaxSize is the largest packet software GSO takes from TCP:
// the IP length field's limit. The kernel splits it before the device, so
// the link's own limits do not apply.
const softwareGSOMaxSize = 65535

// sendFD is the socket frames are sent on.
func sendFD(s *packetsock.Link) int {
	if s.TX > 0 {
		return s.TX
	}
	return s.FD
}

// NewEndpoint creates netstack's link endpoint on the link's sockets
// (fdbased): it sends, and reads the link's socket unless the link has a
// send socket, whose link's socket Link.Start's reader reads.
func NewEndpoint(o *Options) (tcpipstack.LinkEndpoint, error) {
	ep, err := fdbased.New(o.fdbasedOptions())
	if err != nil {
		return nil, fmt.Errorf("creating the link endpoint: %w", err)
	}
	return ep, nil
}

// fdbasedOptions configures netstack's link endpoint: it sends, and reads
// the link's socket unless the stack has a send socket and reads it
// itself (linkReader).
func (o *Options) fdbasedOptions() *fdbased.Options {
	fo := fdbased.Options{
		FDs:                []int{sendFD(o.Sockets)},
		MTU:                o.MTU,
		EthernetHeader:     true,
		Address:            tcpip.LinkAddress(o.MAC),
		PacketDispatchMode: fdbased.RecvMMsg,
		RXChecksumOffload:  !o.VerifyRXChecksums,
		GRO:                o.GRO,
		// One processor: fdbased then delivers each received batch in the
		// reading goroutine. With more, it hands packets to per-processor
		// queues that have no bound: a flood the stack cannot keep up with
		// piles up there, in the stack's RSS and ahead of an established
		// connection's segments (docs/reliability/hostile.md, "What was
		// unbounded, and what bounds it now"), instead of in the socket's
		// receive buffer, where the kernel drops the excess.
		ProcessorsPerChannel: 1,
		// Called with nil when the endpoint is closed, with the error when
		// its reader ended on one.
		ClosedFunc: func(err tcpip.Error) {
			if err != nil {
				o.Failed(fmt.Errorf("reading %s: %s", o.IfName, err))
			}
		},
	}
	if o.Sockets.TX > 0 {
		// A fanout group needs a socket that receives (EINVAL on a
		// send-only one), and one socket has nobody to share with.
		fo.PreConfigured, fo.IsPacketSocket = true, []bool{true}
		// fdbased still runs a reader on the send-only socket, which
		// never receives: readv's one set of buffers instead of
		// recvmmsg's eight keeps ~1 MiB out of every idle stack.
		fo.PacketDispatchMode = fdbased.Readv
	}
	switch o.GSO.Mode {
	case offload.ModeHardware:
		fo.GSOMaxSize = o.GSO.Link.MaxBurst(o.MTU)
	case offload.ModeSoftware:
		// The kernel's GSO segments these on the way to the link (its
		// TSO is off, see ethtool.LinkTSOOff): one system call and one
		// copy per 64 KiB. Splitting them here and sending the frames
		// with one sendmmsg moved 2.8x less pod→node in one interleaved
		// run (BENCHMARKS.md, History: software GSO by the kernel's GSO).
		fo.GSOMaxSize = softwareGSOMaxSize
	}
	return &fo
}

// virtioNetHdrLen is struct virtio_net_hdr, which a packet socket with
// PACKET_VNET_HDR expects before every frame (all zero: no GSO, checksum
// complete).
const virtioNetHdrLen = 10

// DirectWriter writes single frames to the pod's link past netstack's
// queue (relay.Leg.WriteDirect), never blocking: a full socket drops.
type DirectWriter struct {
	fd      int
	vnetHdr bool
	mac     net.HardwareAddr
}

// NewDirectWriter writes on the link's send socket (its own socket
// without one), from mac, with the virtio-net header when vnetHdr.
func NewDirectWriter(s *packetsock.Link, vnetHdr bool, mac net.HardwareAddr) *DirectWriter {
	return &DirectWriter{fd: sendFD(s), vnetHdr: vnetHdr, mac: mac}
}

// Write sends ip to the link address to in one frame.
func (w *DirectWriter) Write(to tcpip.LinkAddress, proto tcpip.NetworkProtocolNumber, ip []byte) error {
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
