package sockmap

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// Budget is how many redirected bytes a socket may hold unread before the
// sockets that send to it go through TCP: what a request or a response
// needs, far below what a reader that does not read would otherwise pile
// up.
const Budget = 1 << 20

// MaxSocketsPerPod bounds the sockets one pod namespace puts in the
// node's socket hashes, so that a pod opening connections without end
// takes only its own sockets off the redirect, never another pod's.
const MaxSocketsPerPod = 8192

// maxSockets is each socket hash's size: room for many pods at their cap.
const maxSockets = 65536

// leaveGrace is how long a socket waits, once no peer can start a new
// redirect into it, before it leaves the socket hashes: a redirect that
// a peer's verdict chose before the peer went through TCP lands in the
// socket's queue after the peer's lock is dropped, on a thread that may
// be preempted or throttled meanwhile, and leaving drops whatever lands
// later. It is far above a scheduling delay and far below a connection's
// life.
const leaveGrace = 1_000_000_000 // ns

// maxPods is how many pod namespaces the namespaces map holds.
const maxPods = 4096

// The namespaces map holds a pod's flags (a u32, written only by the
// node's commands); the counters map its counters (written only by the
// programs), so that neither overwrites the other's writes.
const (
	nsSocketsOff    = 0  // u32: sockets in the hashes
	nsRedirectedOff = 8  // u64: messages redirected
	nsFallbacksOff  = 16 // u64: sockets that went (back) through TCP
	nsRefusedOff    = 24 // u64: sockets left out at the pod's cap
	nsDirectOff     = 32 // u64: messages redirected to another pod's application
	countersSize    = 40
)

const (
	flagEnabled = 1
	flagCapture = 2
	// flagBoth redirects the stack's writes to the pod's applications
	// too: the pod says its applications never read with splice.
	flagBoth = 4
	// flagDirect joins the pod's connections with another pod of the
	// node that says so too, application socket to application socket.
	flagDirect = 8
)

// maxOwners is how many pod addresses the owners map holds: two
// families for each pod the namespaces map holds.
const maxOwners = 2 * maxPods

// A socket's info in the info map, which programs read by key (a
// program cannot read another socket's socket storage): the redirected
// bytes it holds unread, its kind, whether it has a verdict, its choice,
// and since when it could leave the hashes.
const (
	infoPending = 0  // u64
	infoKind    = 8  // u32: kindStack, or 0 for an application's socket
	infoState   = 12 // u32: stateVerdict, stateLeft
	infoChoice  = 16 // u32: choiceTCP once its verdict chose TCP (mirrors its socket storage)
	infoSince   = 24 // u64: ktime when no peer could start a redirect into it, or 0
	// infoSent: what an application's socket of a direct pod redirected
	// to its own stack; infoRead: what it has read of what its own stack
	// wrote to it (through TCP), published when it sends. A socket joins
	// its other end only when the other end has read all it sent
	// through the stacks, so that nothing it redirects overtakes it.
	infoSent  = 32 // u64
	infoRead  = 40 // u64
	infoSize  = 48
	kindStack = 1
	// stateVerdict: the socket is in the socks hash, so its sends go
	// through the verdict and may redirect; without it, it never does.
	stateVerdict = 1
	// stateLeft: the socket left the hashes; the counters no longer
	// hold it.
	stateLeft = 2
)

// A socket's choice, in its socket storage.
const (
	choiceNone     = 0
	choiceRedirect = 1
	choiceTCP      = 2
	// choiceDirect: its messages go to the application at the other end
	// of its connection, in another pod, past both stacks.
	choiceDirect = 3
)

// The socket hash's key: the namespace's cookie, a zero word, the local
// and remote ports in host order and the local and remote addresses as
// IPv6 (buildKey). A peer's key is its partner's with local and
// remote swapped.
const (
	keyCookie = 0
	keyFamily = 8
	keyLPort  = 12
	keyRPort  = 16
	keyPad    = 20
	keyLIP    = 24
	keyRIP    = 40
	keySize   = 56
)

// Context offsets (uapi: struct bpf_sock_ops and struct sk_msg_md).
type ctxFields struct {
	family, remoteIP4, localIP4, remoteIP6, localIP6, remotePort, localPort int16
}

