package wirelink

import (
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/stack/tap"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/rawfile"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// fragPath serves the link's fragment socket (packetsock.OpenFragments):
// the IP fragments, and nothing else, so that a fragment flood queues in
// a socket buffer of its own, which the kernel caps (dropping the excess
// there, where the stack pays nothing for it), and never ahead of the
// link's other frames. Each fragment is read into a frame buffer kept for
// it and copied once into a packet buffer of its own size, with the
// reassembly charge reserved in front (fragments.go), for netstack's
// reassembly; the capture and the link's counters see it as they see the
// link's other frames, and the ingress policy judges a first fragment as
// on the link's path (admitIngress).
//
// With the stack's one P the loop shares a thread with the link's reader
// and the goroutines its frames wake: a loop that read until the socket
// was empty would keep them waiting for as long as a flood lasts, up to
// the scheduler's 10 ms preemption at a time, and the network poller that
// wakes the link's reader is not consulted when a busy goroutine merely
// yields. So the loop reads at most fragBudget fragments a turn and then
// sleeps fragPause, which parks it: the scheduler then polls the network
// and runs whatever the link's frames woke before the next turn. A
// flood's share of the stack is so bounded; what it sends beyond is
// dropped by the kernel at the fragment socket (the daemon's
// fragSocketDrops), as the kernel's own reassembly drops beyond
// ipfrag_high_thresh.
type fragPath struct {
	recvLoop
	mac  tcpip.LinkAddress
	gate *gate
	tap  *tap.Tap
	// rxChecksumValidated is fdbased's RXChecksumOffload, as synPath's.
	rxChecksumValidated bool

	frames [fragBatch][]byte
	iovecs [fragBatch]unix.Iovec
	hdrs   [fragBatch]rawfile.MMsgHdr // recvLoop.msgs
}

const (
	// fragBatch is how many fragments one recvmmsg takes.
	fragBatch = 16
	// fragBudget is how many fragments a turn reads: few enough that,
	// at what a flooding fragment costs the stack, a turn keeps the
	// link's frames waiting well under a millisecond
	// (docs/reliability/hostile.md, "Fragments on a socket of their
	// own", holds the cost).
	fragBudget = 4 * fragBatch
	// fragPause is how long the loop sleeps between turns while
	// fragments are queued. The sleep only has to park the loop; while
	// the rest of the stack has work it runs meanwhile, and the pause is
	// then no longer than that work.
	fragPause = 20 * time.Microsecond
)

// fragFrameSlack is what a frame may have beyond the link's MTU and
// Ethernet header: a VLAN tag (the most a veth forwards).
const fragFrameSlack = 4

func newFragPath(fd, mtu int, mac tcpip.LinkAddress) (*fragPath, error) {
	p := &fragPath{mac: mac}
	if err := p.open(fd, "fragment socket", "fragment socket: reading fragments"); err != nil {
		return nil, err
	}
	size := header.EthernetMinimumSize + mtu + fragFrameSlack
	buf := make([]byte, fragBatch*size)
	for k := range fragBatch {
		p.frames[k] = buf[k*size : (k+1)*size : (k+1)*size]
		p.iovecs[k] = rawfile.IovecFromBytes(p.frames[k])
		p.hdrs[k].Msg.Iov = &p.iovecs[k]
		p.hdrs[k].Msg.SetIovlen(1)
	}
	p.readInto(p.hdrs[:], p, fragBudget)
	p.pause = p.yield
	return p, nil
}

// yield parks the loop between turns while fragments are queued, so that
// the rest of the stack runs.
func (p *fragPath) yield() {
	p.gate.stats.fragments.turns.Add(1)
	time.Sleep(fragPause)
}

// fill has nothing to do: each message keeps its frame buffer, which
// deliver copies out of.
func (p *fragPath) fill() {}

// deliver hands the batch's n fragments to netstack's reassembly.
func (p *fragPath) deliver(n int) {
	for k := range n {
		p.deliverFragment(k)
	}
}

// deliverFragment hands fragment k of the batch to netstack's reassembly.
func (p *fragPath) deliverFragment(k int) {
	m := &p.hdrs[k]
	if m.Msg.Flags&unix.MSG_TRUNC != 0 {
		// Larger than the link's MTU: no veth forwards it, and what was
		// read of it cannot be reassembled.
		return
	}
	n := int(m.Len)
	if n < header.EthernetMinimumSize {
		return
	}
	frame := p.frames[k][:n]
	eth := header.Ethernet(frame)
	// As fdbased: frames for another host are not ours.
	if dst := eth.DestinationAddress(); dst != p.mac && dst[0]&1 == 0 {
		return
	}
	p.tap.RecordFrame(false, frame)
	proto := eth.Type()
	// The one copy: into a view of the smallest chunk that fits, as
	// compactFragment makes for a fragment read on the link's path.
	pkt := tcpipstack.NewPacketBuffer(tcpipstack.PacketBufferOptions{ReserveHeaderBytes: reassemblyCharge, Payload: buffer.MakeWithData(frame)})
	defer pkt.DecRef()
	pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	pkt.NetworkProtocolNumber = proto
	pkt.RXChecksumValidated = p.rxChecksumValidated
	if !p.gate.admit(proto, pkt) {
		return
	}
	// The filter takes only fragments; what note does not take for one
	// (an IPv6 fragment header it cannot reach) netstack parses as usual.
	p.gate.stats.fragments.note(proto, pkt)
	p.gate.Endpoint.DeliverNetworkPacket(proto, pkt)
}
