package sandbox

import (
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/abi/linux"
	"gvisor.dev/gvisor/pkg/seccomp"
)

// archAllowed adds the calls only amd64 has.
func archAllowed() map[uintptr]seccomp.SyscallRule {
	return map[uintptr]seccomp.SyscallRule{
		// A new Go thread sets its TLS base; nothing else.
		unix.SYS_ARCH_PRCTL: seccomp.PerArg{seccomp.EqualTo(linux.ARCH_SET_FS)},
		unix.SYS_EPOLL_WAIT: seccomp.MatchAll{},
		unix.SYS_POLL:       seccomp.MatchAll{},
	}
}

// hotSyscalls come first in the filter: the wire and app legs' batches
// and the scheduler's sleeps and wakeups, most frequent first (strace -c
// of a bulk transfer).
var hotSyscalls = []uintptr{unix.SYS_SENDMMSG, unix.SYS_RECVMMSG, unix.SYS_WRITEV, unix.SYS_FUTEX, unix.SYS_READ, unix.SYS_NANOSLEEP, unix.SYS_PPOLL}
