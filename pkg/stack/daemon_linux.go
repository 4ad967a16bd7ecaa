// Package stack is a pod's stack process (cni-usernet-stack): its
// command line (Run), and its life (Daemon): it takes the pod's interface
// over from the kernel, opens the pod side (listeners, the divert, the
// TUN), has pkg/stack/podstack assemble the netstack and the relay,
// serves the control socket, and shuts down. pkg/stack/podstack knows
// nothing of files, sockets on disk or signals.
package stack

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
	"github.com/cni-usernet/cni-usernet/pkg/stack/governor"
	"github.com/cni-usernet/cni-usernet/pkg/stack/podstack"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirelink/packetsock"
	"github.com/cni-usernet/cni-usernet/pkg/util/steptime"
)

// Daemon is a pod stack process's whole life: take over, serve, shut down.
type Daemon struct {
	// link is the pod's link's packet sockets, the stack's to close.
	link *packetsock.Link
	// socketDrops accumulates the link's socket's drops
	// (packetsock.Link.Drops, which resets on read); synSocketDrops the
	// SYN socket's, fragSocketDrops the fragment socket's.
	socketDrops     atomic.Uint64
	synSocketDrops  atomic.Uint64
	fragSocketDrops atomic.Uint64
	cfg             stackconfig.Config
	log             *slog.Logger
	spec            *podnet.Spec
	gso             offload.Decision
	stack           *podstack.Stack
	// policy is the network policy in force; nil when the stack does not
	// enforce policy (stackconfig.Config.Policy).
	policy *enforce.Enforcer
	ctl    *control.Server
	// governor follows the load with the thread count and, left to it,
	// busy polling; nil: both fixed (Govern).
	governor *governor.Governor
	// nodeCPU reads the node's load for the governor's busy polling; nil
	// when busy polling is not left to it.
	nodeCPU *nodeCPU
	started time.Time
	// Startup is how long each step of Start took.
	Startup *steptime.Steps
}

// Run blocks until ctx ends, or until the stack can no longer read the
// pod's link or its TUN (podstack.Stack.Failed), then shuts the stack down; the
// latter is returned, so that the process exits with an error and the node
// agent starts a new stack. The kernel-side configuration (TUN, ingress
// drop) is left in place: a restarted stack re-attaches to it, and DEL
// removes it with the pod.
func (d *Daemon) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go d.releaseWhenQuiet(ctx)
	governed := make(chan struct{})
	if d.governor != nil {
		go func() {
			defer close(governed)
			d.governor.Run(ctx)
		}()
	} else {
		close(governed)
	}
	var err error
	select {
	case <-ctx.Done():
		d.log.Info("shutting down")
	case err = <-d.stack.Failed():
		err = fmt.Errorf("the stack can no longer carry the pod's traffic: %w", err)
		d.log.Error("shutting down for a restart", "err", err)
	}
	// The governor reads the stack and the node's load: it stops first.
	cancel()
	<-governed
	d.ctl.Close()
	d.stack.Close()
	if d.nodeCPU != nil {
		d.nodeCPU.close()
	}
	return err
}

// Healthy implements control.Source: nil when traffic can flow through
// the stack (podstack.Stack.Healthy).
func (d *Daemon) Healthy() error { return d.stack.Healthy() }

// Status implements control.Source.
func (d *Daemon) Status() any {
	s := control.Status{
		Protocol: control.Protocol, Build: control.Build(), SpecVersion: podnet.SpecVersion, ConfigVersion: stackconfig.Version,
		PID: os.Getpid(), StartTime: d.started, IfName: d.cfg.IfName, TUNName: d.cfg.TUNName, WireNetns: d.cfg.WireNetns,
		Spec: d.spec, GSO: d.gso, Relay: d.stack.Relay.Stats().Snapshot(), Threads: d.threadsStatus(),
	}
	if err := d.Healthy(); err != nil {
		s.Problem = err.Error()
	} else {
		s.Healthy = true
	}
	ws := d.stack.Wire.Stats()
	drops := d.link.Drops()
	d.socketDrops.Add(drops.Link)
	d.synSocketDrops.Add(drops.SYN)
	d.fragSocketDrops.Add(drops.Fragments)
	s.Wire = control.LegStatus{LinkCounters: d.stack.WireStats.Snapshot(), TCPRetransmits: ws.TCP.Retransmits.Value(),
		DroppedPackets: ws.DroppedPackets.Value(), TCPCurrentEstablished: ws.TCP.CurrentEstablished.Value(),
		SocketDrops: d.socketDrops.Load(), SynSocketDrops: d.synSocketDrops.Load(), FragSocketDrops: d.fragSocketDrops.Load(),
		SynCookiesSent: ws.TCP.ListenOverflowSynCookieSent.Value(), SynCookiesValid: ws.TCP.ListenOverflowSynCookieRcvd.Value(),
		SynCookiesInvalid: ws.TCP.ListenOverflowInvalidSynCookieRcvd.Value(),
		ListenSynDrops:    ws.TCP.ListenOverflowSynDrop.Value(), ListenAckDrops: ws.TCP.ListenOverflowAckDrop.Value(),
		IPMalformed: ws.IP.MalformedPacketsReceived.Value(), IPOutgoingErrors: ws.IP.OutgoingPacketErrors.Value(),
		TCPInvalidSegments: ws.TCP.InvalidSegmentsReceived.Value(), TCPChecksumErrors: ws.TCP.ChecksumErrors.Value()}
	if d.policy != nil {
		ps := d.policy.Status()
		s.Policy = &ps
	}
	if b := d.stack.Busy; b != nil {
		st := b.Stats()
		_, auto := d.cfg.BusyPollWindow()
		s.BusyPoll = &control.BusyPollStatus{Window: b.Window().String(), Auto: auto, On: b.Enabled(),
			Enabled: st.Enabled.Load(), Windows: st.Windows.Load(), Handoffs: st.Handoffs.Load(), Polls: st.Polls.Load()}
	}
	return s
}

// SetPolicy implements control.PolicySetter: the node agent's push.
func (d *Daemon) SetPolicy(p *policy.PodPolicy) (uint64, error) {
	if d.policy == nil {
		return 0, policy.ErrOff
	}
	if err := d.policy.Set(p); err != nil {
		return 0, err
	}
	logPolicyInForce(d.log, p)
	// Decoding and compiling a large policy leaves garbage that an idle
	// stack keeps until its next collection: an idle stack with a
	// 1,000-rule policy each way held 1.5 MiB more RSS than one without
	// (hack/bench/run.sh, rows usernet-policy1k and usernet-hardware,
	// before any traffic). Pushes are rare, the release cheap.
	go ReleaseFreeHeap()
	return p.Generation, nil
}

// CaptureHandler implements control.Capturer: `cni-usernet capture`
// streams the wire leg from here.
func (d *Daemon) CaptureHandler() http.Handler { return d.stack.Capture }
