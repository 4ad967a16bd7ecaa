// Package stackproc is a pod stack's process: it takes the pod's
// interface over from the kernel, opens the pod side (listeners, the
// divert, the TUN), has pkg/stack/podstack assemble the netstack and the relay,
// serves the control socket, and shuts down. pkg/stack/podstack knows nothing
// of files, sockets on disk or signals.
package stack

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
	"github.com/cni-usernet/cni-usernet/pkg/stack/packetsock"
	"github.com/cni-usernet/cni-usernet/pkg/stack/podstack"
	"github.com/cni-usernet/cni-usernet/pkg/stack/relay"
	"github.com/cni-usernet/cni-usernet/pkg/stack/threads"
	"github.com/cni-usernet/cni-usernet/pkg/util/steptime"
	"golang.org/x/sys/unix"
)

// Daemon is a pod stack process's whole life: take over, serve, shut down.
type Daemon struct {
	linkFD int
	syn    *packetsock.SYNSocket // nil: none
	// socketDrops accumulates packetsock.Drops, which resets on read.
	socketDrops atomic.Uint64
	// synSocketDrops is the same for the SYN socket, fragSocketDrops for
	// the fragment socket (fragFD; 0: none).
	synSocketDrops  atomic.Uint64
	fragFD          int
	fragSocketDrops atomic.Uint64
	cfg             stackconfig.Config
	log             *slog.Logger
	spec            *podnet.Spec
	gso             offload.Decision
	stack           *podstack.Stack
	// policy is the network policy in force; nil when the stack does not
	// enforce policy (stackconfig.Config.Policy).
	policy *policy.Enforcer
	ctl    *control.Server
	// threads follows the load with the thread count; nil: fixed
	// (AdaptThreads).
	threads *threads.Governor
	started time.Time
	// Startup is how long each step of Start took.
	Startup *steptime.Steps
}

// Start takes the interface over and brings the stack up: the pod's link
// in cfg.WireNetns (the stack's own namespace), the applications' side in
// the current one, the pod's. When it returns nil the stack carries traffic; on an
// error, everything it did to the kernel is left so that a retry (or the
// plugin's cleanup) finds the spec and can finish or undo.
func Start(cfg stackconfig.Config, log *slog.Logger) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: log, started: time.Now(), Startup: steptime.Start()}
	ph := d.Startup
	wire, err := openWire(cfg.WireNetns)
	if err != nil {
		return nil, err
	}
	defer wire.close()
	// The SYN socket's ring costs a grace period of waiting, not work: it
	// is opened while the steps below run.
	synOpen := startPending(func() (s *packetsock.SYNSocket, err error) {
		err = wire.do(func() error {
			s, err = packetsock.NewSYNSocket(packetsock.Options{IfName: cfg.IfName})
			return err
		})
		return s, err
	})
	defer synOpen.discard()
	var spec *podnet.Spec
	if err := wire.do(func() (err error) { spec, err = loadOrCollect(cfg); return err }); err != nil {
		return nil, err
	}
	d.spec = spec
	// Before the link is enabled: a restarted stack is closed where it
	// was closed from its first frame.
	if cfg.Policy {
		if d.policy, err = startPolicy(cfg.PolicyPath, spec, log); err != nil {
			return nil, err
		}
	}
	ph.Done("spec")
	if err := wire.do(d.takeLink); err != nil {
		return nil, err
	}
	ph.Done("fence")
	tun, err := podnet.OpenTUN(cfg.TUNName)
	if err != nil {
		return nil, err
	}
	if err := podnet.ConfigureTUN(cfg.TUNName, cfg.TUNMTU, spec); err != nil {
		tun.Close()
		return nil, err
	}
	ph.Done("tun")
	pod, err := openPodSide(tun, spec, ph)
	if err != nil {
		return nil, err
	}
	var socks wireSockets
	if err := wire.do(func() (err error) { socks, err = d.openSockets(synOpen); return err }); err != nil {
		pod.Close()
		return nil, err
	}
	linkFD, txFD, syn, fragFD := socks.link, socks.tx, socks.syn, socks.frag
	d.linkFD, d.syn, d.fragFD = linkFD, syn, fragFD
	ph.Done("packetSocket")
	wireQueue := cfg.WireQueueLen
	if d.gso.Mode == offload.ModeOff {
		wireQueue = 0
	}
	d.stack, err = podstack.Build(podstack.Options{
		Spec:              spec,
		LinkFD:            linkFD,
		TXFD:              txFD,
		SYN:               syn,
		FragmentFD:        fragFD,
		Pod:               *pod,
		GSO:               d.gso,
		GRO:               cfg.GRO,
		VerifyRXChecksums: cfg.VerifyRXChecksums,
		WireQueueLen:      wireQueue,
		Policy:            d.policy,
		BusyPoll:          time.Duration(cfg.BusyPoll),
		Relay: relay.Options{
			MaxTCP:  cfg.MaxTCP,
			MaxUDP:  cfg.MaxUDP,
			UDPIdle: time.Duration(cfg.UDPIdle),
			Logger:  log,
		},
	})
	if err != nil {
		pod.Close()
		unix.Close(linkFD)
		if txFD > 0 {
			unix.Close(txFD)
		}
		if syn != nil {
			syn.Close()
		}
		if fragFD > 0 {
			unix.Close(fragFD)
		}
		return nil, err
	}
	ph.Done("netstack")
	if d.ctl, err = control.Listen(cfg.ControlSocket, d); err != nil {
		d.stack.Close()
		return nil, err
	}
	ph.Done("control")
	return d, nil
}

