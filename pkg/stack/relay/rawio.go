package relay

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The relay's reads and writes on the applications' sockets are
// non-blocking system calls made without telling the Go scheduler
// (RawSyscall: no entersyscall). With the stack's one P (stackconfig.
// DefaultThreads), a P seen in a system call for a sysmon tick (20 µs; a
// write that wakes the application over loopback often takes longer) is
// taken from its thread and handed to a new spinning one, which finds
// nothing to run and parks again: two thread wake-ups and a slow return
// from the system call for every request, and sysmon itself polling every
// 20 µs while that goes on (BENCHMARKS.md, the run that introduced raw
// system calls, measured it under TCP_RR).

// rawRead reads once into b, again after EINTR. At EAGAIN the caller's
// rc.Read callback returns false, to wait on the netpoller.
func rawRead(fd uintptr, b []byte) (int, unix.Errno) {
	if len(b) == 0 {
		return 0, 0
	}
	return rawCall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
}

// rawWritev writes iovs once, again after EINTR; it returns what the
// socket took and EAGAIN when that was nothing.
func rawWritev(fd uintptr, iovs []unix.Iovec) (int, unix.Errno) {
	if len(iovs) == 0 {
		return 0, 0
	}
	return rawCall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iovs[0])), uintptr(len(iovs)))
}

// rawCall makes a non-blocking system call, again after EINTR.
func rawCall(trap, a1, a2, a3 uintptr) (int, unix.Errno) {
	for {
		n, _, errno := unix.RawSyscall(trap, a1, a2, a3)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return 0, errno
		}
		return int(n), 0
	}
}

// appReader reads an application's TCP socket with recvmsg and TCP_INQ:
// with each read the kernel says how many bytes it still holds, and it
// counts a FIN not yet read as one (tcp_inq_hint), so zero means that a
// read now would say EAGAIN and the caller may wait for readability
// instead. Without TCP_INQ (setsockopt refused) read says -1: unknown.
type appReader struct {
	inq bool
	msg unix.Msghdr
	iov unix.Iovec
	oob [inqCmsgSpace]byte
}

// inqCmsgSpace holds the one control message TCP_INQ adds: an int.
const inqCmsgSpace = 24 // unix.CmsgSpace(4) on 64-bit Linux

func newAppReader(rc syscall.RawConn) *appReader {
	a := &appReader{}
	rc.Control(func(fd uintptr) {
		a.inq = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_INQ, 1) == nil
	})
	a.msg.Iov = &a.iov
	a.msg.SetIovlen(1)
	a.msg.Control = &a.oob[0]
	return a
}

// read reads once into b, again after EINTR, and returns what the socket
// still holds (-1: unknown).
func (a *appReader) read(fd uintptr, b []byte) (n, left int, errno unix.Errno) {
	if !a.inq {
		n, errno = rawRead(fd, b)
		return n, -1, errno
	}
	a.iov.Base = &b[0]
	a.iov.SetLen(len(b))
	// The kernel shrinks Controllen to what it wrote: room again.
	a.msg.SetControllen(len(a.oob))
	a.msg.Flags = 0
	n, errno = rawCall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&a.msg)), 0)
	// The buffer is the caller's and goes back to a pool.
	a.iov.Base = nil
	if errno != 0 {
		return 0, -1, errno
	}
	return n, a.left(), 0
}

// left finds TCP_CM_INQ in the control data of the last read.
func (a *appReader) left() int {
	if a.msg.Controllen < uint64(unix.CmsgLen(4)) {
		return -1
	}
	h := (*unix.Cmsghdr)(unsafe.Pointer(&a.oob[0]))
	if h.Level != unix.SOL_TCP || h.Type != unix.TCP_CM_INQ || h.Len < uint64(unix.CmsgLen(4)) {
		return -1
	}
	return int(*(*int32)(unsafe.Pointer(&a.oob[unix.CmsgLen(0)])))
}
