package sandbox

import (
	"fmt"

	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/abi/linux"
	"gvisor.dev/gvisor/pkg/bpf"
	"gvisor.dev/gvisor/pkg/seccomp"
)

// deniedErrno is what a system call outside the allowlist returns. A
// sentry that sees an unexpected call is compromised and gVisor kills it;
// this process serves one pod's network, and a rare path that wanders off
// the list (an error branch, a runtime feature of a newer Go) should fail
// that one operation, which Go code handles as an error, rather than take
// the pod's network down until a supervisor notices.
const deniedErrno = unix.EPERM

// threadCloneFlags are the flags both the Go runtime and glibc's
// pthread_create pass to clone(2) for a new thread; threadCloneMask adds
// what must stay clear: every namespace, and a pidfd.
const (
	threadCloneFlags = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD
	threadCloneMask  = threadCloneFlags | unix.CLONE_PIDFD | unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP |
		unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET
)

// allowed is the allowlist: what the serving stack calls, found by
// running every root suite under SECCOMP_RET_LOG and reading the kernel
// log (docs/reliability/sandbox.md has the groups and reasons). pid is
// this process: signals may only go to its own threads.
func allowed(pid int) seccomp.SyscallRules {
	noExec := seccomp.PerArg{nil, nil, seccomp.MaskedEqual(unix.PROT_EXEC, 0)}
	ownProcess := seccomp.PerArg{seccomp.EqualTo(pid)}
	r := map[uintptr]seccomp.SyscallRule{
		// Go runtime: memory. Never executable: the process maps no new
		// code after start.
		unix.SYS_MMAP:     noExec,
		unix.SYS_MPROTECT: noExec,
		unix.SYS_MUNMAP:   seccomp.MatchAll{},
		unix.SYS_MADVISE:  seccomp.MatchAll{},
		unix.SYS_MREMAP:   seccomp.MatchAll{},
		unix.SYS_BRK:      seccomp.MatchAll{},

		// Go runtime: threads and scheduling. clone only makes threads.
		unix.SYS_CLONE:             seccomp.PerArg{seccomp.MaskedEqual(threadCloneMask, threadCloneFlags)},
		unix.SYS_FUTEX:             seccomp.MatchAll{},
		unix.SYS_SET_ROBUST_LIST:   seccomp.MatchAll{},
		unix.SYS_RSEQ:              seccomp.MatchAll{},
		unix.SYS_SCHED_YIELD:       seccomp.MatchAll{},
		unix.SYS_SCHED_GETAFFINITY: seccomp.MatchAll{},
		unix.SYS_NANOSLEEP:         seccomp.MatchAll{},
		unix.SYS_CLOCK_NANOSLEEP:   seccomp.MatchAll{},
		unix.SYS_GETTID:            seccomp.MatchAll{},
		unix.SYS_GETPID:            seccomp.MatchAll{},
		unix.SYS_EXIT:              seccomp.MatchAll{},
		unix.SYS_EXIT_GROUP:        seccomp.MatchAll{},
		unix.SYS_RESTART_SYSCALL:   seccomp.MatchAll{},
		unix.SYS_GETRANDOM:         seccomp.MatchAll{},

		// Signals: preemption (SIGURG), SIGTERM, SIGPROF for profiles,
		// crashes. Only to this process.
		unix.SYS_RT_SIGACTION:   seccomp.MatchAll{},
		unix.SYS_RT_SIGPROCMASK: seccomp.MatchAll{},
		unix.SYS_RT_SIGRETURN:   seccomp.MatchAll{},
		unix.SYS_SIGALTSTACK:    seccomp.MatchAll{},
		unix.SYS_TGKILL:         ownProcess,
		unix.SYS_KILL:           ownProcess,

		// Time and the CPU profiler's timers (runtime/pprof).
		unix.SYS_CLOCK_GETTIME: seccomp.MatchAll{},
		unix.SYS_GETTIMEOFDAY:  seccomp.MatchAll{},
		unix.SYS_SETITIMER:     seccomp.MatchAll{},
		unix.SYS_GETITIMER:     seccomp.MatchAll{},
		unix.SYS_TIMER_CREATE:  seccomp.MatchAll{},
		unix.SYS_TIMER_SETTIME: seccomp.MatchAll{},
		unix.SYS_TIMER_DELETE:  seccomp.MatchAll{},

		// The relay's pod side: a TCP or UDP socket per connection or flow
		// to the applications (podsock), over IPv4 or IPv6, protocol 0.
		// Never raw, packet, netlink or unix sockets: with CAP_NET_RAW
		// kept, the type is what stands between the stack and raw sockets.
		unix.SYS_SOCKET: seccomp.Or{
			inetSocket(unix.AF_INET, unix.SOCK_STREAM), inetSocket(unix.AF_INET, unix.SOCK_DGRAM),
			inetSocket(unix.AF_INET6, unix.SOCK_STREAM), inetSocket(unix.AF_INET6, unix.SOCK_DGRAM),
		},
		unix.SYS_SETSOCKOPT: seccomp.MatchAll{},
		unix.SYS_BIND:       seccomp.MatchAll{},
		unix.SYS_CONNECT:    seccomp.MatchAll{},

		// I/O on descriptors opened during setup: the AF_PACKET socket,
		// the TUN, the control socket and its connections, the log; and
		// on the relay's sockets.
		unix.SYS_READ:        seccomp.MatchAll{},
		unix.SYS_WRITE:       seccomp.MatchAll{},
		unix.SYS_READV:       seccomp.MatchAll{},
		unix.SYS_WRITEV:      seccomp.MatchAll{},
		unix.SYS_PREAD64:     seccomp.MatchAll{},
		unix.SYS_CLOSE:       seccomp.MatchAll{},
		unix.SYS_RECVMMSG:    seccomp.MatchAll{},
		unix.SYS_SENDMMSG:    seccomp.MatchAll{},
		unix.SYS_RECVMSG:     seccomp.MatchAll{},
		unix.SYS_SENDMSG:     seccomp.MatchAll{},
		unix.SYS_RECVFROM:    seccomp.MatchAll{},
		unix.SYS_SENDTO:      seccomp.MatchAll{},
		unix.SYS_PPOLL:       seccomp.MatchAll{},
		unix.SYS_EPOLL_PWAIT: seccomp.MatchAll{},
		unix.SYS_EPOLL_CTL:   seccomp.MatchAll{},
		unix.SYS_ACCEPT4:     seccomp.MatchAll{},
		unix.SYS_GETSOCKNAME: seccomp.MatchAll{},
		unix.SYS_GETPEERNAME: seccomp.MatchAll{},
		unix.SYS_GETSOCKOPT:  seccomp.MatchAll{},
		unix.SYS_SHUTDOWN:    seccomp.MatchAll{},
		unix.SYS_FCNTL: seccomp.Or{
			seccomp.PerArg{nil, seccomp.EqualTo(unix.F_GETFD)},
			seccomp.PerArg{nil, seccomp.EqualTo(unix.F_SETFD)},
			seccomp.PerArg{nil, seccomp.EqualTo(unix.F_GETFL)},
			seccomp.PerArg{nil, seccomp.EqualTo(unix.F_SETFL)},
		},

		// Rotating the log (pkg/stack/logfile): stderr, which is the log,
		// and the rotated file the launcher handed over.
		unix.SYS_FTRUNCATE: seccomp.Or{
			seccomp.PerArg{seccomp.EqualTo(2)},
			seccomp.PerArg{seccomp.EqualTo(launch.LogRotatedFD)},
		},
	}
	for nr, rule := range archAllowed() {
		r[nr] = rule
	}
	return seccomp.MakeSyscallRules(r)
}

