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
	"github.com/cni-usernet/cni-usernet/pkg/stack/relay"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirelink"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirelink/packetsock"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirelink/wirequeue"
	"gvisor.dev/gvisor/pkg/tcpip"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
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
	// reader on Go's netpoller (wirelink's linkReader), so that what a
	// frame wakes runs on the thread that read it; without, fdbased reads
	// and writes the link's socket. The SYN and fragment sockets, when
	// open, are read on paths of their own (wirelink's synPath,
	// fragPath); without, the link's socket carries those frames too.
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
	// packet, lost bulk throughput and gained nothing on
	// request/response: docs/performance.md.)
	// A full queue makes the sender wait (pkg/stack/wirelink/wirequeue): a packet dropped
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
	Wire      *tcpipstack.Stack
	Relay     *relay.Relay
	WireStats wirelink.LinkStats
	opts      Options

	// Capture taps the wire leg (capture_tap.go); idle, one atomic load.
	Capture *wireTap
	// link is the wire leg's link and its readers; nil until attachWire.
	link *wirelink.Link
	// Busy busy-polls after traffic; nil without Options.BusyPoll.
	Busy *busypoll.Poller
	// failed gets, once, why a reader of the link or of the TUN stopped
	// on its own;
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
	if s.link != nil {
		s.link.OnBatch(f)
	}
}

// Failed is readable when a reader of the pod's link stopped on its own
// (the kernel reported an error on its socket: ENETDOWN when the pod's
// interface was set down, which also unhooks the socket), or when the
// pod's TUN is gone (relay.Options.TUNGone: the pod deleted its eth0).
// The stack is deaf from then on, even once the link is up again; its
// process should exit so that the node agent starts a new one.
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
	o.Relay.TUNGone = s.fail
	direct := wirelink.NewDirectWriter(o.Link, o.GSO.Mode.VnetHdr(), mac)
	// Protocol handlers must be in place before the NIC delivers its first
	// packet (netstack does not synchronise setting them), so the relay
	// comes before the NIC.
	if s.Wire, err = newStack(o.TCPBufferBytes); err != nil {
		s.shutdown()
		return nil, err
	}
	s.Relay, err = relay.New(relay.Leg{Stack: s.Wire, NIC: wireNIC, MTU: o.Spec.MTU, WriteDirect: direct.Write}, o.Pod, o.Relay)
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

// attachWire creates the wire leg's link endpoint and NIC on the link's
// sockets, and starts the stack's readers of them.
func (s *Stack) attachWire(mac net.HardwareAddr) error {
	o := s.opts
	lo := wirelink.Options{
		Sockets:           o.Link,
		IfName:            o.Spec.IfName,
		MTU:               o.Spec.MTU,
		MAC:               mac,
		GSO:               o.GSO,
		GRO:               o.GRO,
		VerifyRXChecksums: o.VerifyRXChecksums,
		Stats:             &s.WireStats,
		Policy:            o.Policy,
		PodAddrs:          o.Relay.PodAddrs,
		CookiesSent:       s.Wire.Stats().TCP.ListenOverflowSynCookieSent.Value,
		AnswerSYN:         s.Relay.AnswerSYN,
		SYNCookieAnswer:   s.Relay.SYNCookieAnswer,
		CountFastCookies:  s.Relay.CountFastCookies,
		Busy:              s.Busy,
		Failed:            s.fail,
	}
	ep, err := wirelink.NewEndpoint(&lo)
	if err != nil {
		return err
	}
	s.link = wirelink.New(s.tapWire(ep), lo)
	link := s.link.Endpoint()
	// Created disabled and enabled once configured, so that no packet
	// meets a half-configured NIC.
	nicOpts := tcpipstack.NICOptions{Name: o.Spec.IfName, Disabled: true}
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
	return s.link.Start()
}

// ReassemblyHeldUntil is when the reassemblies the fragments received so
// far may have opened have all timed out: until then netstack may hold
// their memory. The zero time if no fragment arrived.
func (s *Stack) ReassemblyHeldUntil() time.Time { return s.WireStats.ReassemblyHeldUntil() }

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
	if s.link != nil {
		s.link.Stop()
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
