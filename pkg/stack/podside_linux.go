package stack

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/node/podkernel"
	"github.com/cni-usernet/cni-usernet/pkg/stack/podsock"
	"github.com/cni-usernet/cni-usernet/pkg/stack/relay"
	"github.com/cni-usernet/cni-usernet/pkg/util/steptime"
)

// listenBacklog is the applications' connections the TCP listener queues
// before the relay accepts them (the kernel caps it at somaxconn).
const listenBacklog = 4096

// openPodSide opens the relay's listeners on loopback, in the pod's
// network namespace and while the process still holds its capabilities
// (transparency needs CAP_NET_RAW), and diverts the applications' TCP and
// UDP to them (podkernel.InstallDivert). IPv6 listeners exist only when the
// pod has an IPv6 address.
func openPodSide(tun *os.File, spec *podnet.Spec, ph *steptime.Steps) (*relay.PodSide, error) {
	p := &relay.PodSide{TUN: tun}
	d := podkernel.Divert{TUN: tun.Name()}
	loopbacks := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	for _, a := range spec.PodIPs() {
		if a.Addr().Is6() {
			loopbacks = append(loopbacks, netip.IPv6Loopback())
			break
		}
	}
	for _, lo := range loopbacks {
		tl, err := podsock.ListenTCP(netip.AddrPortFrom(lo, 0), listenBacklog)
		if err != nil {
			p.Close()
			return nil, err
		}
		p.TCPListeners = append(p.TCPListeners, tl)
		ul, err := podsock.ListenUDP(netip.AddrPortFrom(lo, 0))
		if err != nil {
			p.Close()
			return nil, err
		}
		p.UDPListeners = append(p.UDPListeners, ul)
		tcp := tl.Addr().(*net.TCPAddr).AddrPort()
		udp := ul.LocalAddr().(*net.UDPAddr).AddrPort()
		if lo.Is4() {
			d.TCP4, d.UDP4 = tcp, udp
		} else {
			d.TCP6, d.UDP6 = tcp, udp
		}
	}
	ph.Done("listeners")
	diag, err := podsock.OpenDiag()
	if err != nil {
		p.Close()
		return nil, err
	}
	p.Diag = diag
	if err := podkernel.InstallDivert(d); err != nil {
		p.Close()
		return nil, fmt.Errorf("diverting the applications' traffic to the stack: %w", err)
	}
	ph.Done("divert")
	return p, nil
}
