package packetsock

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The SYN socket is read through a TPACKET_V2 receive ring: the kernel
// copies each SYN into the ring as it arrives (in the sender's context,
// not the stack's), and the stack reads frames from shared memory, with a
// system call only when the ring is empty. Under a flood that takes the
// receive system calls and the per-frame socket buffers off the stack's
// core (recvmmsg is a sizeable share of a SYN's cost in the stack's
// profile; docs/reliability/hostile.md, "The SYN cookie fast path"), and
// a frame takes 256 bytes of ring instead of a ~1 KiB socket buffer.

const (
	// synFrameSize holds the frame header (tp_mac lands at 66) and the
	// largest SYN without payload: 14 + 60 (IPv4 with options) + 60 (TCP
	// with options) bytes. A SYN carrying data is cut short (SYNSocket.Next
	// says so).
	synFrameSize = 256
	synBlockSize = 64 << 10
	// synRingBytes: 4,096 SYNs, ~35 ms of one hping3 flood here, for the
	// moments the stack is not scheduled. It counts in the stack's RSS.
	synRingBytes = 1 << 20
)

// tpacket2_hdr offsets.
const (
	tpStatus  = 0
	tpLen     = 4
	tpSnaplen = 8
	tpMac     = 12
)

// SYNSocket is the socket that receives a link's new-connection SYNs
// (NewSYNSocket), with its receive ring. Next, Release and Ready are for one
// reading goroutine.
type SYNSocket struct {
	FD     int
	ring   []byte
	frames int
	next   int
}

// Close unmaps the ring and closes the socket.
func (s *SYNSocket) Close() {
	// Twice would unmap whatever reused the ring's addresses, and close
	// whatever reused its descriptor.
	if s.ring != nil {
		_ = unix.Munmap(s.ring)
		s.ring = nil
	}
	if s.FD >= 0 {
		unix.Close(s.FD)
		s.FD = -1
	}
}

func (s *SYNSocket) status(i int) *uint32 {
	return (*uint32)(unsafe.Pointer(&s.ring[i*synFrameSize+tpStatus]))
}

// Next returns the next SYN the kernel has put in the ring, valid until
// Release: its Ethernet frame and whether the frame was cut short (a SYN
// with data). ok is false while the ring holds none.
func (s *SYNSocket) Next() (frame []byte, cut bool, ok bool) {
	if atomic.LoadUint32(s.status(s.next))&unix.TP_STATUS_USER == 0 {
		return nil, false, false
	}
	h := s.ring[s.next*synFrameSize : (s.next+1)*synFrameSize]
	wire := binary.NativeEndian.Uint32(h[tpLen:])
	snap := binary.NativeEndian.Uint32(h[tpSnaplen:])
	mac := int(binary.NativeEndian.Uint16(h[tpMac:]))
	if mac+int(snap) > len(h) {
		return nil, true, true // never from a kernel; Release skips it
	}
	return h[mac : mac+int(snap)], snap < wire, true
}

// Release hands the frame Next returned back to the kernel.
func (s *SYNSocket) Release() {
	atomic.StoreUint32(s.status(s.next), unix.TP_STATUS_KERNEL)
	s.next++
	if s.next == s.frames {
		s.next = 0
	}
}

// Ready reports whether the ring holds a SYN for Next.
func (s *SYNSocket) Ready() bool {
	return atomic.LoadUint32(s.status(s.next))&unix.TP_STATUS_USER != 0
}

// Err takes the socket's pending error, if any (SO_ERROR): ENETDOWN once
// the interface went down, which also unhooked the socket from it.
func (s *SYNSocket) Err() error {
	v, err := unix.GetsockoptInt(s.FD, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return fmt.Errorf("reading the SYN socket's error: %w", err)
	}
	if v != 0 {
		return unix.Errno(v)
	}
	return nil
}

// setupRing turns fd's receive path into the ring.
func setupRing(fd int) ([]byte, int, error) {
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VERSION, unix.TPACKET_V2); err != nil {
		return nil, 0, fmt.Errorf("selecting TPACKET_V2: %w", err)
	}
	req := unix.TpacketReq{
		Block_size: synBlockSize, Block_nr: synRingBytes / synBlockSize,
		Frame_size: synFrameSize, Frame_nr: synRingBytes / synFrameSize,
	}
	if err := unix.SetsockoptTpacketReq(fd, unix.SOL_PACKET, unix.PACKET_RX_RING, &req); err != nil {
		return nil, 0, fmt.Errorf("creating the receive ring: %w", err)
	}
	ring, err := unix.Mmap(fd, 0, synRingBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, 0, fmt.Errorf("mapping the receive ring: %w", err)
	}
	return ring, int(req.Frame_nr), nil
}
