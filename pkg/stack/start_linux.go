package stack

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
	"github.com/cni-usernet/cni-usernet/pkg/node/podkernel"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
	"github.com/cni-usernet/cni-usernet/pkg/stack/podstack"
	"github.com/cni-usernet/cni-usernet/pkg/stack/relay"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirelink/packetsock"
	"github.com/cni-usernet/cni-usernet/pkg/util/steptime"
)

// Start takes the interface over and brings the stack up: the pod's link
// in cfg.WireNetns (the stack's own namespace), the applications' side in
// the current one, the pod's. When it returns nil the stack carries
// traffic; on an error, the descriptors it opened are closed and
// everything it did to the kernel is left, so that a retry (or the
// plugin's cleanup) finds the spec and can finish or undo.
func Start(cfg stackconfig.Config, log *slog.Logger) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: log, started: time.Now(), Startup: steptime.Start()}
	wire, err := openWire(cfg.WireNetns)
	if err != nil {
		return nil, err
	}
	defer wire.close()
	// The SYN socket's ring costs a grace period of waiting, not work: it
	// is opened while the steps below run.
	synOpen := openSYNAhead(wire, cfg.IfName)
	defer synOpen.discard()
	if err := d.loadSpec(wire); err != nil {
		return nil, err
	}
	d.Startup.Done("spec")
	if err := wire.do(d.takeLink); err != nil {
		return nil, err
	}
	d.Startup.Done("fence")
	var u undo
	defer u.run()
	pod, err := d.openPod()
	if err != nil {
		return nil, err
	}
	u.add(pod.Close)
	if d.link, err = d.openLink(wire, synOpen); err != nil {
		return nil, err
	}
	u.add(d.link.Close)
	d.Startup.Done("packetSocket")
	if d.stack, err = d.buildStack(pod, d.link); err != nil {
		return nil, err
	}
	// The stack owns the pod side and the link from here.
	u = undo{d.stack.Close}
	d.Startup.Done("netstack")
	if d.ctl, err = control.Listen(cfg.ControlSocket, d); err != nil {
		return nil, err
	}
	d.Startup.Done("control")
	u = nil
	return d, nil
}

// undo collects what reverses the steps Start took so far; run, deferred,
// undoes them in reverse unless Start cleared the list on success.
type undo []func()

func (u *undo) add(f func()) { *u = append(*u, f) }

func (u *undo) run() {
	for _, f := range slices.Backward(*u) {
		f()
	}
}

// loadSpec reads the pod's spec (collecting it from the link in the wire
// namespace the first time) and the policy the stack starts with. The
// policy is in force before the link is enabled: a restarted stack is
// closed where it was closed from its first frame.
func (d *Daemon) loadSpec(wire wireNS) error {
	if err := wire.do(func() (err error) { d.spec, err = loadOrCollect(d.cfg); return err }); err != nil {
		return err
	}
	if !d.cfg.Policy {
		return nil
	}
	var err error
	d.policy, err = startPolicy(d.cfg.PolicyPath, d.spec, d.log)
	return err
}

// openPod opens the applications' side in the pod's namespace: the TUN,
// configured from the spec, and the relay's listeners and divert
// (openPodSide). On error nothing of it is left open.
func (d *Daemon) openPod() (*relay.PodSide, error) {
	tun, err := podkernel.OpenTUN(d.cfg.TUNName)
	if err != nil {
		return nil, err
	}
	if err := podkernel.ConfigureTUN(d.cfg.TUNName, d.cfg.TUNMTU, d.spec); err != nil {
		tun.Close()
		return nil, err
	}
	d.Startup.Done("tun")
	return openPodSide(tun, d.spec, d.Startup)
}

// buildStack assembles the pod's stack on the pod side and the link; it
// owns both once it returns nil.
func (d *Daemon) buildStack(pod *relay.PodSide, link *packetsock.Link) (*podstack.Stack, error) {
	cfg := d.cfg
	wireQueue := cfg.WireQueueLen
	if d.gso.Mode == offload.ModeOff {
		wireQueue = 0
	}
	busyPoll, auto := cfg.BusyPollWindow()
	return podstack.Build(podstack.Options{
		Spec:              d.spec,
		Link:              link,
		Pod:               *pod,
		GSO:               d.gso,
		GRO:               cfg.GRO,
		VerifyRXChecksums: cfg.VerifyRXChecksums,
		WireQueueLen:      wireQueue,
		Policy:            d.policy,
		BusyPoll:          busyPoll,
		BusyPollOff:       auto,
		Relay: relay.Options{
			MaxTCP:  cfg.MaxTCP,
			MaxUDP:  cfg.MaxUDP,
			UDPIdle: time.Duration(cfg.UDPIdle),
			Logger:  d.log,
		},
	})
}

// startPolicy is the policy a stack starts with: the node agent's file,
// or, until the agent's first push, policy.Closed with the node being the
// spec's gateways (the host side of the pod's link, where kubelet's
// probes come from). An unreadable file closes the pod too: open would
// be the wrong way to fail.
func startPolicy(path string, spec *podnet.Spec, log *slog.Logger) (*enforce.Enforcer, error) {
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
	e, err := enforce.NewEnforcer(p)
	if err != nil {
		return nil, fmt.Errorf("network policy: %w", err)
	}
	logPolicyInForce(log, p)
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
	spec, err = podkernel.Collect(cfg.IfName)
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

// pendingSYN is a SYN socket being opened in the background.
type pendingSYN struct {
	done  chan struct{}
	s     *packetsock.SYNSocket
	err   error
	taken bool
}

// openSYNAhead opens ifName's SYN socket in the wire namespace, in the
// background.
func openSYNAhead(wire wireNS, ifName string) *pendingSYN {
	return startPending(func() (s *packetsock.SYNSocket, err error) {
		err = wire.do(func() error {
			s, err = packetsock.NewSYNSocket(packetsock.Options{IfName: ifName})
			return err
		})
		return s, err
	})
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
