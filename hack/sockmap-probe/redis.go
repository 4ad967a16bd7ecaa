package main

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// cgroup2Root is where the sock_ops program is attached: every process's
// sockets pass it, and it keeps only the probe's two namespaces'.
const cgroup2Root = "/sys/fs/cgroup/unified"

// soNetnsCookie is SO_NETNS_COOKIE: the cookie of the namespace a socket
// was made in, the value bpf_get_netns_cookie gives the programs.
const soNetnsCookie = 71

// netnsCookie is the cookie of the named namespace.
func netnsCookie(name string) (uint64, error) {
	var cookie uint64
	err := inNetns(name, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, soNetnsCookie)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("reading the cookie of namespace %s: %w", name, err)
	}
	return cookie, nil
}

// ctxField is a field of a program's context: an IPv4 address, or a port
// in host order or in network order in the field's upper half.
type ctxField struct {
	off      int16
	netUpper bool
}

// storeKey writes the socket hash's key at R10-24 with R6 the context
// and the namespace's cookie in R7: the cookie, two addresses and two
// ports in host order, in the order given. Keyed by the namespace as
// well as the tuple, no socket of another namespace can stand in for
// one of the probe's, whatever addresses it claims.
func storeKey(ip0, ip1, port0, port1 ctxField) asm.Instructions {
	insns := asm.Instructions{asm.StoreMem(asm.RFP, -24, asm.R7, asm.DWord)}
	for i, f := range []ctxField{ip0, ip1, port0, port1} {
		insns = append(insns, asm.LoadMem(asm.R2, asm.R6, f.off, asm.Word))
		if f.netUpper {
			insns = append(insns, asm.RSh.Imm(asm.R2, 16), asm.HostTo(asm.BE, asm.R2, asm.Half))
		}
		insns = append(insns, asm.StoreMem(asm.RFP, int16(-16+4*i), asm.R2, asm.Word))
	}
	return append(insns,
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -24))
}

