package sockmap

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A connection from a direct pod to a Service's cluster IP reaches the
// other pod translated by the node (kube-proxy's DNAT): the client's
// socket is A:e → VIP:p, the server's B:q ← A:e, and neither is the
// other's mirror. The service program, on the node's end of each direct
// pod's link (tc egress, after the node's netfilter), reads the
// translation of each SYN into the pod from the node's conntrack, the
// packet's own nf_conn, and writes it for both ends to the services map:
// under each end's four-tuple, the other end's. The verdict then finds
// the other end through it. Only the node's conntrack writes it, so a
// pod cannot point another pod's connection elsewhere.
//
// The services map's key is a socket's four-tuple as it stands in the
// socket key after the cookie and family (svcKeyOff on, svcKeySize
// bytes); its value the other end's, then svcFlags.
const (
	svcKeyOff   = keyLPort
	svcKeySize  = keySize - keyLPort // 44
	svcFlags    = svcKeySize         // u32
	svcValSize  = svcKeySize + 4     // 48
	svcClient   = 1                  // the entry of the client's socket, which its pod is charged for
	maxServices = 2 * maxSockets
)

// nsServicesOff counts a pod's translations (one per connection it
// opened to a Service whose backend is a direct pod), in the u32 after
// the socket count; a pod at MaxSocketsPerPod gets no more, so that one
// cannot fill the map for the others.
const nsServicesOff = 4

// Offsets in a tail of the key (from svcKeyOff).
const (
	tailLPort = keyLPort - svcKeyOff
	tailRPort = keyRPort - svcKeyOff
	tailLIP   = keyLIP - svcKeyOff
	tailRIP   = keyRIP - svcKeyOff
)

// Stack layout of the service program: the value of the client's entry
// (the server's four-tuple, flagged) and of the server's (the client's
// four-tuple), whose first svcKeySize bytes are each the other's key.
const (
	svcServerTail = -svcValSize                // the server's four-tuple: the client entry's value, the server entry's key
	svcClientTail = svcServerTail - svcValSize // the client's four-tuple: the server entry's value, the client entry's key
	svcCookie     = svcClientTail - 8
)

// __sk_buff offsets, and what a packet's headers hold where (on a veth:
// Ethernet, then IPv4 without options or IPv6 without extension
// headers, then TCP).
const (
	skbData     = 76
	skbDataEnd  = 80
	ethLen      = 14
	ethProtoOff = 12
	ip4Len      = 20
	ip6Len      = 40
	tcpFlagsOff = 13
	tcpSYN      = 0x02
	tcpACK      = 0x10
	tcActUnspec = -1 // the next filter, or the packet's way on: the program only reads
	nfctPtrMask = -8 // NFCT_PTRMASK: the low bits are the ctinfo
)

