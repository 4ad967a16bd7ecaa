// Package podstack builds the pod's stack: a netstack instance on the pod's
// interface (the wire leg), joined by the relay to the pod's own kernel,
// where the applications are (the pod side: kernel sockets and a TUN).
package podstack

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/stack/busypoll"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
	"github.com/cni-usernet/cni-usernet/pkg/stack/packetsock"
	"github.com/cni-usernet/cni-usernet/pkg/stack/relay"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirequeue"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Options configures a pod stack. The file descriptors (Link's, Pod's)
// are owned by the stack once Build succeeds.
type Options struct {
	// Spec is what was taken over from the kernel. Required.
	Spec *podnet.Spec
	// Link is the pod's link's packet sockets (packetsock.OpenLink),
	// bound to Spec.IfName, the link's socket and the send socket with
	// PACKET_VNET_HDR exactly when GSO.Mode.VnetHdr(). The link's socket
	// is required. With a send socket (Link.TX), netstack's link endpoint
	// writes through it and the link's socket is read by the stack's own
	// reader on Go's netpoller (linkReader), so that what a frame wakes
	// runs on the thread that read it; without, fdbased reads and writes
	// the link's socket. The SYN and fragment sockets, when open, are read
	// on paths of their own (synPath, fragPath); without, the link's
	// socket carries those frames too.
	Link *packetsock.Link
	// Pod is the pod kernel's side: the TUN and the relay's listeners.
	// Required.
	Pod relay.PodSide
	// GSO is the resolved segmentation mode of the wire leg. Required.
	GSO offload.Decision
	// GRO turns on netstack's generic receive offload on the wire leg:
	// consecutive segments of a flow are merged before TCP sees them.
	GRO bool
	// VerifyRXChecksums verifies the checksums of frames from the pod's
	// link. Zero: trusted. Both ends of a veth are the same kernel, which
	// may hand over frames with partial checksums (CHECKSUM_PARTIAL):
	// verifying them would drop good packets. runsc trusts them too.
	VerifyRXChecksums bool
	// WireQueueLen, when non-zero, puts a FIFO queue of that many packets
	// between netstack and the wire link, drained by its own goroutine:
	// TCP processing and the send system calls (in which the kernel also
	// delivers to the veth's peer) then run on different cores, and the
	// queue hands the link batches. Zero: send in the caller's goroutine.
	// (A queue that sent inline when idle, to save a hand-off per lone
	// packet, lost 20-60 % of bulk throughput and gained nothing on
	// request/response: hack/bench/run.sh --quick --baseline, BENCHMARKS.md.)
	// A full queue makes the sender wait (pkg/stack/wirequeue): a packet dropped
	// there is one netstack's TCP believes sent.
	WireQueueLen int
	// TCPBufferBytes is the largest send and receive buffer of a netstack
	// TCP endpoint (auto-tuned up to it). Zero: 4 MiB, enough for the
	// bandwidth-delay product of 10 Gbit/s at 3 ms.
	TCPBufferBytes int
	// Policy is the pod's network policy in force, shared with the relay
	// (Relay.Policy is set to it): the wire leg takes the ingress verdict
	// on TCP SYNs and echo requests, the relay on UDP flows, on the TCP
	// connections it accepts (a SYN cookie completes a handshake without
	// a SYN) and on the applications' connections. Its denials are logged
	// to Relay.Logger. Nil: everything is allowed.
	Policy *enforce.Enforcer
	// Relay configures the relay between the legs.
	Relay relay.Options
	// BusyPoll, when set, keeps the stack's thread polling for that long
	// after traffic instead of sleeping (pkg/stack/busypoll): a request that
	// comes within it finds the thread awake. It costs the CPU it spins.
	// Zero: the thread sleeps as soon as it has nothing to do.
	BusyPoll time.Duration
	// BusyPollOff starts the busy poller off, for a governor to turn on
	// (pkg/stack/governor).
	BusyPollOff bool
}