// joinAll loads a socket hash keyed by each socket's namespace and
// 4-tuple, a sock_ops program that puts every established TCP socket of
// the probe's two namespaces in it, and an sk_msg verdict that redirects
// each send into the receive queue of its peer: the socket of the other
// namespace whose tuple mirrors the sender's. A send whose peer is not
// (yet) in the hash goes through TCP. It returns what detaches and frees
// them.
func joinAll() (func(), error) {
	client, err := netnsCookie(nsClient)
	if err != nil {
		return nil, err
	}
	server, err := netnsCookie(nsServer)
	if err != nil {
		return nil, err
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.SockHash, KeySize: 24, ValueSize: 4, MaxEntries: 4096})
	if err != nil {
		return nil, fmt.Errorf("creating the socket hash: %w", err)
	}
	var closers []func()
	done := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
		m.Close()
	}
	var (
		// struct bpf_sock_ops
		opsOp         int16 = 0
		opsRemoteIP4        = ctxField{off: 24}
		opsLocalIP4         = ctxField{off: 28}
		opsRemotePort       = ctxField{off: 64, netUpper: true}
		opsLocalPort        = ctxField{off: 68}
		// struct sk_msg_md
		msgRemoteIP4  = ctxField{off: 20}
		msgLocalIP4   = ctxField{off: 24}
		msgRemotePort = ctxField{off: 60, netUpper: true}
		msgLocalPort  = ctxField{off: 64}
	)
	ops := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, opsOp, asm.Word),
		asm.JEq.Imm(asm.R2, 4, "established"), // BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB
		asm.JEq.Imm(asm.R2, 5, "established"), // BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB
		asm.Ja.Label("out"),
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("established"),
		asm.FnGetNetnsCookie.Call(),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.LoadImm(asm.R2, int64(client), asm.DWord),
		asm.JEq.Reg(asm.R7, asm.R2, "ours"),
		asm.LoadImm(asm.R2, int64(server), asm.DWord),
		asm.JEq.Reg(asm.R7, asm.R2, "ours"),
		asm.Ja.Label("out"),
	}
	key := storeKey(opsLocalIP4, opsRemoteIP4, opsLocalPort, opsRemotePort)
	key[0] = key[0].WithSymbol("ours")
	ops = append(ops, key...)
	ops = append(ops,
		asm.LoadMapPtr(asm.R2, m.FD()),
		asm.Mov.Imm(asm.R4, 0), // BPF_ANY
		asm.FnSockHashUpdate.Call(),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
		asm.Return(),
	)
	opsProg, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SockOps, Instructions: ops, License: "GPL"})
	if err != nil {
		done()
		return nil, fmt.Errorf("loading sock_ops: %w", err)
	}
	closers = append(closers, func() { opsProg.Close() })
	// The peer's key: the other namespace's cookie and the sender's tuple
	// mirrored. Only the probe's sockets are in the hash, so the sender
	// is one of the two namespaces'.
	verdict := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.FnGetNetnsCookie.Call(),
		asm.LoadImm(asm.R7, int64(server), asm.DWord),
		asm.LoadImm(asm.R2, int64(client), asm.DWord),
		asm.JEq.Reg(asm.R0, asm.R2, "peer"),
		asm.Mov.Reg(asm.R7, asm.R2),
	}
	key = storeKey(msgRemoteIP4, msgLocalIP4, msgRemotePort, msgLocalPort)
	key[0] = key[0].WithSymbol("peer")
	verdict = append(verdict, key...)
	verdict = append(verdict,
		asm.LoadMapPtr(asm.R2, m.FD()),
		asm.Mov.Imm(asm.R4, 1), // BPF_F_INGRESS
		asm.FnMsgRedirectHash.Call(),
		asm.JEq.Imm(asm.R0, 1, "redirected"), // SK_PASS
		asm.Mov.Imm(asm.R0, 1),               // no peer: through TCP
		asm.Return().WithSymbol("redirected"),
	)
	msgProg, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SkMsg, Instructions: verdict, License: "GPL"})
	if err != nil {
		done()
		return nil, fmt.Errorf("loading sk_msg: %w", err)
	}
	closers = append(closers, func() { msgProg.Close() })
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: m.FD(), Program: msgProg, Attach: ebpf.AttachSkMsgVerdict}); err != nil {
		done()
		return nil, fmt.Errorf("attaching sk_msg: %w", err)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup2Root, Attach: ebpf.AttachCGroupSockOps, Program: opsProg})
	if err != nil {
		done()
		return nil, fmt.Errorf("attaching sock_ops to %s: %w", cgroup2Root, err)
	}
	closers = append(closers, func() { l.Close() })
	return done, nil
}

var rpsLine = regexp.MustCompile(`(SET|GET): ([\d.]+) requests per second`)

// redisRound runs redis-server in the server namespace and
// redis-benchmark in the client namespace against it, the two
// applications' sockets joined (sockmap) or not (tcp).
func redisRound(mode string, n int) error {
	if mode == "sockmap" {
		done, err := joinAll()
		if err != nil {
			return err
		}
		defer done()
	}
	srv := exec.Command("ip", "netns", "exec", nsServer, "redis-server", "--bind", addrServer,
		"--port", "6379", "--save", "", "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no")
	if err := srv.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	ready := false
	for i := 0; i < 100 && !ready; i++ {
		time.Sleep(50 * time.Millisecond)
		ready = exec.Command("ip", "netns", "exec", nsClient, "redis-cli", "-h", addrServer, "ping").Run() == nil
	}
	if !ready {
		return fmt.Errorf("redis-server in %s did not answer", nsServer)
	}
	out, err := exec.Command("ip", "netns", "exec", nsClient, "redis-benchmark", "-h", addrServer,
		"-n", strconv.Itoa(n), "-c", "50", "-t", "set,get", "-q").CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-benchmark: %v: %s", err, out)
	}
	rps := map[string]string{}
	for _, m := range rpsLine.FindAllStringSubmatch(string(out), -1) {
		rps[m[1]] = m[2]
	}
	fmt.Printf("path=two-netns mode=%s redis SET=%s GET=%s rps (n=%d, 50 connections)\n", mode, rps["SET"], rps["GET"], n)
	return nil
}
