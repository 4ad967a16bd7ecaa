package podkernel

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TUNOwner is the owner OpenTUN gives the pod's TUN: the largest valid
// uid, which no image's users take and which a runtime's user-namespace
// ranges leave alone. The kernel lets a process attach to a TUN that has
// an owner only when its effective uid is the owner or it holds
// CAP_NET_ADMIN (tun_not_capable); without one, any process that opens
// /dev/net/tun could take the persistent TUN while its stack restarts and
// keep the stack from coming back. The stack attaches during its setup,
// with its capabilities.
const TUNOwner = 1<<32 - 2

// OpenTUN creates (or re-attaches to) the persistent TUN device name and
// gives it TUNOwner. The device is persistent so that the pod's kernel
// addresses and routes on it survive a crash of the stack: a restarted
// stack re-attaches and the applications' sockets never see the pod IP
// vanish. Only what the divert rules leave in it crosses it
// (podnet.Divert), so it carries no offload.
func OpenTUN(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUN name %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("creating TUN %s: %w", name, err)
	}
	// Set at every attach: a TUN an earlier stack left without an owner
	// gets one too.
	if err := unix.IoctlSetInt(fd, unix.TUNSETOWNER, TUNOwner); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("giving TUN %s its owner: %w", name, err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("making TUN %s persistent: %w", name, err)
	}
	// Non-blocking, so that Go's poller serves reads and Close ends them.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("making TUN %s non-blocking: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// DeleteTUN removes the TUN device; already gone is success, and so is a
// link of that name that is no TUN: the pod's interface is a TUN named
// CNI_IFNAME, but in a namespace shaped by an earlier release the same
// name is the pod's veth, which its own teardown decides on.
func DeleteTUN(name string) error {
	link, err := netlinksafe.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if _, ok := link.(*netlink.Tuntap); !ok {
		return nil
	}
	if err := netlink.LinkDel(link); err != nil {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// ConfigureTUN gives the TUN device the pod's addresses and routes so that
// the applications' traffic reaches the stack through it. Traffic to the
// pod's own IPs and to loopback stays in the kernel (local table). It is
// idempotent, for a restarted stack.
func ConfigureTUN(name string, mtu uint32, s *podnet.Spec) error {
	link, err := netlinksafe.LinkByName(name)
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if err := netlink.LinkSetMTU(link, int(mtu)); err != nil {
		return fmt.Errorf("setting MTU %d on %s: %w", mtu, name, err)
	}
	// The TUN must accept packets for any address: the stack writes replies
	// from remote peers to the pod IP, which the kernel's reverse-path
	// filter would drop if it checked them.
	_ = os.WriteFile("/proc/sys/net/ipv4/conf/"+name+"/rp_filter", []byte("0"), 0o644)
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/accept_ra", []byte("0"), 0o644)
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("bringing %s up: %w", name, err)
	}
	for _, p := range s.PodIPs() {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrReplace(link, a); err != nil {
			return fmt.Errorf("adding %s to %s: %w", p, name, err)
		}
	}
	for _, r := range s.Routes {
		nr := &netlink.Route{
			LinkIndex: link.Attrs().Index,
			Dst:       &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())},
			Scope:     netlink.SCOPE_LINK,
			// The gateway is the wire stack's business; in the kernel every
			// destination is simply "into the TUN".
		}
		if r.Dst.Addr().Is6() {
			nr.Scope = netlink.SCOPE_UNIVERSE
		}
		if err := netlink.RouteReplace(nr); err != nil {
			return fmt.Errorf("adding route %s via %s: %w", r.Dst, name, err)
		}
	}
	return nil
}