var (
	sockOpsCtx = ctxFields{family: 20, remoteIP4: 24, localIP4: 28, remoteIP6: 32, localIP6: 48, remotePort: 64, localPort: 68}
	skMsgCtx   = ctxFields{family: 16, remoteIP4: 20, localIP4: 24, remoteIP6: 28, localIP6: 44, remotePort: 60, localPort: 64}
)

const (
	sockOpsOp       = 0   // bpf_sock_ops.op
	sockOpsArg1     = 8   // bpf_sock_ops.args[1]: the new state in STATE_CB
	sockOpsSk       = 184 // bpf_sock_ops.sk
	bpfSockMark     = 16  // bpf_sock.mark
	skMsgSize       = 68  // sk_msg_md.size
	skMsgSk         = 72  // sk_msg_md.sk
	bpfFIngress     = 1
	bpfNoExist      = 1
	bpfAny          = 0
	storageCreate   = 1  // BPF_SK_STORAGE_GET_F_CREATE
	skPass          = 1  // SK_PASS
	stateCBFlag     = 4  // BPF_SOCK_OPS_STATE_CB_FLAG
	rttCBFlag       = 8  // BPF_SOCK_OPS_RTT_CB_FLAG
	opActiveEstab   = 4  // BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB
	opPassiveEstab  = 5  // BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB
	opStateCB       = 10 // BPF_SOCK_OPS_STATE_CB
	opRTTCB         = 12 // BPF_SOCK_OPS_RTT_CB
	tcpClose        = 7  // BPF_TCP_CLOSE
	userDataPtrMask = -8 // SK_USER_DATA_PTRMASK: the low bits are flags
)

// buildKey writes the key of the socket ctx describes at the stack
// offset base, or its peer's (swap). Addresses are IPv6, an IPv4 one
// mapped (::ffff:a.b.c.d), as a dual-stack socket sees an IPv4 peer: the
// two ends of one connection then agree on it whatever their families.
// It clobbers R1 and R2 and jumps to skip for a family that is neither.
func buildKey(ctx asm.Register, f ctxFields, base int16, swap bool, cookie asm.Register, skip, prefix string) asm.Instructions {
	lp, rp := base+keyLPort, base+keyRPort
	lip, rip := base+keyLIP, base+keyRIP
	if swap {
		lp, rp = rp, lp
		lip, rip = rip, lip
	}
	v6 := prefix + "_v6"
	done := prefix + "_done"
	insns := asm.Instructions{
		asm.StoreMem(asm.RFP, base+keyCookie, cookie, asm.DWord),
		asm.Mov.Imm(asm.R2, 0),
		asm.StoreMem(asm.RFP, base+keyFamily, asm.R2, asm.Word),
		asm.StoreMem(asm.RFP, base+keyPad, asm.R2, asm.Word),
		asm.LoadMem(asm.R2, ctx, f.localPort, asm.Word),
		asm.StoreMem(asm.RFP, lp, asm.R2, asm.Word),
		// remote_port holds the port in network order in its upper half.
		asm.LoadMem(asm.R2, ctx, f.remotePort, asm.Word),
		asm.HostTo(asm.BE, asm.R2, asm.Word),
		asm.StoreMem(asm.RFP, rp, asm.R2, asm.Word),
		asm.LoadMem(asm.R1, ctx, f.family, asm.Word),
		asm.JEq.Imm(asm.R1, unix.AF_INET6, v6),
		asm.JNE.Imm(asm.R1, unix.AF_INET, skip),
		asm.Mov.Imm(asm.R2, 0),
		asm.StoreMem(asm.RFP, lip, asm.R2, asm.Word),
		asm.StoreMem(asm.RFP, lip+4, asm.R2, asm.Word),
		asm.StoreMem(asm.RFP, rip, asm.R2, asm.Word),
		asm.StoreMem(asm.RFP, rip+4, asm.R2, asm.Word),
		asm.Mov.Imm32(asm.R2, v4MappedWord),
		asm.StoreMem(asm.RFP, lip+8, asm.R2, asm.Word),
		asm.StoreMem(asm.RFP, rip+8, asm.R2, asm.Word),
		asm.LoadMem(asm.R2, ctx, f.localIP4, asm.Word),
		asm.StoreMem(asm.RFP, lip+12, asm.R2, asm.Word),
		asm.LoadMem(asm.R2, ctx, f.remoteIP4, asm.Word),
		asm.StoreMem(asm.RFP, rip+12, asm.R2, asm.Word),
		asm.Ja.Label(done),
	}
	for i, off := range []int16{0, 4, 8, 12} {
		l := asm.LoadMem(asm.R2, ctx, f.localIP6+off, asm.Word)
		if i == 0 {
			l = l.WithSymbol(v6)
		}
		insns = append(insns, l,
			asm.StoreMem(asm.RFP, lip+off, asm.R2, asm.Word),
			asm.LoadMem(asm.R2, ctx, f.remoteIP6+off, asm.Word),
			asm.StoreMem(asm.RFP, rip+off, asm.R2, asm.Word))
	}
	return append(insns, asm.Mov.Imm(asm.R2, 0).WithSymbol(done))
}