// startPolicy is the policy a stack starts with: the node agent's file,
// or, until the agent's first push, policy.Closed with the node being the
// spec's gateways (the host side of the pod's link, where kubelet's
// probes come from). An unreadable file closes the pod too: open would
// be the wrong way to fail.
func startPolicy(path string, spec *podnet.Spec, log *slog.Logger) (*policy.Enforcer, error) {
	p, err := policy.ReadFile(path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn("network policy file unusable: closed but to the node until the agent's next push", "err", err)
		}
		var node []netip.Addr
		for _, r := range spec.Routes {
			if r.Gw.IsValid() && !slices.Contains(node, r.Gw) {
				node = append(node, r.Gw)
			}
		}
		p = policy.Closed(node)
	}
	e, err := policy.NewEnforcer(p)
	if err != nil {
		return nil, fmt.Errorf("network policy: %w", err)
	}
	log.Info("network policy in force", "generation", p.Generation,
		"ingressIsolated", p.Ingress.Isolated, "egressIsolated", p.Egress.Isolated)
	return e, nil
}

func loadOrCollect(cfg stackconfig.Config) (*podnet.Spec, error) {
	spec, err := podnet.ReadSpec(cfg.SpecPath)
	if err == nil {
		if spec.IfName != cfg.IfName {
			return nil, fmt.Errorf("spec %s is for %s, not %s", cfg.SpecPath, spec.IfName, cfg.IfName)
		}
		if spec.Version < podnet.SpecVersion {
			// This stack is about to shape the namespace its way: from
			// now on, an older stack must refuse the pod rather than run
			// it in a namespace it does not know (podnet.SpecVersion).
			spec.Version = podnet.SpecVersion
			if err := podnet.WriteSpec(cfg.SpecPath, spec); err != nil {
				return nil, fmt.Errorf("stamping spec %s with version %d: %w", cfg.SpecPath, podnet.SpecVersion, err)
			}
		}
		return spec, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("reading spec: %w", err)
	}
	spec, err = podnet.Collect(cfg.IfName)
	if err != nil {
		return nil, err
	}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("interface %s cannot be taken over: %w", cfg.IfName, err)
	}
	if err := podnet.WriteSpec(cfg.SpecPath, spec); err != nil {
		return nil, fmt.Errorf("saving spec: %w", err)
	}
	return spec, nil
}

// Run blocks until ctx ends, or until the stack can no longer read the
// pod's link (podstack.Stack.Failed), then shuts the stack down; the
// latter is returned, so that the process exits with an error and the node
// agent starts a new stack. The kernel-side configuration (TUN, ingress
// drop) is left in place: a restarted stack re-attaches to it, and DEL
// removes it with the pod.
func (d *Daemon) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go d.releaseWhenQuiet(ctx)
	if d.threads != nil {
		go d.threads.Run(ctx)
	}
	var err error
	select {
	case <-ctx.Done():
		d.log.Info("shutting down")
	case err = <-d.stack.Failed():
		err = fmt.Errorf("the stack no longer receives from the pod's link: %w", err)
		d.log.Error("shutting down for a restart", "err", err)
	}
	d.ctl.Close()
	d.stack.Close()
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
	if n, err := packetsock.Drops(d.linkFD); err == nil {
		d.socketDrops.Add(n)
	}
	if d.syn != nil {
		if n, err := packetsock.Drops(d.syn.FD); err == nil {
			d.synSocketDrops.Add(n)
		}
	}
	if d.fragFD > 0 {
		if n, err := packetsock.Drops(d.fragFD); err == nil {
			d.fragSocketDrops.Add(n)
		}
	}
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
		s.BusyPoll = &control.BusyPollStatus{Window: b.Window().String(), Windows: st.Windows.Load(),
			Handoffs: st.Handoffs.Load(), Polls: st.Polls.Load()}
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
	d.log.Info("network policy in force", "generation", p.Generation,
		"ingressIsolated", p.Ingress.Isolated, "egressIsolated", p.Egress.Isolated)
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

// pendingSYN is a SYN socket being opened in the background.
type pendingSYN struct {
	done  chan struct{}
	s     *packetsock.SYNSocket
	err   error
	taken bool
}

// startPending runs open in the background.
func startPending(open func() (*packetsock.SYNSocket, error)) *pendingSYN {
	p := &pendingSYN{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.s, p.err = open()
	}()
	return p
}

// take waits for the socket; it is the caller's from then on.
func (p *pendingSYN) take() (*packetsock.SYNSocket, error) {
	<-p.done
	p.taken = true
	return p.s, p.err
}

// discard closes the socket if nobody took it (Start failed first).
func (p *pendingSYN) discard() {
	if p.taken {
		return
	}
	<-p.done
	if p.s != nil {
		p.s.Close()
	}
}