// inetSocket matches socket(domain, typ|SOCK_NONBLOCK|SOCK_CLOEXEC, 0).
func inetSocket(domain, typ int) seccomp.SyscallRule {
	return seccomp.PerArg{
		seccomp.EqualTo(uintptr(domain)),
		seccomp.MaskedEqual(0xffffffff&^uintptr(unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC), uintptr(typ)),
		seccomp.EqualTo(0),
	}
}

// program builds the filter for mode (On or Log).
func program(mode Mode, pid int) ([]bpf.Instruction, error) {
	denied := seccomp.ReturnError.Code(uint16(deniedErrno))
	p := seccomp.Program{
		RuleSets: []seccomp.RuleSet{
			// glibc's pthread_create tries clone3 first, whose flags sit
			// in memory a filter cannot read; ENOSYS makes it fall back
			// to clone, whose flags the rule above checks.
			{Rules: seccomp.MakeSyscallRules(map[uintptr]seccomp.SyscallRule{unix.SYS_CLONE3: seccomp.MatchAll{}}), Action: seccomp.ReturnError.Code(uint16(unix.ENOSYS))},
			{Rules: allowed(pid), Action: seccomp.Allow},
		},
		Options: seccomp.ProgramOptions{
			DefaultAction: denied,
			// Another ABI (int 0x80, x32) is never this Go binary.
			BadArchAction: seccomp.KillProcess,
			HotSyscalls:   hotSyscalls,
		},
	}
	instrs, _, err := p.Build()
	if err != nil {
		return nil, fmt.Errorf("building the seccomp filter: %w", err)
	}
	if mode == Log {
		// gVisor's builder has no log action: turn the default's return
		// into one. The denied errno is returned nowhere else.
		want := uint32(linux.SECCOMP_RET_ERRNO) | uint32(deniedErrno)
		n := 0
		for i, in := range instrs {
			if in.OpCode == bpf.Ret|bpf.K && in.K == want {
				instrs[i].K = unix.SECCOMP_RET_LOG
				n++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("building the seccomp filter: no default return to turn into a log")
		}
	}
	return instrs, nil
}