// serviceProgram reads the translation of a SYN towards a direct pod
// from its nf_conn and records it for both ends. It does so only for a
// translation of the destination alone (a DNAT, as kube-proxy's; a
// connection the node also SNATs reaches the pod from the node, not from
// the client), only when the client is a direct pod of the node (the
// owners map), and, for that pod, up to MaxSocketsPerPod connections.
func serviceProgram(m maps, l ctLayout, p psockLayout) asm.Instructions {
	ct, srv := int16(svcClientTail), int16(svcServerTail)
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R7, asm.R6, skbData, asm.Word),
		asm.LoadMem(asm.R8, asm.R6, skbDataEnd, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.Add.Imm(asm.R1, ethLen+ip4Len+20),
		asm.JGT.Reg(asm.R1, asm.R8, "pass"),
		asm.LoadMem(asm.R1, asm.R7, ethProtoOff, asm.Half),
		asm.HostTo(asm.BE, asm.R1, asm.Half),
		asm.JEq.Imm(asm.R1, unix.ETH_P_IPV6, "v6"),
		asm.JNE.Imm(asm.R1, unix.ETH_P_IP, "pass"),

		// IPv4 without options, TCP, a SYN alone.
		asm.LoadMem(asm.R1, asm.R7, ethLen, asm.Byte),
		asm.JNE.Imm(asm.R1, 0x45, "pass"),
	}
	insns = append(insns, tcpSYNAlone(ethLen+9, ethLen+ip4Len, unix.AF_INET)...)
	// Addresses as the socket keys hold them: IPv4 mapped.
	insns = append(insns, asm.Mov.Imm(asm.R1, 0))
	for _, base := range []int16{ct + tailLIP, ct + tailRIP, srv + tailLIP, srv + tailRIP} {
		insns = append(insns,
			asm.StoreMem(asm.RFP, base, asm.R1, asm.Word),
			asm.StoreMem(asm.RFP, base+4, asm.R1, asm.Word))
	}
	insns = append(insns, asm.Mov.Imm32(asm.R1, v4MappedWord))
	for _, base := range []int16{ct + tailLIP, ct + tailRIP, srv + tailLIP, srv + tailRIP} {
		insns = append(insns, asm.StoreMem(asm.RFP, base+8, asm.R1, asm.Word))
	}
	insns = append(insns,
		// The client's address (the source) and the server's (the
		// destination, translated).
		asm.LoadMem(asm.R1, asm.R7, ethLen+12, asm.Word),
		asm.StoreMem(asm.RFP, ct+tailLIP+12, asm.R1, asm.Word),
		asm.StoreMem(asm.RFP, srv+tailRIP+12, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R7, ethLen+16, asm.Word),
		asm.StoreMem(asm.RFP, srv+tailLIP+12, asm.R1, asm.Word),
	)
	insns = append(insns, ports(ethLen+ip4Len)...)
	insns = append(insns,
		asm.Ja.Label("ct"),

		// IPv6 without extension headers, TCP, a SYN alone.
		asm.Mov.Reg(asm.R1, asm.R7).WithSymbol("v6"),
		asm.Add.Imm(asm.R1, ethLen+ip6Len+20),
		asm.JGT.Reg(asm.R1, asm.R8, "pass"),
	)
	insns = append(insns, tcpSYNAlone(ethLen+6, ethLen+ip6Len, unix.AF_INET6)...)
	for w := int16(0); w < 16; w += 4 {
		insns = append(insns,
			asm.LoadMem(asm.R1, asm.R7, ethLen+8+w, asm.Word),
			asm.StoreMem(asm.RFP, ct+tailLIP+w, asm.R1, asm.Word),
			asm.StoreMem(asm.RFP, srv+tailRIP+w, asm.R1, asm.Word),
			asm.LoadMem(asm.R1, asm.R7, ethLen+24+w, asm.Word),
			asm.StoreMem(asm.RFP, srv+tailLIP+w, asm.R1, asm.Word))
	}
	insns = append(insns, ports(ethLen+ip6Len)...)
	insns = append(insns,
		// ct: the entries' pads and flags; the client's entry is the one
		// its pod is charged for.
		asm.Mov.Imm(asm.R1, 0).WithSymbol("ct"),
		asm.StoreMem(asm.RFP, ct+keyPad-svcKeyOff, asm.R1, asm.Word),
		asm.StoreMem(asm.RFP, srv+keyPad-svcKeyOff, asm.R1, asm.Word),
		asm.StoreMem(asm.RFP, ct+svcFlags, asm.R1, asm.Word),
		asm.Mov.Imm(asm.R1, svcClient),
		asm.StoreMem(asm.RFP, srv+svcFlags, asm.R1, asm.Word),

		// The packet's nf_conn: sk_buff._nfct, its ctinfo masked off.
		asm.Mov.Reg(asm.R1, asm.R6),
		kfuncCall(l.castCtxID),
		asm.LoadMem(asm.R1, asm.R0, l.nfctOff, asm.DWord),
		asm.And.Imm(asm.R1, nfctPtrMask),
		asm.JEq.Imm(asm.R1, 0, "pass"),
		asm.Mov.Imm(asm.R2, l.connTypeID),
		kfuncCall(p.castID),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R1, asm.R0, l.protonumOff, asm.Byte),
		asm.JNE.Imm(asm.R1, unix.IPPROTO_TCP, "pass"),
		asm.LoadMem(asm.R1, asm.R0, l.l3numOff, asm.Half),
		asm.JNE.Reg(asm.R1, asm.R9, "pass"),
		// Its client as it opened the connection is the packet's source:
		// the node translated the destination alone.
		asm.LoadMem(asm.R1, asm.R0, l.srcPortOff, asm.Half),
		asm.HostTo(asm.BE, asm.R1, asm.Half),
		asm.LoadMem(asm.R2, asm.RFP, ct+tailLPort, asm.Word),
		asm.JNE.Reg(asm.R1, asm.R2, "pass"),
		asm.LoadMem(asm.R1, asm.R0, l.dstPortOff, asm.Half),
		asm.HostTo(asm.BE, asm.R1, asm.Half),
		asm.StoreMem(asm.RFP, ct+tailRPort, asm.R1, asm.Word),
		asm.JEq.Imm(asm.R9, unix.AF_INET6, "ct_v6"),
		asm.LoadMem(asm.R1, asm.R0, l.srcAddrOff, asm.Word),
		asm.LoadMem(asm.R2, asm.RFP, ct+tailLIP+12, asm.Word),
		asm.JNE.Reg(asm.R1, asm.R2, "pass"),
		asm.LoadMem(asm.R1, asm.R0, l.dstAddrOff, asm.Word),
		asm.StoreMem(asm.RFP, ct+tailRIP+12, asm.R1, asm.Word),
		asm.Ja.Label("translated"),
	)
	for w := int16(0); w < 16; w += 4 {
		ld := asm.LoadMem(asm.R1, asm.R0, l.srcAddrOff+w, asm.Word)
		if w == 0 {
			ld = ld.WithSymbol("ct_v6")
		}
		insns = append(insns, ld,
			asm.LoadMem(asm.R2, asm.RFP, ct+tailLIP+w, asm.Word),
			asm.JNE.Reg(asm.R1, asm.R2, "pass"),
			asm.LoadMem(asm.R1, asm.R0, l.dstAddrOff+w, asm.Word),
			asm.StoreMem(asm.RFP, ct+tailRIP+w, asm.R1, asm.Word))
	}
	// translated: was the destination translated at all? A connection to
	// the pod's own address is its own mirror, as the verdict finds it
	// without an entry.
	return seq(insns,
		at("translated", sameWords(asm.RFP, ct+tailRPort, srv+tailLPort, 4, "record")...),
		sameWords(asm.RFP, ct+tailRIP, srv+tailLIP, 16, "record"),
		asm.Instructions{asm.Ja.Label("pass")},
		// record: the client must be a direct pod of the node, under its
		// cap of connections.
		at("record", lookup(m.owners, ct+tailLIP, "pass")...),
		asm.Instructions{
			asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
			asm.StoreMem(asm.RFP, svcCookie, asm.R1, asm.DWord),
		},
		lookup(m.counters, svcCookie, "pass"),
		asm.Instructions{
			asm.Mov.Reg(asm.R7, asm.R0),
			asm.LoadMem(asm.R1, asm.R7, nsServicesOff, asm.Word),
			asm.JGE.Imm(asm.R1, MaxSocketsPerPod, "pass"),
		},
		serviceUpdate(m, ct, srv, bpfNoExist),
		asm.Instructions{
			asm.JNE.Imm(asm.R0, 0, "again"),
		},
		atomicAdd(asm.R7, nsServicesOff, 1, asm.Word),
		asm.Instructions{asm.Ja.Label("server")},
		// The same four-tuple again (a SYN sent again, or a connection
		// that reuses it): its entry is replaced, and charged once.
		at("again", serviceUpdate(m, ct, srv, bpfAny)...),
		at("server", serviceUpdate(m, srv, ct, bpfAny)...),
		asm.Instructions{
			asm.Mov.Imm(asm.R0, tcActUnspec).WithSymbol("pass"),
			asm.Return(),
		},
	)
}

