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
// core (recvmmsg of 64 SYNs cost ~1.5 µs per SYN in the stack's profile),
// and a frame takes 256 bytes of ring instead of a ~1 KiB socket buffer.

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
// (OpenSYN), with its receive ring. Next, Release and Wait are for one
// reading goroutine.
type SYNSocket struct {
	FD     int
	ring   []byte
	frames int
	next   int
	poll   [2]unix.PollFd // Wait's, kept to not allocate per wait
}

// Close unmaps the ring and closes the socket.
func (s *SYNSocket) Close() {
	if s.ring != nil {
		_ = unix.Munmap(s.ring)
	}
	unix.Close(s.FD)
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

// Wait blocks until the ring holds a SYN or stop (an eventfd) is
// readable, and reports the latter.
func (s *SYNSocket) Wait(stop int) (stopped bool, err error) {
	for {
		if atomic.LoadUint32(s.status(s.next))&unix.TP_STATUS_USER != 0 {
			return false, nil
		}
		s.poll = [2]unix.PollFd{{Fd: int32(stop), Events: unix.POLLIN}, {Fd: int32(s.FD), Events: unix.POLLIN}}
		fds := s.poll[:]
		if _, err := unix.Ppoll(fds, nil, nil); err != nil && err != unix.EINTR {
			return false, fmt.Errorf("waiting for SYNs: %w", err)
		}
		if fds[0].Revents&unix.POLLIN != 0 {
			return true, nil
		}
		if fds[1].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
			return false, fmt.Errorf("waiting for SYNs: the socket reports %#x", fds[1].Revents)
		}
	}
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
