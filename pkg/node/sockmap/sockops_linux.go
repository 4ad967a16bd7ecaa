// SPDX-License-Identifier: Apache-2.0

package sockmap

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
)

// Stack layout of the sock_ops program.
const (
	opsCookie = -8                // the netns cookie, as the namespaces map's key
	opsFlags  = -16               // the pod's flags (u32)
	opsKey    = -16 - keySize     // the socket's key
	opsInfo   = opsKey - infoSize // the socket's info, to write
	opsPeer   = opsInfo - keySize // its peer's key
)

// sockOpsProgram puts the established sockets of enabled namespaces in
// the socket hashes, publishes what each holds unread on its RTT
// callbacks, takes a socket that went back to TCP out of the hashes once
// that is safe, and forgets a socket when it closes.
//
// An application's socket goes in socks, whose verdict redirects what it
// sends. A stack's socket goes in targets, which has no programs: its
// sends keep TCP's own sendmsg (a socket in a hash with an sk_msg verdict
// sends through the sockmap's copy for as long as it is in one), and the
// applications' verdict finds it there. With flagBoth it goes in socks
// too, so that its own writes redirect.
func sockOpsProgram(m maps, l psockLayout) asm.Instructions {
	return seq(
		asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.LoadMem(asm.R2, asm.R6, sockOpsOp, asm.Word),
			asm.JEq.Imm(asm.R2, opRTTCB, "rtt"),
			asm.JEq.Imm(asm.R2, opActiveEstab, "established"),
			asm.JEq.Imm(asm.R2, opPassiveEstab, "established"),
			asm.JEq.Imm(asm.R2, opStateCB, "state"),
			asm.Ja.Label("out"),
		},
		// established: is the namespace enabled, and under its cap?
		at("established", netnsCookie(opsCookie)...),
		lookup(m.netns, opsCookie, "out"),
		asm.Instructions{
			asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
			asm.StoreMem(asm.RFP, opsFlags, asm.R1, asm.Word),
			asm.And.Imm(asm.R1, flagEnabled),
			asm.JEq.Imm(asm.R1, 0, "out"),
		},
		lookup(m.counters, opsCookie, "out"),
		asm.Instructions{
			asm.Mov.Reg(asm.R8, asm.R0),
			asm.LoadMem(asm.R1, asm.R8, nsSocketsOff, asm.Word),
			asm.JLT.Imm(asm.R1, MaxSocketsPerPod, "room"),
		},
		atomicAdd(asm.R8, nsRefusedOff, 1, asm.DWord),
		asm.Instructions{asm.Ja.Label("out")},
		at("room", buildKey(asm.R6, sockOpsCtx, opsKey, false, asm.R9, "out", "ek")...),
		asm.Instructions{
			asm.Mov.Imm(asm.R1, 0),
		},
		zeroStack(opsInfo, infoSize),
		asm.Instructions{
			// Its kind: the stack's relay sockets carry
			// podnet.StackSocketMark.
			asm.LoadMem(asm.R2, asm.R6, sockOpsSk, asm.DWord),
			asm.JEq.Imm(asm.R2, 0, "app"),
			asm.LoadMem(asm.R1, asm.R2, bpfSockMark, asm.Word),
			asm.JNE.Imm(asm.R1, int32(podnet.StackSocketMark), "app"),
			asm.Mov.Imm(asm.R1, kindStack),
			asm.StoreMem(asm.RFP, opsInfo+infoKind, asm.R1, asm.Word),
		},
		sockHashInsert(m.targets, "out"),
		asm.Instructions{
			asm.LoadMem(asm.R1, asm.RFP, opsFlags, asm.Word),
			asm.And.Imm(asm.R1, flagBoth),
			asm.JEq.Imm(asm.R1, 0, "member"),
		},
		// A stack's socket that is not in socks only has no verdict: it
		// is still a target.
		sockHashInsert(m.socks, "member"),
		asm.Instructions{asm.Ja.Label("verdict")},
		at("app", sockHashInsert(m.socks, "out")...),
		asm.Instructions{
			asm.Mov.Imm(asm.R1, stateVerdict).WithSymbol("verdict"),
			asm.StoreMem(asm.RFP, opsInfo+infoState, asm.R1, asm.Word),
			asm.LoadMapPtr(asm.R1, m.info.FD()).WithSymbol("member"),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, opsKey),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, opsInfo),
			asm.Mov.Imm(asm.R4, bpfAny),
			asm.FnMapUpdateElem.Call(),
		},
		atomicAdd(asm.R8, nsSocketsOff, 1, asm.Word),
		asm.Instructions{
			// Told of its close, the socket's bookkeeping goes with it;
			// told of each RTT sample (an ACK of what it sent), it
			// publishes its backlog and checks whether it may leave.
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.Mov.Imm(asm.R2, stateCBFlag|rttCBFlag),
			asm.FnSockOpsCbFlagsSet.Call(),
			asm.Ja.Label("out"),
		},

		// rtt: a member socket's sent data was acknowledged.
		at("rtt", netnsCookie(opsCookie)...),
		buildKey(asm.R6, sockOpsCtx, opsKey, false, asm.R9, "out", "rk"),
		lookup(m.info, opsKey, "out"),
		asm.Instructions{
			asm.Mov.Reg(asm.R7, asm.R0),
			asm.LoadMem(asm.R1, asm.R7, infoState, asm.Word),
			asm.JSet.Imm(asm.R1, stateLeft, "out"),
			// R8: the redirected bytes it holds unread, 0 without a psock
			// (then it is in no hash, and nothing can be queued to it).
			// Published here too, so that a socket without a verdict (a
			// stack's socket in targets only) tells its writers how far
			// behind it is.
			asm.Mov.Imm(asm.R8, 0),
			asm.LoadMem(asm.R1, asm.R6, sockOpsSk, asm.DWord),
			asm.JEq.Imm(asm.R1, 0, "published"),
		},
		psockQueued(l, asm.R8, "published"),
		asm.Instructions{
			asm.StoreMem(asm.R7, infoPending, asm.R8, asm.DWord),

			// It may leave the hashes (and its sends, and reads, go back
			// to TCP's own code) only when leaving loses nothing:
			//
			//  1. Its own sends go through TCP already: it has no
			//     verdict, or its verdict chose TCP, which never changes
			//     back. A socket whose verdict still redirects is what
			//     the redirect is for; leaving would end it.
			asm.LoadMem(asm.R1, asm.R7, infoState, asm.Word).WithSymbol("published"),
			asm.JSet.Imm(asm.R1, stateVerdict, "verdict_choice"),
			asm.Ja.Label("queue_empty"),
			asm.LoadMem(asm.R1, asm.R7, infoChoice, asm.Word).WithSymbol("verdict_choice"),
			asm.JNE.Imm(asm.R1, choiceTCP, "out"),
			//  2. Its redirect queue is empty: leaving the last hash
			//     drops its psock, and dropping a psock purges the
			//     messages queued on it, unread. (Checked under the
			//     socket's lock, which a redirect into it takes to queue.)
			asm.JNE.Imm(asm.R8, 0, "out").WithSymbol("queue_empty"),
			//  3. No application of another pod can redirect into it: an
			//     application's socket of a direct pod stays while it is
			//     open, since its other end's verdict may join it at any
			//     message and that end's choice is not readable here.
			asm.LoadMem(asm.R1, asm.R7, infoKind, asm.Word),
			asm.JEq.Imm(asm.R1, kindStack, "in_pod_peer"),
		},
		lookup(m.netns, opsCookie, "in_pod_peer"),
		asm.Instructions{
			asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
			asm.JSet.Imm(asm.R1, flagDirect, "out"),
			//  4. Its peer can no longer redirect into it.
			asm.LoadMem(asm.R9, asm.RFP, opsCookie, asm.DWord).WithSymbol("in_pod_peer"),
		},
		buildKey(asm.R6, sockOpsCtx, opsPeer, true, asm.R9, "out", "rp"),
		// No peer's info: its peer's verdict, which needs that info, no
		// longer redirects, but one it chose before may still be in
		// flight.
		lookup(m.info, opsPeer, "grace"),
		asm.Instructions{
			//  A peer without a verdict never redirects, and a verdict
			//  never redirects between two sockets of one kind: nothing
			//  can be queued to it, nor be on its way.
			asm.LoadMem(asm.R1, asm.R0, infoState, asm.Word),
			asm.JSet.Imm(asm.R1, stateVerdict, "peer_verdict"),
			asm.Ja.Label("leave"),
			asm.LoadMem(asm.R1, asm.R0, infoKind, asm.Word).WithSymbol("peer_verdict"),
			asm.LoadMem(asm.R2, asm.R7, infoKind, asm.Word),
			asm.JEq.Reg(asm.R1, asm.R2, "leave"),
			//  A peer whose verdict chose TCP starts no new redirect: the
			//  choice never changes back. But a verdict may have chosen
			//  this socket just before, on another thread writing to the
			//  peer: that redirect is queued after the peer's lock is
			//  dropped, and lands later. So the socket leaves only
			//  leaveGrace after it first saw no peer could start one.
			asm.LoadMem(asm.R1, asm.R0, infoChoice, asm.Word),
			asm.JEq.Imm(asm.R1, choiceTCP, "grace"),
			// A peer that may still redirect: wait, and start the grace
			// again from when it stops.
			asm.Mov.Imm(asm.R1, 0),
			asm.StoreMem(asm.R7, infoSince, asm.R1, asm.DWord),
			asm.Ja.Label("out"),

			asm.FnKtimeGetNs.Call().WithSymbol("grace"),
			asm.LoadMem(asm.R1, asm.R7, infoSince, asm.DWord),
			asm.JNE.Imm(asm.R1, 0, "waited"),
			asm.StoreMem(asm.R7, infoSince, asm.R0, asm.DWord),
			asm.Ja.Label("out"),
			asm.Sub.Reg(asm.R0, asm.R1).WithSymbol("waited"),
			asm.JLT.Imm(asm.R0, leaveGrace, "out"),

			// leave: out of both hashes (a psock goes, and the socket's
			// own protocol comes back, only when it is in none), out of
			// the counters, and no more RTT callbacks.
			asm.LoadMapPtr(asm.R1, m.socks.FD()).WithSymbol("leave"),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, opsKey),
			asm.FnMapDeleteElem.Call(),
			asm.LoadMapPtr(asm.R1, m.targets.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, opsKey),
			asm.FnMapDeleteElem.Call(),
			asm.LoadMem(asm.R1, asm.R7, infoState, asm.Word),
			asm.Or.Imm(asm.R1, stateLeft),
			asm.StoreMem(asm.R7, infoState, asm.R1, asm.Word),
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.Mov.Imm(asm.R2, stateCBFlag),
			asm.FnSockOpsCbFlagsSet.Call(),
		},
		lookup(m.counters, opsCookie, "out"),
		atomicAdd(asm.R0, nsSocketsOff, -1, asm.Word),
		asm.Instructions{
			asm.Ja.Label("out"),

			// state: a member socket changed state; at TCP_CLOSE it leaves.
			asm.LoadMem(asm.R2, asm.R6, sockOpsArg1, asm.Word).WithSymbol("state"),
			asm.JNE.Imm(asm.R2, tcpClose, "out"),
		},
		netnsCookie(opsCookie),
		buildKey(asm.R6, sockOpsCtx, opsKey, false, asm.R9, "out", "ck"),
		// A client's socket of a connection through a Service takes its
		// translation with it, both ends' entries, and its pod's charge
		// for it; only from its own pod's address, so that a pod cannot
		// remove another pod's.
		lookup(m.services, opsKey+svcKeyOff, "forget"),
		asm.Instructions{
			asm.LoadMem(asm.R1, asm.R0, svcFlags, asm.Word),
			asm.JNE.Imm(asm.R1, svcClient, "forget"),
		},
		copyWords(asm.R0, 0, opsPeer+svcKeyOff, svcKeySize),
		lookup(m.owners, opsKey+keyLIP, "forget"),
		asm.Instructions{
			asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
			asm.LoadMem(asm.R2, asm.RFP, opsCookie, asm.DWord),
			asm.JNE.Reg(asm.R1, asm.R2, "forget"),
			asm.LoadMapPtr(asm.R1, m.services.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, opsKey+svcKeyOff),
			asm.FnMapDeleteElem.Call(),
			asm.JNE.Imm(asm.R0, 0, "forget"),
			asm.LoadMapPtr(asm.R1, m.services.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, opsPeer+svcKeyOff),
			asm.FnMapDeleteElem.Call(),
		},
		lookup(m.counters, opsCookie, "forget"),
		atomicAdd(asm.R0, nsServicesOff, -1, asm.Word),
		at("forget", lookup(m.info, opsKey, "out")...),
		asm.Instructions{
			// One that left the hashes already left the counters.
			asm.LoadMem(asm.R7, asm.R0, infoState, asm.Word),
			asm.LoadMapPtr(asm.R1, m.info.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, opsKey),
			asm.FnMapDeleteElem.Call(),
			asm.JNE.Imm(asm.R0, 0, "out"),
			asm.JSet.Imm(asm.R7, stateLeft, "out"),
		},
		lookup(m.counters, opsCookie, "out"),
		atomicAdd(asm.R0, nsSocketsOff, -1, asm.Word),
		asm.Instructions{
			asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
			asm.Return(),
		},
	)
}

// zeroStack zeroes size bytes (a multiple of 8) at fp+off; R1 must be 0.
func zeroStack(off, size int16) asm.Instructions {
	var out asm.Instructions
	for i := int16(0); i < size; i += 8 {
		out = append(out, asm.StoreMem(asm.RFP, off+i, asm.R1, asm.DWord))
	}
	return out
}

// sockHashInsert puts the socket of the sock_ops context in R6 in m
// under the key at opsKey, and jumps to fail when it cannot.
func sockHashInsert(m *ebpf.Map, fail string) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, m.FD()),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, opsKey),
		asm.Mov.Imm(asm.R4, bpfNoExist),
		asm.FnSockHashUpdate.Call(),
		asm.JNE.Imm(asm.R0, 0, fail),
	}
}