// tcpSYNAlone goes on only for a TCP segment (the IP header's protocol
// byte at protoOff) that is a SYN without ACK (its header at tcpOff),
// with family in R9.
func tcpSYNAlone(protoOff, tcpOff int16, family int32) asm.Instructions {
	return asm.Instructions{
		asm.LoadMem(asm.R1, asm.R7, protoOff, asm.Byte),
		asm.JNE.Imm(asm.R1, unix.IPPROTO_TCP, "pass"),
		asm.LoadMem(asm.R1, asm.R7, tcpOff+tcpFlagsOff, asm.Byte),
		asm.And.Imm(asm.R1, tcpSYN|tcpACK),
		asm.JNE.Imm(asm.R1, tcpSYN, "pass"),
		asm.Mov.Imm(asm.R9, family),
	}
}

// ports stores the TCP ports of the packet in R7 (its TCP header at
// off; the bounds checked) in host order: the source is the client's
// local port, the destination the server's.
func ports(off int16) asm.Instructions {
	return asm.Instructions{
		asm.LoadMem(asm.R1, asm.R7, off, asm.Half),
		asm.HostTo(asm.BE, asm.R1, asm.Half),
		asm.StoreMem(asm.RFP, svcClientTail+tailLPort, asm.R1, asm.Word),
		asm.StoreMem(asm.RFP, svcServerTail+tailRPort, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R7, off+2, asm.Half),
		asm.HostTo(asm.BE, asm.R1, asm.Half),
		asm.StoreMem(asm.RFP, svcServerTail+tailLPort, asm.R1, asm.Word),
	}
}

