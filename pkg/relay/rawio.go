package relay

import (
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
// 20 µs while that goes on. Measured under TCP_RR:
// docs/benchmarks/2026-12-01-raw-syscalls-fast-start.md.

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