// v4MappedWord is the third word of an IPv4-mapped IPv6 address
// (bytes 00 00 ff ff) as a little-endian register stores it.
const v4MappedWord = -0x10000 // 0xffff0000

// copyWords copies size bytes (a multiple of 4) from src+off to fp+dst
// (clobbers R1).
func copyWords(src asm.Register, off, dst, size int16) asm.Instructions {
	var out asm.Instructions
	for i := int16(0); i < size; i += 4 {
		out = append(out,
			asm.LoadMem(asm.R1, src, off+i, asm.Word),
			asm.StoreMem(asm.RFP, dst+i, asm.R1, asm.Word))
	}
	return out
}

// sameWords jumps to differ when the size bytes (a multiple of 4) at
// src+off are not those at fp+at (clobbers R1 and R2).
func sameWords(src asm.Register, off, at, size int16, differ string) asm.Instructions {
	var out asm.Instructions
	for i := int16(0); i < size; i += 4 {
		out = append(out,
			asm.LoadMem(asm.R1, src, off+i, asm.Word),
			asm.LoadMem(asm.R2, asm.RFP, at+i, asm.Word),
			asm.JNE.Reg(asm.R1, asm.R2, differ))
	}
	return out
}

// xaddAt adds src to the u64 at ptr+off.
func xaddAt(ptr asm.Register, off int16, src asm.Register) asm.Instruction {
	add := asm.StoreXAdd(ptr, src, asm.DWord)
	add.Offset = off
	return add
}

// atomicAdd adds imm to the u64 or u32 at ptr+off (clobbers R1).
func atomicAdd(ptr asm.Register, off int16, imm int32, size asm.Size) asm.Instructions {
	add := asm.StoreXAdd(ptr, asm.R1, size)
	add.Offset = off
	return asm.Instructions{asm.Mov.Imm(asm.R1, imm), add}
}

// maps are the node's maps the programs use.
type maps struct {
	socks    *ebpf.Map // SOCKHASH with the verdict: key → a socket that may redirect
	targets  *ebpf.Map // SOCKHASH without programs: key → a stack's socket, to redirect to
	info     *ebpf.Map // LRU_HASH: key → the socket's info
	netns    *ebpf.Map // HASH: netns cookie → u32 flags
	counters *ebpf.Map // HASH: netns cookie → the pod's counters
	choice   *ebpf.Map // SK_STORAGE: a socket's choice
	owners   *ebpf.Map // HASH: a direct pod's address (IPv6, IPv4 mapped) → its netns cookie
	services *ebpf.Map // HASH: a translated connection's end's four-tuple → the other end's
}

// seq joins pieces of a program.
func seq(parts ...asm.Instructions) asm.Instructions {
	var out asm.Instructions
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// at gives insns' first instruction the label sym.
func at(sym string, insns ...asm.Instruction) asm.Instructions {
	insns[0] = insns[0].WithSymbol(sym)
	return insns
}

// lookup looks the key at fp+key up in m and jumps to miss when it is
// not there; R0 then points at the value.
func lookup(m *ebpf.Map, key int16, miss string) asm.Instructions {
	return asm.Instructions{
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, int32(key)),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, miss),
	}
}