// DefaultTCPBufferBytes is Options.TCPBufferBytes's default.
const DefaultTCPBufferBytes = 4 << 20

// softwareGSOMaxSize is the largest packet software GSO takes from TCP:
// the IP length field's limit. The kernel splits it before the device, so
// the link's own limits do not apply.
const softwareGSOMaxSize = 65535

// Validate reports the first problem with o.
func (o *Options) Validate() error {
	if o.Spec == nil {
		return fmt.Errorf("no spec")
	}
	if err := o.Spec.Validate(); err != nil {
		return err
	}
	if o.Link == nil || o.Link.FD <= 0 || o.Pod.TUN == nil {
		return fmt.Errorf("missing link or TUN file descriptor")
	}
	switch o.GSO.Mode {
	case offload.ModeHardware, offload.ModeSoftware, offload.ModeOff:
	default:
		return fmt.Errorf("unresolved GSO mode %q", o.GSO.Mode)
	}
	return nil
}

// Stack is a running pod stack.
type Stack struct {
	Wire      *stack.Stack
	Relay     *relay.Relay
	WireStats LinkStats
	opts      Options

	// Capture taps the wire leg (capture_tap.go); idle, one atomic load.
	Capture *wireTap
	// syn reads the link's SYN socket; nil without one (Link.SYN).
	syn *synPath
	// frag reads the link's fragment socket; nil without one
	// (Link.Fragments).
	frag *fragPath
	// reader reads the link's socket; nil when fdbased does (no Link.TX).
	reader *linkReader
	// Busy busy-polls after traffic; nil without Options.BusyPoll.
	Busy *busypoll.Poller
	// failed gets, once, why a reader of the link stopped on its own;
	// failure keeps it for Healthy.
	failed    chan error
	failure   atomic.Pointer[error]
	failOnce  sync.Once
	closeOnce sync.Once
}

// OnLinkBatch has f called for every batch of frames the stack reads from
// the pod's link, from the reader's goroutine: it must not block. Without
// the stack's own link reader (fdbased reads the link), f is never called.
func (s *Stack) OnLinkBatch(f func()) {
	if s.reader != nil {
		s.reader.onBatch.Store(&f)
	}
}

// Failed is readable when a reader of the pod's link stopped on its own:
// the kernel reported an error on its socket (ENETDOWN when the pod's
// interface was set down, which also unhooks the socket). The stack is
// deaf from then on, even once the link is up again; its process should
// exit so that the node agent starts a new one.
func (s *Stack) Failed() <-chan error { return s.failed }

func (s *Stack) fail(err error) {
	s.failOnce.Do(func() {
		s.failure.Store(&err)
		s.failed <- err
	})
}

const wireNIC tcpip.NICID = 1

