package stack

// The stack's side of the pod's link, in the namespace that holds it
// (docs/architecture.md, "Where the wire lives").

import (
	"fmt"
	"os"
	"strconv"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/node/ethtool"
	"github.com/cni-usernet/cni-usernet/pkg/node/ingressdrop"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/node/podkernel"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirelink/packetsock"
)

// takeLink decides GSO on the pod's link and takes it from the kernel:
// the ingress drop, then its addresses and routes off. It runs in the
// namespace that holds the link.
func (d *Daemon) takeLink() error {
	cfg, log := d.cfg, d.log
	if cfg.PodLinkOffloadsOff {
		if err := ethtool.LinkOffloadsOff(cfg.IfName); err != nil {
			return err
		}
	}
	link, err := ethtool.Detect(cfg.IfName)
	if err != nil {
		return fmt.Errorf("detecting GSO on %s: %w", cfg.IfName, err)
	}
	if cfg.GSOMaxSize > 0 && cfg.GSOMaxSize < link.MaxSize {
		link.MaxSize = cfg.GSOMaxSize
	}
	if cfg.GSOMaxSegs > 0 && cfg.GSOMaxSegs < link.MaxSegs {
		link.MaxSegs = cfg.GSOMaxSegs
	}
	if d.gso, err = offload.Decide(cfg.GSO, link); err != nil {
		return fmt.Errorf("link %s: %w", cfg.IfName, err)
	}
	log.Info("GSO decided", "mode", d.gso.Mode, "reason", d.gso.Reason)
	if d.gso.Mode == offload.ModeSoftware {
		// The kernel's GSO splits the stack's packets only for a device
		// that cannot take them whole. Where TSO stays on anyway (a
		// device with it fixed on), the device segments instead: the
		// same frames on the wire.
		if err := ethtool.LinkTSOOff(cfg.IfName); err != nil {
			log.Warn("software GSO: TSO stays on, the link segments", "err", err)
		}
	}
	// No ingressdrop.Supported probe first: Install fails just as clearly
	// on a kernel without netdev ingress hooks, and the probe's delete
	// costs a grace period (see package nfttable).
	if err := ingressdrop.Install(cfg.IfName); err != nil {
		return fmt.Errorf("dropping kernel ingress on %s: %w", cfg.IfName, err)
	}
	if err := podkernel.Strip(cfg.IfName); err != nil {
		return fmt.Errorf("taking addresses and routes off %s: %w", cfg.IfName, err)
	}
	return nil
}

// openLink opens the packet sockets on the pod's link (packetsock.OpenLink),
// in the namespace that holds it: a packet socket stays bound to the
// namespace it was made in, wherever its process runs afterwards. Only
// the link's socket is required; the SYN socket is the one synOpen has
// been opening.
func (d *Daemon) openLink(wire wireNS, synOpen *pendingSYN) (*packetsock.Link, error) {
	var link *packetsock.Link
	err := wire.do(func() (err error) {
		link, err = packetsock.OpenLink(packetsock.LinkOptions{
			Options:   packetsock.Options{IfName: d.cfg.IfName, VnetHdr: d.gso.Mode.VnetHdr()},
			SYN:       synOpen.take,
			Fragments: true,
			Send:      true,
			Warn:      func(msg string, err error) { d.log.Warn(msg, "err", err) },
		})
		return err
	})
	return link, err
}

// wireNS is where the pod's link is: the stack's own namespace, or the
// process's (an attachment from before the link had one).
type wireNS struct{ n ns.NetNS }

// openWire opens the stack's own namespace: the descriptor its launcher
// handed over (launch.WireNetnsFD), which reaches a stack started in a
// mount namespace where the pin is not mounted, else the pin at path.
func openWire(path string) (wireNS, error) {
	if path == "" {
		return wireNS{}, nil
	}
	if v, ok := os.LookupEnv(launch.WireNetnsEnv); ok {
		os.Unsetenv(launch.WireNetnsEnv)
		fd, err := strconv.Atoi(v)
		if err != nil || fd < 3 {
			return wireNS{}, fmt.Errorf("%s=%q: not a descriptor", launch.WireNetnsEnv, v)
		}
		n, err := ns.GetNS(fmt.Sprintf("/proc/self/fd/%d", fd))
		unix.Close(fd)
		if err != nil {
			return wireNS{}, fmt.Errorf("opening the wire namespace %s (descriptor %d): %w", path, fd, err)
		}
		return wireNS{n: n}, nil
	}
	n, err := ns.GetNS(path)
	if err != nil {
		return wireNS{}, fmt.Errorf("opening the wire namespace %s: %w", path, err)
	}
	return wireNS{n: n}, nil
}

// do runs f on a thread in the wire namespace. The stack's other threads
// stay in the pod's namespace, which its TUN, divert and transparent
// sockets belong to.
func (w wireNS) do(f func() error) error {
	if w.n == nil {
		return f()
	}
	return w.n.Do(func(ns.NetNS) error { return f() })
}

func (w wireNS) close() {
	if w.n != nil {
		w.n.Close()
	}
}
