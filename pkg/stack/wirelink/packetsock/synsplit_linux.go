package packetsock

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// A SYN flood arrives on the same link as the pod's established traffic.
// Read through one socket, every flooding SYN costs the general receive
// path (netstack's link dispatch and packet buffers) before it can be
// told apart, and the frames the stack cannot read in time are dropped at
// the socket whatever they carry. A fragment flood is the same: its
// frames queue in the link's socket ahead of an established connection's
// segments, and a probe beside hping3's random fragments waits far longer
// than beside the kernel veth (test/hostile TestFragmentFlood;
// docs/reliability/hostile.md, "Fragments at full speed"). So the
// pod's link is read through three sockets, split in the kernel by one
// classic BPF program that sorts each frame into a class (linkFilter):
// the new-connection SYNs (TCP, SYN without ACK, not a fragment, IPv4 or
// IPv6 without extension headers), the IP fragments (IPv4 with
// more-fragments set or an offset, IPv6 whose first next header is a
// fragment header), and everything else. Each socket keeps
// the frames of its class only, so the three are exact complements and
// every frame reaches exactly one socket; a flood of either kind fills
// only its own socket's buffer, and the stack reads it on a path of its
// own (podstack's synPath and fragPath).

// Frame classes of linkFilter.
const (
	classSYN = iota
	classFragment
	classOther
)

// linkFilter returns syn, fragment or other for a frame of that class.
// Offsets are into the Ethernet frame (the filter runs before any
// virtio-net header).
func linkFilter(syn, fragment, other uint32) []unix.SockFilter {
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
		// IPv4's more-fragments flag and fragment offset.
		fragBits = 0x3fff
	)
	return []unix.SockFilter{
		/* 0 */ {Code: ldh, K: 12}, // EtherType
		/* 1 */ {Code: jeq, K: unix.ETH_P_IP, Jt: 0, Jf: 8}, // → 10
		/* 2 */ {Code: ldh, K: 14 + 6}, // flags and fragment offset
		/* 3 */ {Code: jset, K: fragBits, Jt: 14, Jf: 0}, // a fragment → 18
		/* 4 */ {Code: ldb, K: 14 + 9}, // IPv4 protocol
		/* 5 */ {Code: jeq, K: unix.IPPROTO_TCP, Jt: 0, Jf: 13}, // → 19
		/* 6 */ {Code: msh, K: 14}, // X = IPv4 header length
		/* 7 */ {Code: ldbx, K: 14 + 13}, // TCP flags
		/* 8 */ {Code: and, K: synAck},
		/* 9 */ {Code: jeq, K: synBit, Jt: 7, Jf: 9}, // → 17 : 19
		/* 10 */ {Code: jeq, K: unix.ETH_P_IPV6, Jt: 0, Jf: 8}, // → 19
		/* 11 */ {Code: ldb, K: 14 + 6}, // IPv6 next header
		/* 12 */ {Code: jeq, K: unix.IPPROTO_FRAGMENT, Jt: 5, Jf: 0}, // → 18
		/* 13 */ {Code: jeq, K: unix.IPPROTO_TCP, Jt: 0, Jf: 5}, // → 19
		/* 14 */ {Code: ldb, K: 14 + 40 + 13}, // TCP flags
		/* 15 */ {Code: and, K: synAck},
		/* 16 */ {Code: jeq, K: synBit, Jt: 0, Jf: 2}, // → 17 : 19
		/* 17 */ {Code: ret, K: syn},
		/* 18 */ {Code: ret, K: fragment},
		/* 19 */ {Code: ret, K: other},
	}
}

// classFilter keeps the frames of class c only.
func classFilter(c int) []unix.SockFilter {
	var keep [3]uint32
	keep[c] = wholeFrame
	return linkFilter(keep[classSYN], keep[classFragment], keep[classOther])
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
// synchronize_net, even on an unbound socket), which a caller can spend
// doing other work (docs/performance.md).
func NewSYNSocket(o Options) (*SYNSocket, error) {
	o.VnetHdr = false // SYNs are never GSO frames
	s := &SYNSocket{}
	// The filter and the ring come before the bind: the socket never
	// queues anything but SYNs.
	fd, err := open(o, func(fd int) error {
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
			return fmt.Errorf("ignoring outgoing frames on %s: %w", o.IfName, err)
		}
		if err := attachFilter(fd, classFilter(classSYN)); err != nil {
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

// FragmentBufferBytes is the fragment socket's receive buffer (Options.
// BufferBytes's default for OpenFragments): what the kernel queues for
// the stack's fragment path before it drops, about 1,500 fragments of a
// flood (each a socket buffer of about 1.3 KiB) or 30 datagrams of 64 KiB
// in MTU-sized fragments. Kernel memory, not the stack's, as the kernel's
// own reassembly limit (ipfrag_high_thresh, 4 MiB) is.
const FragmentBufferBytes = 2 << 20

// OpenFragments opens the socket that receives the IP fragments arriving
// on o.IfName (without a virtio-net header: fragments are never GSO
// frames), ignoring the frames the stack sends. Until Split, the link's
// socket receives them too.
func OpenFragments(o Options) (int, error) {
	o.VnetHdr = false
	if o.BufferBytes == 0 {
		o.BufferBytes = FragmentBufferBytes
	}
	return open(o, func(fd int) error {
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
			return fmt.Errorf("ignoring outgoing frames on %s: %w", o.IfName, err)
		}
		if err := attachFilter(fd, classFilter(classFragment)); err != nil {
			return fmt.Errorf("attaching the fragment filter on %s: %w", o.IfName, err)
		}
		return nil
	})
}

// Split makes main, the link's socket from Open, stop receiving the
// frames the SYN socket (syn) and the fragment socket (fragments) take,
// and the frames the stack sends; without either, main keeps that class.
// On error main is as it was. Between the filters a frame may reach two
// sockets once: netstack takes a duplicate SYN as a retransmission and a
// duplicate fragment as one it already holds.
func Split(main int, ifName string, syn, fragments bool) error {
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
	keep := func(taken bool) uint32 {
		if taken {
			return 0
		}
		return wholeFrame
	}
	if err := attachFilter(main, linkFilter(keep(syn), keep(fragments), wholeFrame)); err != nil {
		return fmt.Errorf("keeping SYNs and fragments from the link's socket on %s: %w", ifName, err)
	}
	ok = true
	return nil
}