// Build creates the wire leg and the relay to the pod's kernel, and starts
// relaying.
func Build(o Options) (*Stack, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("pod stack options: %w", err)
	}
	if o.TCPBufferBytes == 0 {
		o.TCPBufferBytes = DefaultTCPBufferBytes
	}
	if o.Policy == nil {
		o.Policy = enforce.AllowAll()
	}
	o.Relay.Policy = o.Policy
	// Each denial gets a line in the stack's log (rate-limited).
	o.Policy.SetLogger(o.Relay.Logger)
	// The applications send from the addresses the TUN holds, the spec's
	// global ones; the relay drops anything else they hand it.
	o.Relay.PodAddrs = nil
	for _, p := range o.Spec.PodIPs() {
		o.Relay.PodAddrs = append(o.Relay.PodAddrs, p.Addr())
	}
	mac, err := net.ParseMAC(o.Spec.MAC)
	if err != nil {
		return nil, fmt.Errorf("parsing MAC %q: %w", o.Spec.MAC, err)
	}
	var busy *busypoll.Poller
	if o.BusyPoll > 0 {
		if busy, err = busypoll.New(o.BusyPoll); err != nil {
			return nil, err
		}
		busy.SetEnabled(!o.BusyPollOff)
		o.Relay.Traffic = busy.Touch
	}
	s := &Stack{opts: o, failed: make(chan error, 1), Busy: busy}
	direct := &directWriter{fd: o.sendFD(), vnetHdr: o.GSO.Mode.VnetHdr(), mac: mac}
	// Protocol handlers must be in place before the NIC delivers its first
	// packet (netstack does not synchronise setting them), so the relay
	// comes before the NIC.
	if s.Wire, err = newStack(o.TCPBufferBytes); err != nil {
		s.shutdown()
		return nil, err
	}
	s.Relay, err = relay.New(relay.Leg{Stack: s.Wire, NIC: wireNIC, MTU: o.Spec.MTU, WriteDirect: direct.write}, o.Pod, o.Relay)
	if err != nil {
		s.Wire.Destroy()
		s.Wire = nil
		s.shutdown()
		return nil, err
	}
	if err := s.attachWire(mac); err != nil {
		s.shutdown() // the descriptors stay the caller's
		return nil, fmt.Errorf("building the wire leg on %s: %w", o.Spec.IfName, err)
	}
	if s.Busy != nil {
		s.Busy.Start()
	}
	return s, nil
}

// sendFD is the socket frames are sent on.
func (o *Options) sendFD() int {
	if o.Link.TX > 0 {
		return o.Link.TX
	}
	return o.Link.FD
}

// attachWire creates the wire leg's link endpoint and NIC on the link's
// sockets, and starts the stack's readers of them.
func (s *Stack) attachWire(mac net.HardwareAddr) error {
	o := s.opts
	ep, err := fdbased.New(s.fdbasedOptions(mac))
	if err != nil {
		return fmt.Errorf("creating the link endpoint: %w", err)
	}
	ep = s.tapWire(ep)
	link := newCountingLink(ep, &s.WireStats)
	link.gate = &synGate{cookiesSent: s.Wire.Stats().TCP.ListenOverflowSynCookieSent.Value}
	link.answerSYN = s.Relay.AnswerSYN
	link.policy = o.Policy
	// Created disabled and enabled once configured, so that no packet
	// meets a half-configured NIC.
	nicOpts := stack.NICOptions{Name: o.Spec.IfName, Disabled: true}
	if o.WireQueueLen > 0 {
		nicOpts.QDisc = wirequeue.New(link, o.WireQueueLen, &s.WireStats.Queue)
	}
	if err := s.Wire.CreateNICWithOptions(wireNIC, link, nicOpts); err != nil {
		return fmt.Errorf("creating NIC: %s", err)
	}
	if err := configureWire(s.Wire, o.Spec); err != nil {
		return err
	}
	if err := s.Wire.EnableNIC(wireNIC); err != nil {
		return fmt.Errorf("enabling NIC: %s", err)
	}
	// The sockets queue what arrives until their readers start.
	return s.startReaders(link, tcpip.LinkAddress(mac))
}