// netnsCookie puts the cookie of the namespace of the context in R6 in
// R9 and at fp+off.
func netnsCookie(off int16) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.FnGetNetnsCookie.Call(),
		asm.Mov.Reg(asm.R9, asm.R0),
		asm.StoreMem(asm.RFP, off, asm.R9, asm.DWord),
	}
}

// psockQueued reads the redirected bytes queued unread on the socket in
// R1 (not null) into dst, through BTF: sock.sk_user_data points at the
// socket's sk_psock (its low bits are flags), whose msg_tot_len counts
// them. It jumps to none when the socket is not a TCP one or has no
// psock. It clobbers R0 to R5.
func psockQueued(l psockLayout, dst asm.Register, none string) asm.Instructions {
	return asm.Instructions{
		asm.FnSkcToTcpSock.Call(),
		asm.JEq.Imm(asm.R0, 0, none),
		asm.LoadMem(asm.R1, asm.R0, l.userDataOff, asm.DWord),
		asm.And.Imm(asm.R1, userDataPtrMask),
		asm.JEq.Imm(asm.R1, 0, none),
		asm.Mov.Imm(asm.R2, l.psockTypeID),
		kfuncCall(l.castID),
		asm.LoadMem(dst, asm.R0, l.msgTotLenOff, asm.Word),
	}
}

// kfuncCall calls the kernel function whose BTF ID is id (vmlinux's).
func kfuncCall(id int64) asm.Instruction {
	return asm.Instruction{OpCode: asm.Call.Op(asm.ImmSource), Src: asm.PseudoKfuncCall, Constant: id}
}

// Stack layout of the sk_msg program.
const (
	msgCookie   = -8
	msgFlags    = -16                // the pod's flags (u32)
	msgKind     = -12                // the sender's kind (u32)
	msgOwn      = msgFlags - keySize // the sender's key
	msgPeer     = msgOwn - keySize   // its peer's
	msgPeerInfo = msgPeer - 8        // its peer's info (a spilled pointer)
	msgPeerNS   = msgPeerInfo - 8    // the netns cookie of the pod at the other end
)

// psockLayout is where the programs find a socket's unread redirected
// bytes: sock.sk_user_data points at the socket's sk_psock, whose
// msg_tot_len counts them. Offsets and the type's BTF ID come from the
// running kernel's BTF; castID is the bpf_rdonly_cast kfunc's.
type psockLayout struct {
	userDataOff  int16
	msgTotLenOff int16
	psockTypeID  int32
	castID       int64
	// tcp_sock's bytes_received (u64), rcv_nxt and copied_seq (u32):
	// what a socket has read of its TCP stream.
	bytesReceivedOff, rcvNxtOff, copiedSeqOff int16
}

// tcpRead puts what the socket of the sk_msg context in R6 has read of
// its TCP stream (bytes_received less what waits unread: rcv_nxt -
// copied_seq) in dst, and jumps to none when it is not a TCP socket. It
// clobbers R0 to R5. The verdict runs under the socket's lock, where
// neither moves.
func tcpRead(l psockLayout, dst asm.Register, none string) asm.Instructions {
	return asm.Instructions{
		asm.LoadMem(asm.R1, asm.R6, skMsgSk, asm.DWord),
		asm.FnSkcToTcpSock.Call(),
		asm.JEq.Imm(asm.R0, 0, none),
		asm.LoadMem(dst, asm.R0, l.bytesReceivedOff, asm.DWord),
		asm.LoadMem(asm.R2, asm.R0, l.rcvNxtOff, asm.Word),
		asm.LoadMem(asm.R3, asm.R0, l.copiedSeqOff, asm.Word),
		asm.Sub.Reg32(asm.R2, asm.R3),
		asm.Sub.Reg(dst, asm.R2),
	}
}

