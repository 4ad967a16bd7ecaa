// Package wirelink is the wire leg's link layer: the pod's link's packet
// sockets (packetsock), their readers, the gate every received frame
// passes before netstack (counters, ingress verdict, SYN cap, fragment
// copies), and the send path with its queue (wirequeue).
//
// A frame from the pod's link takes one of three sockets, split by one
// BPF program (packetsock):
//
//   - the link's socket: receive_linux.go, pollLoop → recvLoop →
//     linkReader.deliverFrame → GRO → the capture tap → gate.go,
//     gate.DeliverNetworkPacket → netstack;
//   - the SYN socket's ring: synpath_linux.go, synPath.handle, which asks
//     the gate's policy and SYN cap (syncap.go) and answers a flood's
//     SYNs with cookies itself;
//   - the fragment socket: fragpath_linux.go, fragPath.deliverFragment,
//     into gate.admit and netstack's reassembly (fragments.go).
//
// What netstack sends goes the other way: send.go.
package wirelink

import (
	"net"
	"net/netip"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/stack/busypoll"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
	"github.com/cni-usernet/cni-usernet/pkg/stack/tap"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirelink/packetsock"
	"gvisor.dev/gvisor/pkg/tcpip"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Options configures the wire leg's link.
type Options struct {
	// Sockets are the pod's link's packet sockets (packetsock.OpenLink);
	// see podstack.Options.Link. Required.
	Sockets *packetsock.Link
	// IfName names the link in errors.
	IfName string
	// MTU is the link's MTU. Required.
	MTU uint32
	// MAC is the link's address: frames for other hosts' are dropped.
	MAC net.HardwareAddr
	// GSO is the resolved segmentation mode of the link.
	GSO offload.Decision
	// GRO merges consecutive segments of a flow before TCP sees them.
	GRO bool
	// VerifyRXChecksums verifies the checksums of received frames; zero:
	// trusted (podstack.Options.VerifyRXChecksums).
	VerifyRXChecksums bool
	// Stats counts what crosses the link. Required.
	Stats *LinkStats
	// Policy takes the ingress verdict on the packets that open
	// connections (ingress.go). Required.
	Policy *enforce.Enforcer
	// PodAddrs are the pod's own addresses: a packet from the wire with
	// one of them as its source is dropped and counted
	// (LinkStats.RxOwnSource), as a kernel drops a martian. Not modified.
	PodAddrs []netip.Addr
	// CookiesSent reads netstack's count of SYN cookies its listeners
	// sent (synGate.cookiesSent); nil: never under pressure.
	CookiesSent func() uint64
	// AnswerSYN answers, with a SYN cookie, a SYN the gate turns away
	// from netstack (relay.AnswerSYN); nil: such SYNs are dropped.
	AnswerSYN func(ipPacket []byte, from tcpip.LinkAddress) bool
	// SYNCookieAnswer builds the cookie SYN-ACK for a SYN read from the
	// SYN socket (relay.SYNCookieAnswer); CountFastCookies reports what
	// was sent (relay.CountFastCookies). Required with a SYN socket.
	SYNCookieAnswer  func(buf, ipPacket []byte) ([]byte, tcpip.NetworkProtocolNumber, bool)
	CountFastCookies func(sent, failed int)
	// Busy hears of every batch the link's reader reads; nil: no busy
	// polling.
	Busy *busypoll.Poller
	// Failed is told why a reader of the link stopped on its own.
	// Required.
	Failed func(error)
}

// Link is the wire leg's link: the gate netstack's NIC sits on and the
// stack's readers of the link's sockets.
type Link struct {
	o    Options
	gate *gate
	tap  *tap.Tap
	// reader reads the link's socket; nil when fdbased does (no
	// Sockets.TX).
	reader *linkReader
	// syn reads the link's SYN socket; nil without one (Sockets.SYN).
	syn *synPath
	// frag reads the link's fragment socket; nil without one
	// (Sockets.Fragments).
	frag *fragPath
}

// New puts the gate above t, the capture tap around the endpoint
// NewEndpoint made from the same o.
func New(t *tap.Tap, o Options) *Link {
	g := newGate(t, o.Stats)
	g.syn = &synGate{cookiesSent: o.CookiesSent}
	g.answerSYN = o.AnswerSYN
	g.policy = o.Policy
	// Unmapped once here: the gate compares every packet's source.
	g.own = make([]netip.Addr, len(o.PodAddrs))
	for i, a := range o.PodAddrs {
		g.own[i] = a.Unmap()
	}
	return &Link{o: o, gate: g, tap: t}
}

// Endpoint is the link endpoint netstack's NIC (or the wire queue) sends
// to and is delivered from.
func (l *Link) Endpoint() tcpipstack.LinkEndpoint { return l.gate }

// Start starts the stack's readers of the link's sockets: the link's
// socket's when fdbased does not read it, the SYN socket's and the
// fragment socket's when the link has them. Stop stops those that
// started.
func (l *Link) Start() error {
	o := &l.o
	mac := tcpip.LinkAddress(o.MAC)
	if o.Sockets.TX > 0 {
		r, err := newLinkReader(o.Sockets.FD, o.GSO.Mode.VnetHdr())
		if err != nil {
			return err
		}
		r.mac = mac
		r.rxChecksumValidated = !o.VerifyRXChecksums
		r.gro.Init(o.GRO)
		r.gro.Dispatcher = l.tap
		r.failed = o.Failed
		r.busy = o.Busy
		l.reader = r
		r.start()
	}
	if o.Sockets.SYN != nil {
		p, err := newSYNPath(o.Sockets.SYN, mac)
		if err != nil {
			return err
		}
		p.gate, p.tap = l.gate, l.tap
		p.answer, p.count = o.SYNCookieAnswer, o.CountFastCookies
		p.rxChecksumValidated = !o.VerifyRXChecksums
		p.failed = o.Failed
		l.syn = p
		p.start()
	}
	if o.Sockets.Fragments > 0 {
		p, err := newFragPath(o.Sockets.Fragments, int(o.MTU), mac)
		if err != nil {
			return err
		}
		p.gate, p.tap = l.gate, l.tap
		p.rxChecksumValidated = !o.VerifyRXChecksums
		p.failed = o.Failed
		l.frag = p
		p.start()
	}
	return nil
}

// Stop stops the readers that started; the sockets stay open (their
// owner, packetsock.Link, closes them).
func (l *Link) Stop() {
	if l.reader != nil {
		l.reader.close()
	}
	if l.syn != nil {
		l.syn.stop()
	}
	if l.frag != nil {
		l.frag.stop()
	}
}

// OnBatch has f called for every batch of frames the link's reader reads,
// from its goroutine: it must not block. Without the stack's own reader
// (fdbased reads the link), f is never called.
func (l *Link) OnBatch(f func()) {
	if l.reader != nil {
		l.reader.onBatch.Store(&f)
	}
}

// ReadsLink reports whether the stack reads the link's socket itself
// (linkReader) rather than fdbased.
func (l *Link) ReadsLink() bool { return l.reader != nil }