// fdbasedOptions configures netstack's link endpoint: it sends, and reads
// the link's socket unless the stack has a send socket and reads it
// itself (linkReader).
func (s *Stack) fdbasedOptions(mac net.HardwareAddr) *fdbased.Options {
	o := s.opts
	fo := fdbased.Options{
		FDs:                []int{o.sendFD()},
		MTU:                o.Spec.MTU,
		EthernetHeader:     true,
		Address:            tcpip.LinkAddress(mac),
		PacketDispatchMode: fdbased.RecvMMsg,
		RXChecksumOffload:  !o.VerifyRXChecksums,
		GRO:                o.GRO,
		// One processor: fdbased then delivers each received batch in the
		// reading goroutine. With more, it hands packets to per-processor
		// queues that have no bound: a flood the stack cannot keep up with
		// piles up there (measured: 600 MB RSS, and an established
		// connection's segments stuck for tens of seconds behind the
		// backlog) instead of in the socket's receive buffer, where the
		// kernel drops the excess.
		ProcessorsPerChannel: 1,
		// Called with nil when the endpoint is closed, with the error when
		// its reader ended on one.
		ClosedFunc: func(err tcpip.Error) {
			if err != nil {
				s.fail(fmt.Errorf("reading %s: %s", o.Spec.IfName, err))
			}
		},
	}
	if o.Link.TX > 0 {
		// A fanout group needs a socket that receives (EINVAL on a
		// send-only one), and one socket has nobody to share with.
		fo.PreConfigured, fo.IsPacketSocket = true, []bool{true}
		// fdbased still runs a reader on the send-only socket, which
		// never receives: readv's one set of buffers instead of
		// recvmmsg's eight keeps ~1 MiB out of every idle stack.
		fo.PacketDispatchMode = fdbased.Readv
	}
	switch o.GSO.Mode {
	case offload.ModeHardware:
		fo.GSOMaxSize = o.GSO.Link.MaxBurst(o.Spec.MTU)
	case offload.ModeSoftware:
		// The kernel's GSO segments these on the way to the link (its
		// TSO is off, see ethtool.LinkTSOOff): one system call and one
		// copy per 64 KiB. Splitting them here and sending the frames
		// with one sendmmsg moved 2.8x less pod→node in one interleaved
		// run (BENCHMARKS.md, History: software GSO by the kernel's GSO).
		fo.GSOMaxSize = softwareGSOMaxSize
	}
	return &fo
}

// startReaders starts the stack's readers of the link's sockets: the
// link's socket's when fdbased does not read it, the SYN socket's and the
// fragment socket's when the link has them. Stack.shutdown stops those
// that started.
func (s *Stack) startReaders(link *countingLink, mac tcpip.LinkAddress) error {
	o := s.opts
	if o.Link.TX > 0 {
		r, err := newLinkReader(o.Link.FD, o.GSO.Mode.VnetHdr())
		if err != nil {
			return err
		}
		r.mac = mac
		r.rxChecksumValidated = !o.VerifyRXChecksums
		r.gro.Init(o.GRO)
		r.gro.Dispatcher = s.Capture
		r.failed = s.fail
		r.busy = s.Busy
		s.reader = r
		r.start()
	}
	if o.Link.SYN != nil {
		p, err := newSYNPath(o.Link.SYN, mac)
		if err != nil {
			return err
		}
		p.link, p.tap = link, s.Capture
		p.answer, p.count = s.Relay.SYNCookieAnswer, s.Relay.CountFastCookies
		p.rxChecksumValidated = !o.VerifyRXChecksums
		p.failed = s.fail
		s.syn = p
		p.start()
	}
	if o.Link.Fragments > 0 {
		p, err := newFragPath(o.Link.Fragments, int(o.Spec.MTU), mac)
		if err != nil {
			return err
		}
		p.link, p.tap = link, s.Capture
		p.rxChecksumValidated = !o.VerifyRXChecksums
		p.failed = s.fail
		s.frag = p
		p.start()
	}
	return nil
}

// WireUp reports whether the wire leg's NIC is enabled.
func (s *Stack) WireUp() bool { return s.Wire.CheckNIC(wireNIC) }

// Close stops relaying, tears the wire leg down and closes the link's
// sockets.
func (s *Stack) Close() {
	s.closeOnce.Do(func() {
		s.shutdown()
		s.opts.Link.Close()
	})
}

// shutdown stops the readers, the relay and the wire leg; the sockets
// stay open.
func (s *Stack) shutdown() {
	if s.reader != nil {
		s.reader.close()
	}
	if s.syn != nil {
		s.syn.stop()
	}
	if s.frag != nil {
		s.frag.stop()
	}
	if s.Relay != nil {
		s.Relay.Close()
	}
	if s.Wire != nil {
		s.Wire.Close()
		s.Wire.Wait()
	}
	if s.Busy != nil {
		s.Busy.Close()
	}
}
