// Command sockmap-probe measures what a request and its answer between two
// processes over one loopback TCP connection cost with the kernel's TCP
// (the path between a pod's stack and its applications) and with an
// sk_msg program that puts each send straight into the peer socket's
// receive queue (what Cilium's socket-level acceleration does for local
// connections). It answers one question before that shape is built into
// the stack: how much of a request's CPU and latency the loopback TCP is.
//
//	go run . -rounds 3          # as root: both modes, alternated
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

func main() {
	mode := flag.String("mode", "", "tcp or sockmap; empty: both, alternated for -rounds")
	rounds := flag.Int("rounds", 3, "rounds of both modes when -mode is empty")
	role := flag.String("role", "client", "client or echo (internal)")
	n := flag.Int("n", 100000, "round trips")
	size := flag.Int("size", 64, "request and answer bytes")
	flag.Parse()
	if *n <= 0 || *size <= 0 {
		fmt.Fprintln(os.Stderr, "-n and -size must be positive")
		os.Exit(2)
	}
	if *role == "echo" {
		echo(3, *size)
		return
	}
	modes := []string{*mode}
	if *mode == "" {
		modes = nil
		for i := 0; i < *rounds; i++ {
			modes = append(modes, "tcp", "sockmap")
		}
	}
	for _, m := range modes {
		if err := run(m, *n, *size); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", m, err)
			os.Exit(1)
		}
	}
}

func echo(fd, size int) {
	runtime.LockOSThread()
	buf := make([]byte, size)
	for {
		if !readFull(fd, buf) {
			return
		}
		if err := writeAll(fd, buf); err != nil {
			fmt.Fprintln(os.Stderr, "echo write:", err)
			return
		}
	}
}

func writeAll(fd int, buf []byte) error {
	for sent := 0; sent < len(buf); {
		m, err := unix.Write(fd, buf[sent:])
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return err
		}
		sent += m
	}
	return nil
}

func readFull(fd int, buf []byte) bool {
	for got := 0; got < len(buf); {
		m, err := unix.Read(fd, buf[got:])
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil || m == 0 {
			if err != nil {
				fmt.Fprintln(os.Stderr, "read:", err)
			}
			return false
		}
		got += m
	}
	return true
}

// pair connects two loopback TCP sockets. The sockets are close-on-exec:
// the echo process must hold only its own end, or the client's close
// would never reach it as EOF.
func pair() (client, server int, serverPort int, err error) {
	l, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("listening socket: %w", err)
	}
	defer unix.Close(l)
	loopback := &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}
	if err := unix.Bind(l, loopback); err != nil {
		return 0, 0, 0, fmt.Errorf("binding to loopback: %w", err)
	}
	if err := unix.Listen(l, 1); err != nil {
		return 0, 0, 0, fmt.Errorf("listening: %w", err)
	}
	sa, err := unix.Getsockname(l)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("reading the listener's port: %w", err)
	}
	loopback.Port = sa.(*unix.SockaddrInet4).Port
	c, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("client socket: %w", err)
	}
	if err := unix.Connect(c, loopback); err != nil {
		unix.Close(c)
		return 0, 0, 0, fmt.Errorf("connecting: %w", err)
	}
	s, _, err := unix.Accept4(l, unix.SOCK_CLOEXEC)
	if err != nil {
		unix.Close(c)
		return 0, 0, 0, fmt.Errorf("accepting: %w", err)
	}
	for _, fd := range []int{c, s} {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
			unix.Close(c)
			unix.Close(s)
			return 0, 0, 0, fmt.Errorf("setting TCP_NODELAY: %w", err)
		}
	}
	return c, s, loopback.Port, nil
}

// redirect loads a sockmap of two entries (0: the accepted socket, 1: the
// client) and an sk_msg verdict that sends each message into the other
// socket's receive queue (BPF_F_INGRESS), so neither send runs TCP.
func redirect(client, server, serverPort int) (func(), error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.SockMap, KeySize: 4, ValueSize: 4, MaxEntries: 2})
	if err != nil {
		return nil, fmt.Errorf("creating sockmap: %w", err)
	}
	const localPortOff = 64 // offsetof(struct sk_msg_md, local_port)
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R1, localPortOff, asm.Word),
		asm.Mov.Imm(asm.R3, 0),
		asm.JNE.Imm(asm.R2, int32(serverPort), "go"),
		asm.Mov.Imm(asm.R3, 1),
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("go"),
		asm.LoadMapPtr(asm.R2, m.FD()),
		asm.Mov.Imm(asm.R4, 1), // BPF_F_INGRESS
		asm.FnMsgRedirectMap.Call(),
		asm.Return(),
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SkMsg, Instructions: insns, License: "GPL"})
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("loading sk_msg: %w", err)
	}
	done := func() { prog.Close(); m.Close() }
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: m.FD(), Program: prog, Attach: ebpf.AttachSkMsgVerdict}); err != nil {
		done()
		return nil, fmt.Errorf("attaching sk_msg: %w", err)
	}
	for key, fd := range []int{server, client} {
		if err := m.Update(uint32(key), uint32(fd), ebpf.UpdateAny); err != nil {
			done()
			return nil, fmt.Errorf("adding socket %d to the sockmap: %w", key, err)
		}
	}
	return done, nil
}

func run(mode string, n, size int) error {
	client, server, port, err := pair()
	if err != nil {
		return err
	}
	defer unix.Close(client)
	if mode == "sockmap" {
		done, err := redirect(client, server, port)
		if err != nil {
			unix.Close(server)
			return err
		}
		defer done()
	}
	self, err := os.Executable()
	if err != nil {
		unix.Close(server)
		return err
	}
	cmd := exec.Command(self, "-role", "echo", "-size", strconv.Itoa(size))
	cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(server), "server")}
	cmd.Stderr = os.Stderr
	err = cmd.Start()
	unix.Close(server)
	if err != nil {
		return fmt.Errorf("starting the echo process: %w", err)
	}

	runtime.LockOSThread()
	buf := make([]byte, size)
	rtt := make([]time.Duration, 0, n)
	var before unix.Rusage
	unix.Getrusage(unix.RUSAGE_THREAD, &before)
	start := time.Now()
	for i := 0; i < n; i++ {
		t := time.Now()
		if err := writeAll(client, buf); err != nil {
			return err
		}
		if !readFull(client, buf) {
			return fmt.Errorf("echo closed at %d", i)
		}
		rtt = append(rtt, time.Since(t))
	}
	wall := time.Since(start)
	var after unix.Rusage
	unix.Getrusage(unix.RUSAGE_THREAD, &after)
	unix.Shutdown(client, unix.SHUT_WR) // the echo's EOF
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("echo process: %w", err)
	}
	cpu := func(r *unix.Rusage) time.Duration {
		return time.Duration(r.Utime.Nano() + r.Stime.Nano())
	}
	clientCPU := cpu(&after) - cpu(&before)
	echoCPU := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	sort.Slice(rtt, func(i, j int) bool { return rtt[i] < rtt[j] })
	fmt.Printf("mode=%s size=%d n=%d p50=%.1fus p99=%.1fus rt/s=%.0f cpu/rt client=%.2fus echo=%.2fus\n",
		mode, size, n,
		float64(rtt[n/2].Nanoseconds())/1e3, float64(rtt[n*99/100].Nanoseconds())/1e3,
		float64(n)/wall.Seconds(),
		float64(clientCPU.Nanoseconds())/1e3/float64(n), float64(echoCPU.Nanoseconds())/1e3/float64(n))
	return nil
}
