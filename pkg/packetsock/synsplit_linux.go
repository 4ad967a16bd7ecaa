package packetsock

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// A SYN flood arrives on the same link as the pod's established traffic.
// Read through one socket, every flooding SYN costs the general receive
// path (netstack's link dispatch and packet buffers) before it can be
// told apart, and the frames the stack cannot read in time are dropped at
// the socket whatever they carry. So the pod's link is read through two
// sockets, split in the kernel by a classic BPF filter on each: one gets
// the new-connection SYNs only (TCP, SYN without ACK, not a later
// fragment, IPv4 or IPv6 without extension headers), the other everything
// else. A flood then fills only the SYN socket's buffer, and the stack
// reads SYNs in large batches on a path of their own (podstack's synPath).
// The two filters are exact complements, so every frame reaches exactly
// one socket.

// synFilter accepts exactly the frames the SYN socket takes. Offsets are
// into the Ethernet frame (the filter runs before any virtio-net header).
func synFilter(syn, other uint32) []unix.SockFilter {
	const (
		ldh  = unix.BPF_LD | unix.BPF_H | unix.BPF_ABS
		ldb  = unix.BPF_LD | unix.BPF_B | unix.BPF_ABS
		ldbx = unix.BPF_LD | unix.BPF_B | unix.BPF_IND
		msh  = unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		and  = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
		// TCP's SYN and ACK flags, and SYN alone.
		synAck = 0x12
		synBit = 0x02
	)
	return []unix.SockFilter{
		/* 0 */ {Code: ldh, K: 12}, // EtherType
		/* 1 */ {Code: jeq, K: unix.ETH_P_IP, Jt: 0, Jf: 8}, // → 10
		/* 2 */ {Code: ldb, K: 14 + 9}, // IPv4 protocol
		/* 3 */ {Code: jeq, K: unix.IPPROTO_TCP, Jt: 0, Jf: 13}, // → 17
		/* 4 */ {Code: ldh, K: 14 + 6}, // flags and fragment offset
		/* 5 */ {Code: jset, K: 0x1fff, Jt: 11, Jf: 0}, // a later fragment → 17
		/* 6 */ {Code: msh, K: 14}, // X = IPv4 header length
		/* 7 */ {Code: ldbx, K: 14 + 13}, // TCP flags
		/* 8 */ {Code: and, K: synAck},
		/* 9 */ {Code: jeq, K: synBit, Jt: 6, Jf: 7}, // → 16 : 17
		/* 10 */ {Code: jeq, K: unix.ETH_P_IPV6, Jt: 0, Jf: 6}, // → 17
		/* 11 */ {Code: ldb, K: 14 + 6}, // IPv6 next header
		/* 12 */ {Code: jeq, K: unix.IPPROTO_TCP, Jt: 0, Jf: 4}, // → 17
		/* 13 */ {Code: ldb, K: 14 + 40 + 13}, // TCP flags
		/* 14 */ {Code: and, K: synAck},
		/* 15 */ {Code: jeq, K: synBit, Jt: 0, Jf: 1}, // → 16 : 17
		/* 16 */ {Code: ret, K: syn},
		/* 17 */ {Code: ret, K: other},
	}
}

// wholeFrame is a filter's "keep all of it" (the kernel keeps the smaller
// of this and the frame).
const wholeFrame = 0xffffffff

func attachFilter(fd int, prog []unix.SockFilter) error {
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]})
}

// NewSYNSocket opens the socket that receives the new-connection SYNs of
// o.IfName, with its receive ring; it ignores the frames the stack sends
// (PACKET_IGNORE_OUTGOING), which it would take for arriving ones. Until
// Split, the link's socket receives the SYNs too.
//
// It takes an RCU grace period (the ring: packet_set_ring's
// synchronize_net, 4-16 ms on this project's VMs, even on an unbound
// socket), which a caller can spend doing other work.
func NewSYNSocket(o Options) (*SYNSocket, error) {
	o.VnetHdr = false // SYNs are never GSO frames
	s := &SYNSocket{}
	// The filter and the ring come before the bind: the socket never
	// queues anything but SYNs.
	fd, err := open(o, func(fd int) error {
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
			return fmt.Errorf("ignoring outgoing frames on %s: %w", o.IfName, err)
		}
		if err := attachFilter(fd, synFilter(wholeFrame, 0)); err != nil {
			return fmt.Errorf("attaching the SYN filter on %s: %w", o.IfName, err)
		}
		var err error
		if s.ring, s.frames, err = setupRing(fd); err != nil {
			return fmt.Errorf("SYN socket on %s: %w", o.IfName, err)
		}
		return nil
	})
	if err != nil {
		if s.ring != nil {
			_ = unix.Munmap(s.ring)
		}
		return nil, err
	}
	s.FD = fd
	return s, nil
}

// Split makes main, the link's socket from Open, stop receiving SYNs
// (they are s's now) and the frames s's owner sends. On error main is as
// it was. Between the two filters a SYN may reach both sockets once:
// netstack takes a duplicate SYN as a retransmission.
func (s *SYNSocket) Split(main int, ifName string) error {
	ok := false
	defer func() {
		if !ok {
			_ = unix.SetsockoptInt(main, unix.SOL_SOCKET, unix.SO_DETACH_FILTER, 0)
			_ = unix.SetsockoptInt(main, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 0)
		}
	}()
	if err := unix.SetsockoptInt(main, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
		return fmt.Errorf("ignoring outgoing frames on %s: %w", ifName, err)
	}
	if err := attachFilter(main, synFilter(0, wholeFrame)); err != nil {
		return fmt.Errorf("keeping SYNs from the link's socket on %s: %w", ifName, err)
	}
	ok = true
	return nil
}
