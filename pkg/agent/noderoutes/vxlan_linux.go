package noderoutes

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The VXLAN devices, one per underlay family, each only while a peer of
// that family needs it. Everything on them is ours: their neighbour and
// FDB entries are the record of the peers, as our routes are.
const (
	vxlanName4 = "usernet.vxlan"
	vxlanName6 = "usernet.vxlan6"
)

// DefaultVXLANPort is IANA's VXLAN port.
const DefaultVXLANPort = 4789

// DefaultVXLANVNI is not flannel's 1, so that a flannel chained on the
// same nodes never shares our network.
const DefaultVXLANVNI = 4097

// Encapsulation overheads: outer IP, UDP (8), VXLAN (8) and the inner
// Ethernet header (14).
const (
	vxlanOverhead4 = 20 + 8 + 8 + 14
	vxlanOverhead6 = 40 + 8 + 8 + 14
)

// vtep is one family's VXLAN device as this node wants it.
type vtep struct {
	name  string
	fam   int
	local netip.Addr
	// addr is this node's pod CIDR network address (flannel's
	// podCIDR.0): the source of the node's own packets to peers' pods,
	// so that their replies come back through the tunnel. Invalid when
	// the node has no pod CIDR of the family.
	addr     netip.Addr
	underlay int
	mtu      int
}

func vxlanName(v4 bool) string {
	if v4 {
		return vxlanName4
	}
	return vxlanName6
}

// wantVTEP is the device a family's VXLAN routes need, or why there can
// be none: the node's InternalIP of the family must be an address on one
// of its links (the underlay).
func (m *Manager) wantVTEP(self Node, v4 bool) (vtep, string) {
	local, ok := sameFamily(self.InternalIPs, v4)
	if !ok {
		return vtep{}, "this node has no InternalIP of the family for VXLAN"
	}
	v := vtep{name: vxlanName(v4), fam: family(local), local: local}
	for _, c := range self.PodCIDRs {
		if c.Addr().Is4() == v4 {
			v.addr = c.Masked().Addr()
			break
		}
	}
	addrs, err := netlinksafe.AddrList(nil, v.fam)
	if err != nil {
		return vtep{}, fmt.Sprintf("listing this node's addresses: %v", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == local {
			v.underlay = a.LinkIndex
		}
	}
	l, err := netlink.LinkByIndex(v.underlay)
	if v.underlay == 0 || err != nil {
		return vtep{}, fmt.Sprintf("this node's InternalIP %s is on none of its links (VXLAN's local end)", local)
	}
	v.mtu = l.Attrs().MTU - vxlanOverhead4
	if !v4 {
		v.mtu = l.Attrs().MTU - vxlanOverhead6
	}
	if l.Attrs().Flags&net.FlagLoopback != 0 {
		// An InternalIP on lo (a /32 beside the real links, as on the
		// project's lab): lo's 65536 bytes are no path's MTU, and a
		// tunnel that size would have the node fragment every large
		// packet on the real link. The pods' MTU was chosen for the
		// real links less the overhead (PodMTU): the tunnel carries
		// exactly the pods' packets.
		v.mtu = DefaultLinkMTU - vxlanOverhead4
		if !v4 {
			v.mtu = DefaultLinkMTU - vxlanOverhead6
		}
		if m.opts.PodMTU > 0 {
			v.mtu = m.opts.PodMTU
		}
	}
	return v, ""
}

// ensureVTEP makes the device v exist, up, with its MTU and address; a
// device of the name with other tunnel parameters is made anew.
func (m *Manager) ensureVTEP(v vtep) (int, error) {
	mac := macOf(v.local)
	l, err := netlink.LinkByName(v.name)
	if err != nil && !errors.As(err, &netlink.LinkNotFoundError{}) {
		return 0, fmt.Errorf("looking for %s: %w", v.name, err)
	}
	if err == nil {
		x, ok := l.(*netlink.Vxlan)
		if !ok || x.VxlanId != m.opts.VXLANVNI || x.Port != m.opts.VXLANPort || !x.SrcAddr.Equal(v.local.AsSlice()) ||
			x.VtepDevIndex != v.underlay || x.Learning || !bytes.Equal(x.HardwareAddr, mac) {
			if err := netlink.LinkDel(l); err != nil {
				return 0, fmt.Errorf("removing %s to make it anew: %w", v.name, err)
			}
			m.log.Info("VXLAN device removed to make it anew", "dev", v.name)
			l = nil
		}
	} else {
		l = nil
	}
	if l == nil {
		la := netlink.NewLinkAttrs()
		la.Name, la.MTU, la.HardwareAddr = v.name, v.mtu, mac
		x := &netlink.Vxlan{LinkAttrs: la, VxlanId: m.opts.VXLANVNI, VtepDevIndex: v.underlay,
			SrcAddr: net.IP(v.local.AsSlice()), Port: m.opts.VXLANPort, Learning: false}
		if err := netlink.LinkAdd(x); err != nil {
			return 0, fmt.Errorf("creating the VXLAN device %s: %w", v.name, err)
		}
		if l, err = netlink.LinkByName(v.name); err != nil {
			return 0, fmt.Errorf("reading back %s: %w", v.name, err)
		}
		m.log.Info("VXLAN device created", "dev", v.name, "local", v.local, "vni", m.opts.VXLANVNI, "port", m.opts.VXLANPort, "mtu", v.mtu)
	}
	if l.Attrs().MTU != v.mtu {
		if err := netlink.LinkSetMTU(l, v.mtu); err != nil {
			return 0, fmt.Errorf("setting the MTU of %s to %d: %w", v.name, v.mtu, err)
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(l); err != nil {
			return 0, fmt.Errorf("bringing %s up: %w", v.name, err)
		}
	}
	return l.Attrs().Index, m.syncVTEPAddr(l, v)
}

// syncVTEPAddr leaves v.addr (host prefix) the device's only global
// address.
func (m *Manager) syncVTEPAddr(l netlink.Link, v vtep) error {
	addrs, err := netlinksafe.AddrList(l, v.fam)
	if err != nil {
		return fmt.Errorf("listing the addresses of %s: %w", v.name, err)
	}
	have := false
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		if ip.Unmap() == v.addr && ones == v.addr.BitLen() {
			have = true
			continue
		}
		if ip.IsLinkLocalUnicast() {
			continue
		}
		if err := netlink.AddrDel(l, &a); err != nil {
			return fmt.Errorf("removing %s from %s: %w", a.IPNet, v.name, err)
		}
	}
	if have || !v.addr.IsValid() {
		return nil
	}
	pfx := netip.PrefixFrom(v.addr, v.addr.BitLen())
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(pfx)}); err != nil {
		return fmt.Errorf("adding %s to %s: %w", pfx, v.name, err)
	}
	return nil
}

