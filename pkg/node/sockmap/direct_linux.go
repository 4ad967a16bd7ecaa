package sockmap

import "github.com/cilium/ebpf/asm"

// directRedirect is the verdict's first try for an application's
// socket of a direct pod that has not gone through TCP: the application
// at the other end of the connection, in another direct pod of the
// node, past both stacks. It returns from the program when it
// redirected; it goes on at in_pod when the socket may still take its
// own stack, at tcp when it joined once and no longer can.
//
// A socket joins only when the other end has read all it sent through
// the stacks (the other end's infoRead, published whenever it sends,
// equals its infoSent): what the stacks deliver sits in the other end's
// TCP queue, which its reads take only after the redirect's, so a
// message redirected before that data was read would overtake it. A
// connection's first message leaves before the other end's socket
// exists when the other pod's stack completes the handshake before it
// reaches its application; the connection then joins at the first
// message after the other end answered.
//
// The other end is the socket with the mirrored four-tuple in the
// namespace that owns the remote address (the owners map, filled at ADD
// from the addresses IPAM gave), and only when the sender's own address
// is its own pod's: a pod that gives itself another pod's address, as
// CAP_NET_ADMIN lets it, reaches no socket of that pod's peers. For a
// connection through a Service's cluster IP, whose ends are not each
// other's mirror, the four-tuple is the one the node's conntrack gave
// the service program (the services map), in the namespace that owns
// its address.
func directRedirect(m maps) asm.Instructions {
	return seq(
		asm.Instructions{
			asm.LoadMem(asm.R1, asm.RFP, msgKind, asm.Word),
			asm.JEq.Imm(asm.R1, kindStack, "in_pod"),
			asm.LoadMem(asm.R1, asm.RFP, msgFlags, asm.Word),
			asm.And.Imm(asm.R1, flagDirect),
			asm.JEq.Imm(asm.R1, 0, "no_direct"),
		},
		// The sender's address must be its own pod's.
		lookup(m.owners, msgOwn+keyLIP, "no_direct"),
		asm.Instructions{
			asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
			asm.LoadMem(asm.R2, asm.RFP, msgCookie, asm.DWord),
			asm.JNE.Reg(asm.R1, asm.R2, "no_direct"),
		},
		// The other end's four-tuple: the mirror of this one, or, for a
		// connection the node translated (a Service's cluster IP), what
		// the node's conntrack recorded for it (the services map).
		asm.Instructions{
			asm.LoadMem(asm.R3, asm.RFP, msgCookie, asm.DWord),
		},
		buildKey(asm.R6, skMsgCtx, msgPeer, true, asm.R3, "no_direct", "direct"),
		lookup(m.services, msgOwn+svcKeyOff, "mirror"),
		copyWords(asm.R0, 0, msgPeer+svcKeyOff, svcKeySize),
		// The other end's entry must name this one back: an end's
		// entries go when its pod does, and an address is reused.
		lookup(m.services, msgPeer+svcKeyOff, "no_direct"),
		sameWords(asm.R0, 0, msgOwn+svcKeyOff, svcKeySize, "no_direct"),
		// Its address, another direct pod's.
		at("mirror", lookup(m.owners, msgPeer+keyLIP, "no_direct")...),
		asm.Instructions{
			asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
			asm.LoadMem(asm.R2, asm.RFP, msgCookie, asm.DWord),
			asm.JEq.Reg(asm.R1, asm.R2, "no_direct"),
			asm.StoreMem(asm.RFP, msgPeerNS, asm.R1, asm.DWord),
			asm.StoreMem(asm.RFP, msgPeer+keyCookie, asm.R1, asm.DWord),
		},
		// Still in the redirect, with its word, and not being captured.
		lookup(m.netns, msgPeerNS, "no_direct"),
		asm.Instructions{
			asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
			asm.And.Imm(asm.R1, flagEnabled|flagDirect|flagCapture),
			asm.JNE.Imm(asm.R1, flagEnabled|flagDirect, "no_direct"),
		},
		// Its socket: an application's, still in socks, under the budget.
		lookup(m.info, msgPeer, "no_direct"),
		asm.Instructions{
			asm.StoreMem(asm.RFP, msgPeerInfo, asm.R0, asm.DWord),
			asm.LoadMem(asm.R1, asm.R0, infoKind, asm.Word),
			asm.JEq.Imm(asm.R1, kindStack, "no_direct"),
			asm.LoadMem(asm.R1, asm.R0, infoState, asm.Word),
			asm.JSet.Imm(asm.R1, stateLeft, "no_direct"),
			asm.LoadMem(asm.R1, asm.R0, infoPending, asm.DWord),
			asm.JGT.Imm(asm.R1, Budget, "no_direct"),
			asm.LoadMem(asm.R1, asm.R0, infoRead, asm.DWord),
			asm.LoadMem(asm.R2, asm.R9, infoSent, asm.DWord),
			asm.JNE.Reg(asm.R1, asm.R2, "no_direct"),
			asm.LoadMapPtr(asm.R2, m.socks.FD()),
		},
		redirectToPeer("no_direct"),
		asm.Instructions{
			asm.Mov.Imm(asm.R1, choiceDirect),
			asm.StoreMem(asm.R7, 0, asm.R1, asm.DWord),
		},
		atomicAdd(asm.R8, nsRedirectedOff, 1, asm.DWord),
		atomicAdd(asm.R8, nsDirectOff, 1, asm.DWord),
		asm.Instructions{
			asm.Mov.Imm(asm.R0, skPass),
			asm.Return(),

			// A socket that joined its other end never takes its stack
			// afterwards (the stacks would deliver after what it
			// redirected, which is fine, but TCP does the same with one
			// rule fewer); one that never did may still.
			asm.LoadMem(asm.R1, asm.R7, 0, asm.DWord).WithSymbol("no_direct"),
			asm.JEq.Imm(asm.R1, choiceDirect, "tcp"),
		},
	)
}
