package capture

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/cni-usernet/cni-usernet/pkg/api/pcap"
	"golang.org/x/net/bpf"
)

// The app leg's loopback carries the relay's traffic (the stack's
// transparent sockets talk to the applications from the peers' real
// addresses, and the applications' diverted traffic reaches the stack's
// listeners bound to the peers' addresses) beside the pod's own chatter
// (127.0.0.1, or the pod's address to itself), which never touches the
// stack. The relay's packets are exactly those with a peer that is
// neither loopback nor the pod: LoopbackFilter keeps them and drops the
// rest in the kernel, before they are copied to the capture.

// asm assembles classic BPF with named jump targets.
type asm struct {
	ins    []bpf.Instruction
	labels map[string]int
	fixes  []fix
}

type fix struct {
	at          int
	true, false string // "" is the next instruction
}

func (a *asm) emit(in bpf.Instruction) { a.ins = append(a.ins, in) }

func (a *asm) label(name string) { a.labels[name] = len(a.ins) }

// jeq compares A with val.
func (a *asm) jeq(val uint32, t, f string) {
	a.fixes = append(a.fixes, fix{len(a.ins), t, f})
	a.emit(bpf.JumpIf{Cond: bpf.JumpEqual, Val: val})
}

func (a *asm) jump(to string) {
	a.fixes = append(a.fixes, fix{len(a.ins), to, ""})
	a.emit(bpf.Jump{})
}

func (a *asm) assemble() ([]bpf.RawInstruction, error) {
	skip := func(at int, to string) (int, error) {
		if to == "" {
			return 0, nil
		}
		dst, ok := a.labels[to]
		if !ok || dst <= at {
			return 0, fmt.Errorf("bpf: bad jump from %d to %q", at, to)
		}
		return dst - at - 1, nil
	}
	for _, f := range a.fixes {
		t, err := skip(f.at, f.true)
		if err != nil {
			return nil, err
		}
		switch in := a.ins[f.at].(type) {
		case bpf.Jump:
			in.Skip = uint32(t)
			a.ins[f.at] = in
		case bpf.JumpIf:
			e, err := skip(f.at, f.false)
			if err != nil {
				return nil, err
			}
			if t > 255 || e > 255 {
				return nil, fmt.Errorf("bpf: jump too long")
			}
			in.SkipTrue, in.SkipFalse = uint8(t), uint8(e)
			a.ins[f.at] = in
		}
	}
	return bpf.Assemble(a.ins)
}

const (
	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
)

// LoopbackFilter is the filter of a SOCK_DGRAM packet socket on the pod's
// lo (packets start at the IP header): it keeps packets with a peer that
// is not local (neither loopback nor one of podIPs), and only the incoming
// copy of each (lo shows every packet twice, going out and coming in; so
// does libpcap drop the outgoing one).
func LoopbackFilter(podIPs []netip.Addr) ([]bpf.RawInstruction, error) {
	a := &asm{labels: map[string]int{}}
	var v4, v6 []netip.Addr
	for _, ip := range podIPs {
		if ip.Unmap().Is4() {
			v4 = append(v4, ip.Unmap())
		} else {
			v6 = append(v6, ip)
		}
	}
	v6 = append(v6, netip.IPv6Loopback())

	a.emit(bpf.LoadExtension{Num: bpf.ExtType})
	a.jeq(pcap.PacketOutgoing, "drop", "")
	a.emit(bpf.LoadExtension{Num: bpf.ExtProto})
	a.jeq(etherTypeIPv4, "v4", "")
	a.jeq(etherTypeIPv6, "v6", "drop")

	local4 := func(off uint32, t, f string) {
		a.emit(bpf.LoadAbsolute{Off: off, Size: 4})
		for _, ip := range v4 {
			a.jeq(binary.BigEndian.Uint32(ip.AsSlice()), t, "")
		}
		a.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xff000000})
		a.jeq(0x7f000000, t, f)
	}
	n := 0
	local6 := func(off uint32, t, f string) {
		for _, ip := range v6 {
			b := ip.As16()
			n++
			next := fmt.Sprintf("next%d", n)
			for w := range 4 {
				a.emit(bpf.LoadAbsolute{Off: off + uint32(4*w), Size: 4})
				onTrue := ""
				if w == 3 {
					onTrue = t
				}
				a.jeq(binary.BigEndian.Uint32(b[4*w:]), onTrue, next)
			}
			a.label(next)
		}
		a.jump(f)
	}
	// IPv4: source at 12, destination at 16; IPv6: 8 and 24.
	a.label("v4")
	local4(12, "v4dst", "keep")
	a.label("v4dst")
	local4(16, "drop", "keep")
	a.label("v6")
	local6(8, "v6dst", "keep")
	a.label("v6dst")
	local6(24, "drop", "keep")
	a.label("keep")
	a.emit(bpf.RetConstant{Val: 0xffffffff})
	a.label("drop")
	a.emit(bpf.RetConstant{Val: 0})
	return a.assemble()
}