// serviceUpdate writes the services entry keyed by the four-tuple at
// fp+key with the one at fp+val (and its flags) as its value.
func serviceUpdate(m maps, key, val int16, flags int32) asm.Instructions {
	return asm.Instructions{
		asm.LoadMapPtr(asm.R1, m.services.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, int32(key)),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, int32(val)),
		asm.Mov.Imm(asm.R4, flags),
		asm.FnMapUpdateElem.Call(),
	}
}

// AttachServices puts the node's service program on the node's end of
// a direct pod's link (hostVeth, in the calling thread's namespace), so
// that connections to the pod through a Service's cluster IP join too.
// A kernel without conntrack in its BTF has no service program: the
// error then wraps ErrUnsupported, and only those joins are off.
func (n *Node) AttachServices(hostVeth string) error {
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(n.dir, pinService), nil)
	if err != nil {
		return fmt.Errorf("%w: no service program in %s (the kernel's BTF has no conntrack, or its verifier refused the program): %v", ErrUnsupported, n.dir, err)
	}
	defer prog.Close()
	l, err := netlinksafe.LinkByName(hostVeth)
	if err != nil {
		return fmt.Errorf("finding %s for the service program: %w", hostVeth, err)
	}
	idx := l.Attrs().Index
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding clsact to %s: %w", hostVeth, err)
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: idx,
			Parent:    netlink.HANDLE_MIN_EGRESS,
			Handle:    netlink.MakeHandle(0, serviceFilterHandle),
			Protocol:  unix.ETH_P_ALL,
			Priority:  serviceFilterPriority,
		},
		Fd:           prog.FD(),
		Name:         "usn_service",
		DirectAction: true,
	}
	if err := netlink.FilterReplace(f); err != nil {
		return fmt.Errorf("attaching the service program to %s: %w", hostVeth, err)
	}
	return nil
}

// The service program's tc filter: a priority and handle of its own, so
// that it sits beside another plugin's filters (chained, or shaping)
// without replacing them; it returns TC_ACT_UNSPEC, which lets them run.
const (
	serviceFilterPriority = 0x75
	serviceFilterHandle   = 0x75
)

// forgetServices removes the translations of the connections whose
// client or server has one of addrs (a pod's DEL: its sockets are gone,
// and a newer pod may get the addresses).
func (n *Node) forgetServices(addrs []netip.Addr) error {
	if len(addrs) == 0 {
		return nil
	}
	mine := make(map[[16]byte]bool, len(addrs))
	for _, a := range addrs {
		mine[ownerKey(a)] = true
	}
	var key [svcKeySize]byte
	var val [svcValSize]byte
	var gone [][svcKeySize]byte
	it := n.services.Iterate()
	for it.Next(&key, &val) {
		var lip, rip [16]byte
		copy(lip[:], key[tailLIP:])
		copy(rip[:], key[tailRIP:])
		if mine[lip] || mine[rip] {
			gone = append(gone, key)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("listing the Service translations: %w", err)
	}
	for _, k := range gone {
		if err := n.services.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("removing a Service translation: %w", err)
		}
	}
	return nil
}
