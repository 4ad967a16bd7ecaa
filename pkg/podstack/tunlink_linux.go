package podstack

import (
	"encoding/binary"
	"errors"
	"sync/atomic"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/rawfile"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// virtio_net_hdr (without num_buffers), the header a TUN opened with
// IFF_VNET_HDR puts before every packet in both directions.
const (
	vnetHdrLen          = 10
	vnetFlagNeedsCsum   = 1
	vnetGSONone         = 0
	vnetGSOTCPv4        = 1
	vnetGSOTCPv6        = 4
	tcpChecksumOffset   = 16
	maxTUNPacket        = 1 << 16
	tunReadBufferPacket = vnetHdrLen + maxTUNPacket
)

// tunLink is the app leg's link endpoint on a TUN opened with IFF_VNET_HDR
// and TUNSETOFFLOAD (TSO and checksum offload). The pod's kernel hands it
// whole TSO bursts with partial checksums, and it hands the kernel bursts
// the same way, so neither side checksums what never leaves the pod.
// fdbased cannot do this for a TUN (its virtio-net header path is for
// packet sockets only). Reads reuse one buffer and copy out only the bytes
// read, instead of zeroing a fresh 64 KiB chunk per packet, and deliver in
// the reading goroutine.
type tunLink struct {
	fd  int
	mtu uint32

	dispatcher atomic.Pointer[stack.NetworkDispatcher]
	closed     atomic.Bool
}

var _ stack.LinkEndpoint = (*tunLink)(nil)
var _ stack.GSOEndpoint = (*tunLink)(nil)

func newTUNLink(fd int, mtu uint32) *tunLink { return &tunLink{fd: fd, mtu: mtu} }

func (l *tunLink) MTU() uint32                             { return l.mtu }
func (l *tunLink) SetMTU(mtu uint32)                       { l.mtu = mtu }
func (l *tunLink) MaxHeaderLength() uint16                 { return 0 }
func (l *tunLink) LinkAddress() tcpip.LinkAddress          { return "" }
func (l *tunLink) SetLinkAddress(tcpip.LinkAddress)        {}
func (l *tunLink) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }
func (l *tunLink) AddHeader(*stack.PacketBuffer)           {}
func (l *tunLink) ParseHeader(*stack.PacketBuffer) bool    { return true }
func (l *tunLink) Close()                                  { l.closed.Store(true) }
func (l *tunLink) SetOnCloseAction(func())                 {}

// Wait does not wait for the read loop: it notices Close within
// tunPollTimeout, and the process exits right after anyway.
func (l *tunLink) Wait() {}

// tunPollTimeout (ms) bounds how long an idle read loop takes to notice
// Close.
const tunPollTimeout = 200

// Capabilities: received packets are trusted (the pod's own kernel made
// them, with partial checksums under offload); sent TCP packets carry
// partial checksums the kernel accepts as such.
func (l *tunLink) Capabilities() stack.LinkEndpointCapabilities {
	return stack.CapabilityRXChecksumOffload
}

// GSOMaxSize and SupportedGSO: netstack's TCP may hand over 64 KiB bursts.
func (l *tunLink) GSOMaxSize() uint32               { return maxTUNPacket - 1 }
func (l *tunLink) SupportedGSO() stack.SupportedGSO { return stack.HostGSOSupported }

func (l *tunLink) IsAttached() bool { return l.dispatcher.Load() != nil }

// Attach starts the read loop on the first attach.
func (l *tunLink) Attach(d stack.NetworkDispatcher) {
	var old *stack.NetworkDispatcher
	if d != nil {
		old = l.dispatcher.Swap(&d)
	} else {
		old = l.dispatcher.Swap(nil)
	}
	if old == nil && d != nil {
		go l.readLoop()
	}
}

func (l *tunLink) readLoop() {
	buf := make([]byte, tunReadBufferPacket)
	for !l.closed.Load() {
		n, err := unix.Read(l.fd, buf)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.EAGAIN) {
				fds := []unix.PollFd{{Fd: int32(l.fd), Events: unix.POLLIN}}
				unix.Poll(fds, tunPollTimeout)
				continue
			}
			return // the fd was closed
		}
		if n <= vnetHdrLen {
			continue
		}
		pkt := buf[vnetHdrLen:n]
		var proto tcpip.NetworkProtocolNumber
		switch pkt[0] >> 4 {
		case 4:
			proto = ipv4.ProtocolNumber
		case 6:
			proto = ipv6.ProtocolNumber
		default:
			continue
		}
		d := l.dispatcher.Load()
		if d == nil {
			return
		}
		pb := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(pkt)})
		(*d).DeliverNetworkPacket(proto, pb)
		pb.DecRef()
	}
}

// WritePackets writes each packet with a virtio-net header describing its
// partial checksum and, for a TCP burst, its segmentation.
func (l *tunLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	var hdr [vnetHdrLen]byte
	iov := make([]unix.Iovec, 0, 8)
	for i, pkt := range pkts.AsSlice() {
		clear(hdr[:])
		gso := pkt.GSOOptions
		if gso.Type != stack.GSONone && gso.NeedsCsum {
			hdr[0] = vnetFlagNeedsCsum
			binary.LittleEndian.PutUint16(hdr[6:8], uint16(gso.L3HdrLen))    // csum_start
			binary.LittleEndian.PutUint16(hdr[8:10], uint16(gso.CsumOffset)) // csum_offset
			if pkt.Data().Size() > int(gso.MSS) {
				switch gso.Type {
				case stack.GSOTCPv4:
					hdr[1] = vnetGSOTCPv4
				case stack.GSOTCPv6:
					hdr[1] = vnetGSOTCPv6
				}
				binary.LittleEndian.PutUint16(hdr[2:4], uint16(pkt.HeaderSize())) // hdr_len
				binary.LittleEndian.PutUint16(hdr[4:6], gso.MSS)                  // gso_size
			}
		}
		iov = append(iov[:0], rawfile.IovecFromBytes(hdr[:]))
		for _, s := range pkt.AsSlices() {
			iov = append(iov, rawfile.IovecFromBytes(s))
		}
		for {
			errno := rawfile.NonBlockingWriteIovec(l.fd, iov)
			if errno == 0 {
				break
			}
			if errno == unix.EAGAIN || errno == unix.EINTR {
				fds := []unix.PollFd{{Fd: int32(l.fd), Events: unix.POLLOUT}}
				unix.Poll(fds, 100)
				continue
			}
			return i, tcpip.TranslateErrno(errno)
		}
	}
	return pkts.Len(), nil
}
