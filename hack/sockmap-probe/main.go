// Command sockmap-probe measures what a request and its answer between two
// processes over one loopback TCP connection cost with the kernel's TCP
// (the path between a pod's stack and its applications) and with an
// sk_msg program that puts each send straight into the peer socket's
// receive queue (what Cilium's socket-level acceleration does for local
// connections). It answers one question before that shape is built into
// the stack: how much of a request's CPU and latency the loopback TCP is.
//
// With -netns the two sockets are in two network namespaces of the
// probe's own, joined by a veth pair (two pods' applications talking
// over the kernel's TCP), and the redirect joins them across the
// namespaces: the cost of a request between two pods of one node whose
// applications' sockets were joined directly, which is the floor for a
// same-node shortcut between two pods' stacks.
//
//	go run . -rounds 3          # as root: both modes, alternated
//	go run . -rounds 3 -netns   # the same across two namespaces
//	go run . -rounds 3 -netns -redis -n 100000   # redis between them
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
	redis := flag.Bool("redis", false, "with -netns: redis-server in one namespace, redis-benchmark in the other, the applications' sockets joined or not")
	acrossNetns := flag.Bool("netns", false, "the two sockets in two network namespaces joined by a veth pair (made and removed by the probe)")
	flag.Parse()
	if *mode != "" && *mode != "tcp" && *mode != "sockmap" {
		fmt.Fprintf(os.Stderr, "-mode %q: want tcp or sockmap\n", *mode)
		os.Exit(2)
	}
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
	p := path{name: "loopback", connect: pair}
	cleanup := func() {}
	if *acrossNetns {
		var err error
		if cleanup, err = makeNamespaces(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		p = path{name: "two-netns", connect: pairAcross}
	}
	var err error
	if *redis && *acrossNetns {
		for _, m := range modes {
			if err = redisRound(m, *n); err != nil {
				break
			}
		}
	} else {
		err = runAll(modes, *n, *size, p)
	}
	cleanup() // the namespaces go whatever the outcome
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// path is how the two sockets are connected.
type path struct {
	name    string
	connect func() (client, server, serverPort int, err error)
}

func runAll(modes []string, n, size int, p path) error {
	for _, m := range modes {
		if err := run(m, n, size, p); err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
	}
	return nil
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
	c, err := listenAndConnect(l, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}, func() (int, error) {
		return unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	})
	if err != nil {
		return 0, 0, 0, err
	}
	return c.client, c.server, c.port, nil
}

// conn is one connection's two ends and the server's port.
type conn struct{ client, server, port int }

// listenAndConnect binds the listening socket l to addr, connects a
// client socket from newClient to it and accepts it; l is closed.
func listenAndConnect(l int, addr *unix.SockaddrInet4, newClient func() (int, error)) (conn, error) {
	defer unix.Close(l)
	if err := unix.Bind(l, addr); err != nil {
		return conn{}, fmt.Errorf("binding to %v: %w", addr.Addr, err)
	}
	if err := unix.Listen(l, 1); err != nil {
		return conn{}, fmt.Errorf("listening: %w", err)
	}
	sa, err := unix.Getsockname(l)
	if err != nil {
		return conn{}, fmt.Errorf("reading the listener's port: %w", err)
	}
	addr.Port = sa.(*unix.SockaddrInet4).Port
	c, err := newClient()
	if err != nil {
		return conn{}, fmt.Errorf("client socket: %w", err)
	}
	if err := unix.Connect(c, addr); err != nil {
		unix.Close(c)
		return conn{}, fmt.Errorf("connecting: %w", err)
	}
	s, _, err := unix.Accept4(l, unix.SOCK_CLOEXEC)
	if err != nil {
		unix.Close(c)
		return conn{}, fmt.Errorf("accepting: %w", err)
	}
	for _, fd := range []int{c, s} {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
			unix.Close(c)
			unix.Close(s)
			return conn{}, fmt.Errorf("setting TCP_NODELAY: %w", err)
		}
	}
	return conn{client: c, server: s, port: addr.Port}, nil
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

func run(mode string, n, size int, p path) error {
	client, server, port, err := p.connect()
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
	fmt.Printf("path=%s mode=%s size=%d n=%d p50=%.1fus p99=%.1fus rt/s=%.0f cpu/rt client=%.2fus echo=%.2fus\n",
		p.name, mode, size, n,
		float64(rtt[n/2].Nanoseconds())/1e3, float64(rtt[n*99/100].Nanoseconds())/1e3,
		float64(n)/wall.Seconds(),
		float64(clientCPU.Nanoseconds())/1e3/float64(n), float64(echoCPU.Nanoseconds())/1e3/float64(n))
	return nil
}