// skMsgProgram is the verdict on each message a socket in socks sends:
// an application's, and with flagBoth a stack's.
func skMsgProgram(m maps, l psockLayout) asm.Instructions {
	return seq(
		asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			// R7: the sender's choice, in its socket storage.
			asm.LoadMapPtr(asm.R1, m.choice.FD()),
			asm.LoadMem(asm.R2, asm.R6, skMsgSk, asm.DWord),
			asm.Mov.Imm(asm.R3, 0),
			asm.Mov.Imm(asm.R4, storageCreate),
			asm.FnSkStorageGet.Call(),
			asm.JEq.Imm(asm.R0, 0, "pass"),
			asm.Mov.Reg(asm.R7, asm.R0),
			// R8: the pod's counters; the pod's flags on the stack. The
			// namespace gone (disabled): TCP from now on.
			asm.Mov.Imm(asm.R8, 0),
		},
		netnsCookie(msgCookie),
		asm.Instructions{
			// R9: the sender's info, once found.
			asm.Mov.Imm(asm.R9, 0),
		},
		lookup(m.netns, msgCookie, "tcp"),
		asm.Instructions{
			asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
			asm.StoreMem(asm.RFP, msgFlags, asm.R1, asm.Word),
		},
		lookup(m.counters, msgCookie, "tcp"),
		asm.Instructions{
			asm.Mov.Reg(asm.R8, asm.R0),
			asm.LoadMem(asm.R3, asm.RFP, msgCookie, asm.DWord),
		},
		buildKey(asm.R6, skMsgCtx, msgOwn, false, asm.R3, "tcp", "own"),
		// None (left out at the pod's cap): TCP.
		lookup(m.info, msgOwn, "tcp"),
		asm.Instructions{
			asm.Mov.Reg(asm.R9, asm.R0),
			asm.LoadMem(asm.R1, asm.R9, infoKind, asm.Word),
			asm.StoreMem(asm.RFP, msgKind, asm.R1, asm.Word),
			// A socket others redirect to publishes what it holds unread
			// whenever it sends (and on its RTT callbacks): their estimate
			// of it starts again from the truth. Others redirect to the
			// stack's sockets, with flagBoth to the applications' too,
			// and with flagDirect to the applications' from another pod.
			asm.JEq.Imm(asm.R1, kindStack, "publish"),
			asm.LoadMem(asm.R1, asm.RFP, msgFlags, asm.Word),
			asm.And.Imm(asm.R1, flagBoth|flagDirect),
			asm.JEq.Imm(asm.R1, 0, "decide"),
			asm.LoadMem(asm.R1, asm.R6, skMsgSk, asm.DWord).WithSymbol("publish"),
		},
		psockQueued(l, asm.R1, "decide"),
		asm.Instructions{
			asm.StoreMem(asm.R9, infoPending, asm.R1, asm.DWord),
			// An application of a direct pod publishes what it has read
			// from its stack too, for its other end's join.
			asm.LoadMem(asm.R1, asm.RFP, msgKind, asm.Word),
			asm.JEq.Imm(asm.R1, kindStack, "decide"),
			asm.LoadMem(asm.R1, asm.RFP, msgFlags, asm.Word),
			asm.And.Imm(asm.R1, flagDirect),
			asm.JEq.Imm(asm.R1, 0, "decide"),
		},
		tcpRead(l, asm.R1, "decide"),
		asm.Instructions{
			asm.StoreMem(asm.R9, infoRead, asm.R1, asm.DWord),

			// A stack's socket has a verdict only when the pod said its
			// applications never read with splice (which does not see a
			// redirect's queue); a pod that no longer says so gets TCP.
			asm.LoadMem(asm.R1, asm.RFP, msgKind, asm.Word).WithSymbol("decide"),
			asm.JNE.Imm(asm.R1, kindStack, "redirectable"),
			asm.LoadMem(asm.R1, asm.RFP, msgFlags, asm.Word),
			asm.And.Imm(asm.R1, flagBoth),
			asm.JEq.Imm(asm.R1, 0, "tcp"),

			asm.LoadMem(asm.R1, asm.R7, 0, asm.DWord).WithSymbol("redirectable"),
			asm.JEq.Imm(asm.R1, choiceTCP, "pass"),
			asm.LoadMem(asm.R1, asm.RFP, msgFlags, asm.Word),
			asm.And.Imm(asm.R1, flagCapture),
			asm.JNE.Imm(asm.R1, 0, "tcp"),
		},
		directRedirect(m),
		asm.Instructions{
			asm.LoadMem(asm.R3, asm.RFP, msgCookie, asm.DWord).WithSymbol("in_pod"),
		},
		// The peer's key only now: most messages (those of sockets on
		// TCP) never need it.
		buildKey(asm.R6, skMsgCtx, msgPeer, true, asm.R3, "tcp", "peer"),
		// The peer's info. No peer in the hashes (it is not in this
		// namespace, or was left out), or one of the sender's kind (two
		// applications, which either may read with splice): TCP.
		lookup(m.info, msgPeer, "tcp"),
		asm.Instructions{
			asm.StoreMem(asm.RFP, msgPeerInfo, asm.R0, asm.DWord),
			asm.LoadMem(asm.R1, asm.R0, infoKind, asm.Word),
			asm.LoadMem(asm.R2, asm.RFP, msgKind, asm.Word),
			asm.JEq.Reg(asm.R1, asm.R2, "tcp"),
			asm.LoadMem(asm.R1, asm.R0, infoPending, asm.DWord),
			asm.JGT.Imm(asm.R1, Budget, "tcp"),
			// An application redirects to the stack's socket in targets;
			// the stack (flagBoth) to the application's in socks.
			asm.LoadMapPtr(asm.R2, m.targets.FD()),
			asm.LoadMem(asm.R1, asm.RFP, msgKind, asm.Word),
			asm.JNE.Imm(asm.R1, kindStack, "redirect"),
			asm.LoadMapPtr(asm.R2, m.socks.FD()),
		},
		// Not in the hash (it left it, or is leaving): TCP.
		at("redirect", redirectToPeer("tcp")...),
		asm.Instructions{
			// What it sent through the stacks (R1, the message's size),
			// for its own join later (R9, its info, is set on every path
			// here).
			xaddAt(asm.R9, infoSent, asm.R1),
			asm.Mov.Imm(asm.R1, choiceRedirect),
			asm.StoreMem(asm.R7, 0, asm.R1, asm.DWord),
		},
		atomicAdd(asm.R8, nsRedirectedOff, 1, asm.DWord),
		asm.Instructions{
			asm.Mov.Imm(asm.R0, skPass),
			asm.Return(),

			// tcp: this socket sends through TCP from now on; counted
			// once. Its info says so too, for its peer's and its own
			// sock_ops callbacks, which decide when it may leave the
			// hashes.
			asm.JEq.Imm(asm.R9, 0, "tcp_storage").WithSymbol("tcp"),
			asm.Mov.Imm(asm.R1, choiceTCP),
			asm.StoreMem(asm.R9, infoChoice, asm.R1, asm.Word),
			asm.LoadMem(asm.R1, asm.R7, 0, asm.DWord).WithSymbol("tcp_storage"),
			asm.JEq.Imm(asm.R1, choiceTCP, "pass"),
			asm.Mov.Imm(asm.R1, choiceTCP),
			asm.StoreMem(asm.R7, 0, asm.R1, asm.DWord),
			asm.JEq.Imm(asm.R8, 0, "pass"),
		},
		atomicAdd(asm.R8, nsFallbacksOff, 1, asm.DWord),
		asm.Instructions{
			asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass"),
			asm.Return(),
		},
	)
}

// redirectToPeer redirects the message of the sk_msg context in R6 to
// the socket keyed at msgPeer in the hash in R2, into its receive queue,
// and adds the message's size to that peer's unread count (its info at
// msgPeerInfo) until the peer publishes its backlog again. It jumps to
// fail when the peer is not in the hash; on success R1 holds the size.
func redirectToPeer(fail string) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, msgPeer),
		asm.Mov.Imm(asm.R4, bpfFIngress),
		asm.FnMsgRedirectHash.Call(),
		asm.JNE.Imm(asm.R0, skPass, fail),
		asm.LoadMem(asm.R2, asm.RFP, msgPeerInfo, asm.DWord),
		asm.LoadMem(asm.R1, asm.R6, skMsgSize, asm.Word),
		asm.StoreXAdd(asm.R2, asm.R1, asm.DWord),
	}
}

func programSpec(name string, typ ebpf.ProgramType, insns asm.Instructions) *ebpf.ProgramSpec {
	return &ebpf.ProgramSpec{Name: name, Type: typ, Instructions: insns, License: "GPL"}
}

func errLoading(what string, err error) error {
	return fmt.Errorf("loading the %s program: %w", what, err)
}