// removeVTEP deletes a family's device, which takes its routes,
// neighbours and FDB entries with it. Absent is success.
func (m *Manager) removeVTEP(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if errors.As(err, &netlink.LinkNotFoundError{}) {
			return nil
		}
		return fmt.Errorf("looking for %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("removing the VXLAN device %s: %w", name, err)
	}
	m.log.Info("VXLAN device removed", "dev", name)
	return nil
}

// overlay keeps the VXLAN side in step with the plan: the port guard
// (before a device listens on the port) and each family's device.
func (m *Manager) overlay(nodes []Node, planned []Route) (map[bool]device, []Problem, error) {
	var err error
	if slices.ContainsFunc(planned, func(r Route) bool { return r.Kind == VXLAN }) {
		err = m.syncGuard(guardFor(m.opts.Self, nodes, m.opts.VXLANPort))
	} else {
		err = m.removeGuard()
	}
	devs, probs, derr := m.vteps(nodes, planned)
	return devs, probs, errors.Join(err, derr)
}

// device is a VXLAN device in place.
type device struct {
	link, fam, mtu int
	name           string
}

// vteps makes the VXLAN device of each family some planned route needs
// and removes the others. A family whose device cannot be had gives a
// problem per route of it.
func (m *Manager) vteps(nodes []Node, planned []Route) (map[bool]device, []Problem, error) {
	var self Node
	for _, n := range nodes {
		if n.Name == m.opts.Self {
			self.InternalIPs = append(self.InternalIPs, n.InternalIPs...)
			self.PodCIDRs = append(self.PodCIDRs, n.PodCIDRs...)
		}
	}
	devs := map[bool]device{}
	var probs []Problem
	var errs []error
	for _, v4 := range []bool{true, false} {
		var need []Route
		for _, r := range planned {
			if r.Kind == VXLAN && r.Dst.Addr().Is4() == v4 {
				need = append(need, r)
			}
		}
		if len(need) == 0 {
			if err := m.removeVTEP(vxlanName(v4)); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		v, why := m.wantVTEP(self, v4)
		if why == "" {
			link, err := m.ensureVTEP(v)
			if err == nil {
				devs[v4] = device{link: link, fam: v.fam, mtu: v.mtu, name: v.name}
				continue
			}
			errs = append(errs, err)
			why = "setting up the VXLAN device failed: " + err.Error()
		} else if err := m.removeVTEP(vxlanName(v4)); err != nil {
			errs = append(errs, err) // a device of an earlier setup would carry stale peers
		}
		for _, r := range need {
			probs = append(probs, Problem{Node: r.Node, Dst: r.Dst, Reason: r.Reason + ", but " + why})
		}
	}
	return devs, probs, errors.Join(errs...)
}

// underlayHop says why the tunnel cannot reach a peer's InternalIP, or
// "" when it can.
func (m *Manager) underlayHop(ip netip.Addr) string {
	rs, err := netlink.RouteGet(net.IP(ip.AsSlice()))
	if err != nil || len(rs) == 0 {
		return fmt.Sprintf("no route to its InternalIP %s (%v)", ip, err)
	}
	if rs[0].Type == unix.RTN_LOCAL {
		return fmt.Sprintf("its InternalIP %s is an address of this node", ip)
	}
	return ""
}

// mtuNotes says when the pods' MTU is larger than a VXLAN device's.
func (m *Manager) mtuNotes(devs map[bool]device) []Note {
	var notes []Note
	for _, v4 := range []bool{true, false} {
		d, ok := devs[v4]
		if !ok || m.opts.PodMTU <= d.mtu {
			continue
		}
		notes = append(notes, Note{Topic: "mtu", Message: fmt.Sprintf(
			"the pods' MTU %d is larger than the VXLAN device %s's %d: set the agent's --mtu to %d, or packets to pods on nodes reached through VXLAN are fragmented or dropped",
			m.opts.PodMTU, d.name, d.mtu, d.mtu)})
	}
	return notes
}

// syncPeers makes the device's permanent neighbour and FDB entries
// exactly those of the VXLAN routes: each peer's device address (its pod
// CIDR's network address) at the MAC derived from its InternalIP, and
// that MAC behind the InternalIP.
func (m *Manager) syncPeers(link, fam int, routes []kernelRoute) error {
	wantNeigh := map[netip.Addr]string{}
	wantFDB := map[string]netip.Addr{}
	for _, r := range routes {
		mac := macOf(r.Underlay)
		wantNeigh[r.Via] = mac.String()
		wantFDB[mac.String()] = r.Underlay
	}
	var errs []error
	neighs, err := neighList(link, fam)
	if err != nil {
		return fmt.Errorf("listing the neighbours of the VXLAN device: %w", err)
	}
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT == 0 {
			continue // the kernel's own (IPv6 multicast): a wanted one is set below
		}
		ip, _ := netip.AddrFromSlice(n.IP)
		ip = ip.Unmap()
		if mac, ok := wantNeigh[ip]; ok && n.HardwareAddr.String() == mac {
			delete(wantNeigh, ip)
			continue
		}
		if _, ok := wantNeigh[ip]; ok {
			continue // replaced below
		}
		if err := netlink.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("removing the neighbour %s: %w", ip, err))
		} else {
			m.log.Info("VXLAN neighbour removed", "ip", ip, "mac", n.HardwareAddr)
		}
	}
	for ip, mac := range wantNeigh {
		hw, _ := net.ParseMAC(mac)
		n := &netlink.Neigh{LinkIndex: link, Family: fam, State: netlink.NUD_PERMANENT, IP: net.IP(ip.AsSlice()), HardwareAddr: hw}
		if err := netlink.NeighSet(n); err != nil {
			errs = append(errs, fmt.Errorf("adding the neighbour %s at %s: %w", ip, mac, err))
		} else {
			m.log.Info("VXLAN neighbour added", "ip", ip, "mac", mac)
		}
	}

	fdb, err := neighList(link, unix.AF_BRIDGE)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("listing the FDB of the VXLAN device: %w", err))...)
	}
	for _, f := range fdb {
		if f.LinkIndex != link {
			continue
		}
		dst, _ := netip.AddrFromSlice(f.IP)
		mac := f.HardwareAddr.String()
		if want, ok := wantFDB[mac]; ok && want == dst.Unmap() {
			delete(wantFDB, mac)
			continue
		}
		if err := netlink.NeighDel(&f); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("removing the FDB entry %s to %s: %w", mac, dst, err))
		} else {
			m.log.Info("VXLAN FDB entry removed", "mac", mac, "dst", dst)
		}
	}
	for mac, dst := range wantFDB {
		hw, _ := net.ParseMAC(mac)
		f := &netlink.Neigh{LinkIndex: link, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
			State: netlink.NUD_PERMANENT, IP: net.IP(dst.AsSlice()), HardwareAddr: hw}
		if err := netlink.NeighSet(f); err != nil {
			errs = append(errs, fmt.Errorf("adding the FDB entry %s to %s: %w", mac, dst, err))
		} else {
			m.log.Info("VXLAN FDB entry added", "mac", mac, "dst", dst)
		}
	}
	return errors.Join(errs...)
}

// neighList is netlink.NeighList, dumped again when the kernel says the
// table changed during the dump.
func neighList(link, fam int) ([]netlink.Neigh, error) {
	var err error
	for range 5 {
		var ns []netlink.Neigh
		ns, err = netlink.NeighList(link, fam)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return ns, err
		}
	}
	return nil, err
}
