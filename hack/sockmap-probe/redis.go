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
)

// cgroup2Root is where the sock_ops program is attached: every process's
// sockets pass it, and it keeps only the probe's /30.
const cgroup2Root = "/sys/fs/cgroup/unified"

// ipv4 in the byte order a context field holds it, read as a
// little-endian u32.
func ctxIPv4(a, b, c, d byte) int32 {
	return int32(uint32(a) | uint32(b)<<8 | uint32(c)<<16 | uint32(d)<<24)
}

// joinAll loads a socket hash keyed by each socket's own address and
// port, a sock_ops program that puts every established TCP socket of the
// probe's two addresses in it, and an sk_msg verdict that redirects each
// send into the receive queue of the socket whose key is the sender's
// peer, across the namespaces. A send whose peer is not (yet) in the hash
// goes through TCP. It returns what detaches and frees them.
func joinAll() (func(), error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.SockHash, KeySize: 16, ValueSize: 4, MaxEntries: 4096})
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
	// The key, on the stack: local address, remote address, local port,
	// remote port, ports in host order. A port that a context holds in
	// network order in its upper half is shifted down and swapped.
	const (
		opsOp, opsRemoteIP4, opsLocalIP4, opsRemotePort, opsLocalPort = 0, 24, 28, 64, 68 // struct bpf_sock_ops
		msgRemoteIP4, msgLocalIP4, msgRemotePort, msgLocalPort        = 20, 24, 60, 64    // struct sk_msg_md
	)
	a := ctxIPv4(10, 251, 77, 1)
	b := ctxIPv4(10, 251, 77, 2)
	ops := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, opsOp, asm.Word),
		asm.JEq.Imm(asm.R2, 4, "established"), // BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB
		asm.JEq.Imm(asm.R2, 5, "established"), // BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB
		asm.Ja.Label("out"),
		asm.LoadMem(asm.R2, asm.R6, opsLocalIP4, asm.Word).WithSymbol("established"),
		asm.JEq.Imm(asm.R2, a, "ours"),
		asm.JEq.Imm(asm.R2, b, "ours"),
		asm.Ja.Label("out"),
		asm.StoreMem(asm.RFP, -16, asm.R2, asm.Word).WithSymbol("ours"),
		asm.LoadMem(asm.R2, asm.R6, opsRemoteIP4, asm.Word),
		asm.StoreMem(asm.RFP, -12, asm.R2, asm.Word),
		asm.LoadMem(asm.R2, asm.R6, opsLocalPort, asm.Word),
		asm.StoreMem(asm.RFP, -8, asm.R2, asm.Word),
		asm.LoadMem(asm.R2, asm.R6, opsRemotePort, asm.Word),
		asm.RSh.Imm(asm.R2, 16),
		asm.HostTo(asm.BE, asm.R2, asm.Half),
		asm.StoreMem(asm.RFP, -4, asm.R2, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, m.FD()),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -16),
		asm.Mov.Imm(asm.R4, 0), // BPF_ANY
		asm.FnSockHashUpdate.Call(),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
		asm.Return(),
	}
	opsProg, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SockOps, Instructions: ops, License: "GPL"})
	if err != nil {
		done()
		return nil, fmt.Errorf("loading sock_ops: %w", err)
	}
	closers = append(closers, func() { opsProg.Close() })
	// The peer's key is the sender's, mirrored.
	verdict := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, msgRemoteIP4, asm.Word),
		asm.StoreMem(asm.RFP, -16, asm.R2, asm.Word),
		asm.LoadMem(asm.R2, asm.R6, msgLocalIP4, asm.Word),
		asm.StoreMem(asm.RFP, -12, asm.R2, asm.Word),
		asm.LoadMem(asm.R2, asm.R6, msgRemotePort, asm.Word),
		asm.RSh.Imm(asm.R2, 16),
		asm.HostTo(asm.BE, asm.R2, asm.Half),
		asm.StoreMem(asm.RFP, -8, asm.R2, asm.Word),
		asm.LoadMem(asm.R2, asm.R6, msgLocalPort, asm.Word),
		asm.StoreMem(asm.RFP, -4, asm.R2, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, m.FD()),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -16),
		asm.Mov.Imm(asm.R4, 1), // BPF_F_INGRESS
		asm.FnMsgRedirectHash.Call(),
		asm.JEq.Imm(asm.R0, 1, "redirected"), // SK_PASS
		asm.Mov.Imm(asm.R0, 1),               // no peer: through TCP
		asm.Return().WithSymbol("redirected"),
	}
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
