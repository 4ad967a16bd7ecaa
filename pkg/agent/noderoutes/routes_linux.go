package noderoutes

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultProtocol is the routing protocol number our routes carry
// (`ip route show proto 117`). Unassigned in iproute2's rt_protos and
// used by none of the CNIs we know of (Calico uses 80, flannel 0/boot,
// bird 12 and 186-192); it only has to tell our routes from everyone else's.
const DefaultProtocol = 117

// Options configure a Manager. The zero value of each field is described
// with it.
type Options struct {
	// Self is this node's name. Required.
	Self string
	// Protocol marks our routes. Zero: DefaultProtocol.
	Protocol int
	// Log receives each route change and each problem (once, until it
	// changes). Nil discards.
	Log *slog.Logger
	// Encapsulation decides which peers are reached through VXLAN. Zero:
	// EncapAuto.
	Encapsulation Encapsulation
	// VXLANPort is the VXLAN devices' UDP port. Zero: DefaultVXLANPort.
	VXLANPort int
	// VXLANVNI is the VXLAN network identifier. Zero: DefaultVXLANVNI.
	VXLANVNI int
	// PodMTU is the pods' MTU (the agent's --mtu, or the one PodMTU
	// chose): a VXLAN device with a smaller MTU is noted in the Status.
	// Zero: not checked.
	PodMTU int
	// PodMTUSource says how PodMTU was chosen (MTUChoice.Source), shown
	// with it in the Status. Empty: not shown.
	PodMTUSource string
}

// Validate checks Options.
func (o Options) Validate() error {
	if o.Self == "" {
		return errors.New("node routes: no node name")
	}
	if o.Protocol < 0 || o.Protocol > 255 || (o.Protocol > 0 && o.Protocol <= unix.RTPROT_STATIC) {
		return fmt.Errorf("node routes: protocol %d: want 5..255 (0-4 belong to the kernel and iproute2)", o.Protocol)
	}
	if _, err := ParseEncapsulation(string(o.Encapsulation)); err != nil {
		return fmt.Errorf("node routes: %w", err)
	}
	if o.VXLANPort < 0 || o.VXLANPort > 65535 {
		return fmt.Errorf("node routes: VXLAN port %d: want 1..65535", o.VXLANPort)
	}
	if o.VXLANVNI < 0 || o.VXLANVNI >= 1<<24 {
		return fmt.Errorf("node routes: VXLAN VNI %d: want 1..16777215", o.VXLANVNI)
	}
	return nil
}

// Status is the outcome of one Sync: the routes in place and the pod
// CIDRs that have none.
type Status struct {
	Routes   []Route   `json:"routes"`
	Problems []Problem `json:"problems,omitempty"`
	// Notes are what works but wants the operator's attention.
	Notes []Note `json:"notes,omitempty"`
	// PodMTU is the pods' MTU and how it was chosen (Options.PodMTU and
	// PodMTUSource); zero when the Options name none.
	PodMTU MTUChoice `json:"podMTU,omitzero"`
}

// Note is a remark on a working setup: Topic "mtu" when the pods' MTU
// is larger than a VXLAN device's (large packets to pods on VXLAN peers
// are dropped or fragmented).
type Note struct {
	Topic   string `json:"topic"`
	Message string `json:"message"`
}

// Manager keeps the node's routes to other nodes' pod CIDRs, in the
// network namespace of the thread that calls it (the agent's, which is
// the node's: hostNetwork).
type Manager struct {
	opts Options
	log  *slog.Logger
	// reported holds the problems last logged, so that a steady problem
	// is said once, not at every sync. Only Sync touches it.
	reported map[Problem]bool
	// noted holds the notes last logged, likewise.
	noted map[Note]bool
}

// New returns a Manager; it changes nothing until Sync.
func New(o Options) (*Manager, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Protocol == 0 {
		o.Protocol = DefaultProtocol
	}
	o.Encapsulation, _ = ParseEncapsulation(string(o.Encapsulation))
	if o.VXLANPort == 0 {
		o.VXLANPort = DefaultVXLANPort
	}
	if o.VXLANVNI == 0 {
		o.VXLANVNI = DefaultVXLANVNI
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{opts: o, log: log.With("component", "noderoutes"), reported: map[Problem]bool{}, noted: map[Note]bool{}}, nil
}

// kernelRoute is a planned route resolved against the node's links.
type kernelRoute struct {
	Route
	link   int
	onlink bool
}

func (k kernelRoute) same(h kernelRoute) bool {
	return k.Via == h.Via && k.link == h.link && k.onlink == h.onlink
}

// Sync makes the node's routes of our protocol, and the VXLAN devices
// with their peers, exactly those the nodes call for: collect (plan,
// resolve each next hop, read our routes), then act (devices, their
// peers, then delete and replace routes). It goes on past a failed change
// and returns all failures; problems are not errors, they are in the
// Status and logged.
func (m *Manager) Sync(nodes []Node) (Status, error) {
	nw, err := m.network()
	if err != nil {
		return Status{}, err
	}
	planned, probs := Plan(m.opts.Self, nodes, nw)
	devs, vprobs, err := m.overlay(nodes, planned)
	probs = append(probs, vprobs...)
	errs := []error{err}
	want, wprobs := m.resolve(planned, devs)
	probs = append(probs, wprobs...)
	for v4, d := range devs {
		var peers []kernelRoute
		for _, w := range want {
			if w.Kind == VXLAN && w.Dst.Addr().Is4() == v4 {
				peers = append(peers, w)
			}
		}
		errs = append(errs, m.syncPeers(d.link, d.fam, peers))
	}
	st, aprobs, err := m.apply(want)
	st.Problems = append(probs, aprobs...)
	st.Notes = m.mtuNotes(devs)
	if m.opts.PodMTUSource != "" {
		st.PodMTU = MTUChoice{MTU: m.opts.PodMTU, Source: m.opts.PodMTUSource}
	}
	m.report(st.Problems)
	m.remark(st.Notes)
	return st, errors.Join(append(errs, err)...)
}

// resolve turns planned routes into kernel routes: a direct one's next
// hop must be on a link, a VXLAN one's InternalIP reachable and its
// family's device in place, and no route of someone else's in the way.
func (m *Manager) resolve(planned []Route, devs map[bool]device) ([]kernelRoute, []Problem) {
	var want []kernelRoute
	var probs []Problem
	for _, r := range planned {
		var k kernelRoute
		var why string
		if r.Kind == VXLAN {
			d, ok := devs[r.Dst.Addr().Is4()]
			if !ok {
				continue // a problem of its family already
			}
			k = kernelRoute{r, d.link, true}
			why = m.underlayHop(r.Underlay)
		} else {
			k.Route = r
			k.link, why = m.nextHop(r.Via)
		}
		if why == "" {
			why = m.foreignRoute(r.Dst)
		}
		if why != "" {
			probs = append(probs, Problem{Node: r.Node, Dst: r.Dst, Reason: why})
			continue
		}
		want = append(want, k)
	}
	return want, probs
}

// apply makes our routes exactly want: deletes the others, replaces the
// changed. A route the kernel refuses is a problem as well as an error.
func (m *Manager) apply(want []kernelRoute) (Status, []Problem, error) {
	have, err := m.list()
	if err != nil {
		return Status{}, nil, err
	}
	var errs []error
	var probs []Problem
	wanted := map[netip.Prefix]kernelRoute{}
	for _, w := range want {
		wanted[w.Dst] = w
	}
	for dst, h := range have {
		if _, ok := wanted[dst]; ok {
			continue // kept or replaced below
		}
		if err := m.del(h); err != nil {
			errs = append(errs, err)
		} else {
			m.log.Info("route removed", "dst", dst, "via", h.Via)
		}
	}
	var st Status
	for _, w := range want {
		if h, ok := have[w.Dst]; ok && w.same(h) {
			st.Routes = append(st.Routes, w.Route)
			continue
		}
		if err := netlink.RouteReplace(m.nl(w)); err != nil {
			errs = append(errs, fmt.Errorf("adding route %s: %w", w.Route, err))
			probs = append(probs, Problem{Node: w.Node, Dst: w.Dst, Reason: "adding the route failed: " + err.Error()})
			continue
		}
		m.log.Info("route added", "dst", w.Dst, "via", w.Via, "node", w.Node, "kind", w.Kind, "reason", w.Reason)
		st.Routes = append(st.Routes, w.Route)
	}
	return st, probs, errors.Join(errs...)
}

// network reads what Plan needs of this node: its connected subnets,
// the prefixes of the addresses on its links (not our VXLAN devices').
func (m *Manager) network() (Network, error) {
	nw := Network{Encap: m.opts.Encapsulation}
	addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nw, fmt.Errorf("listing this node's addresses: %w", err)
	}
	ours := map[int]bool{}
	for _, name := range []string{vxlanName4, vxlanName6} {
		if l, err := netlink.LinkByName(name); err == nil {
			ours[l.Attrs().Index] = true
		}
	}
	for _, a := range addrs {
		if ours[a.LinkIndex] || a.IPNet == nil {
			continue
		}
		if p, ok := netipPrefix(a.IPNet); ok && !p.Addr().IsLoopback() {
			nw.OnLink = append(nw.OnLink, p)
		}
	}
	// A link route without a gateway reaches its destinations on the
	// link as well: a node whose address is a /32 (on lo, or on a NIC)
	// with a route to its neighbour over a link shares that link with
	// it, whatever the prefixes of the addresses say. (IPv6 has no route
	// scopes: every IPv6 route is "universe", a gateway-less unicast
	// one is on the link.)
	routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nw, fmt.Errorf("listing this node's routes: %w", err)
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nw, fmt.Errorf("listing this node's links: %w", err)
	}
	loopback := map[int]bool{}
	for _, l := range links {
		if l.Attrs().Flags&net.FlagLoopback != 0 {
			loopback[l.Attrs().Index] = true
		}
	}
	for _, r := range routes {
		if r.Gw != nil || len(r.MultiPath) > 0 || r.Dst == nil || ours[r.LinkIndex] || loopback[r.LinkIndex] || r.Type != unix.RTN_UNICAST {
			continue
		}
		if r.Dst.IP.To4() != nil && r.Scope != netlink.SCOPE_LINK {
			continue
		}
		if p, ok := netipPrefix(r.Dst); ok {
			nw.OnLink = append(nw.OnLink, p)
		}
	}
	return nw, nil
}

// remark logs each note once.
func (m *Manager) remark(notes []Note) {
	now := map[Note]bool{}
	for _, n := range notes {
		now[n] = true
		if !m.noted[n] {
			m.log.Warn(n.Message, "topic", n.Topic)
		}
	}
	m.noted = now
}

// report logs each problem once, and says when one is gone.
func (m *Manager) report(probs []Problem) {
	now := map[Problem]bool{}
	for _, p := range probs {
		now[p] = true
		if !m.reported[p] {
			m.log.Warn("pods of another node are unreachable from this node: it needs an overlay or a primary CNI (cni-usernet --mode chain)",
				"node", p.Node, "podCIDR", p.Dst, "reason", p.Reason)
		}
	}
	for p := range m.reported {
		if !now[p] {
			m.log.Info("problem cleared", "node", p.Node, "podCIDR", p.Dst, "was", p.Reason)
		}
	}
	m.reported = now
}

// nextHop says on which link via is directly reachable, or why it is not.
func (m *Manager) nextHop(via netip.Addr) (link int, why string) {
	rs, err := netlink.RouteGet(net.IP(via.AsSlice()))
	if err != nil || len(rs) == 0 {
		return 0, fmt.Sprintf("no route to its InternalIP %s (%v)", via, err)
	}
	r := rs[0]
	switch {
	case r.Type == unix.RTN_LOCAL:
		return 0, fmt.Sprintf("its InternalIP %s is an address of this node", via)
	case r.Gw != nil:
		return 0, fmt.Sprintf("its InternalIP %s is reached through the router %s, not on a link this node shares (host-gw routing needs one)", via, r.Gw)
	case r.Type != unix.RTN_UNICAST:
		return 0, fmt.Sprintf("its InternalIP %s is not reachable by unicast (route type %d)", via, r.Type)
	}
	return r.LinkIndex, ""
}

// foreignRoute names a route to dst in the main table that is not ours:
// someone else (an overlay, an administrator) routes those pods, and we
// leave it alone.
func (m *Manager) foreignRoute(dst netip.Prefix) string {
	ipn := prefixNet(dst)
	rs, err := netlinksafe.RouteListFiltered(family(dst.Addr()), &netlink.Route{Dst: ipn, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		return ""
	}
	for _, r := range rs {
		if int(r.Protocol) != m.opts.Protocol {
			name := ""
			if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				name = " dev " + l.Attrs().Name
			}
			return fmt.Sprintf("a route to %s that cni-usernet did not make is there (proto %d%s): left alone", dst, r.Protocol, name)
		}
	}
	return ""
}

// Current lists the routes of our protocol in the main table.
func (m *Manager) Current() ([]Route, error) {
	have, err := m.list()
	if err != nil {
		return nil, err
	}
	var out []Route
	for _, h := range have {
		out = append(out, h.Route)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dst.String() < out[j].Dst.String() })
	return out, nil
}

// RemoveAll deletes every route of our protocol and the VXLAN devices
// (uninstall). Routes and devices already gone are success.
func (m *Manager) RemoveAll() error {
	have, err := m.list()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range have {
		if err := m.del(h); err != nil {
			errs = append(errs, err)
		} else {
			m.log.Info("route removed", "dst", h.Dst, "via", h.Via)
		}
	}
	for _, name := range []string{vxlanName4, vxlanName6} {
		if err := m.removeVTEP(name); err != nil {
			errs = append(errs, err)
		}
	}
	if err := m.removeGuard(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (m *Manager) list() (map[netip.Prefix]kernelRoute, error) {
	rs, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL,
		&netlink.Route{Protocol: netlink.RouteProtocol(m.opts.Protocol), Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing routes of protocol %d: %w", m.opts.Protocol, err)
	}
	tunnels := map[int]bool{}
	for _, name := range []string{vxlanName4, vxlanName6} {
		if l, err := netlink.LinkByName(name); err == nil {
			tunnels[l.Attrs().Index] = true
		}
	}
	out := map[netip.Prefix]kernelRoute{}
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		dst, ok := netipPrefix(r.Dst)
		if !ok {
			continue
		}
		via, _ := netip.AddrFromSlice(r.Gw)
		kind := Direct
		if tunnels[r.LinkIndex] {
			kind = VXLAN
		}
		out[dst] = kernelRoute{Route{Dst: dst, Via: via.Unmap(), Kind: kind}, r.LinkIndex, r.Flags&int(netlink.FLAG_ONLINK) != 0}
	}
	return out, nil
}

func (m *Manager) del(h kernelRoute) error {
	err := netlink.RouteDel(m.nl(h))
	if err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("removing route %s via %s: %w", h.Dst, h.Via, err)
	}
	return nil
}

func (m *Manager) nl(r kernelRoute) *netlink.Route {
	nr := &netlink.Route{
		Dst:       prefixNet(r.Dst),
		LinkIndex: r.link,
		Protocol:  netlink.RouteProtocol(m.opts.Protocol),
		Table:     unix.RT_TABLE_MAIN,
		Family:    family(r.Dst.Addr()),
	}
	if r.Via.IsValid() {
		nr.Gw = net.IP(r.Via.AsSlice())
	}
	if r.onlink {
		nr.Flags = int(netlink.FLAG_ONLINK)
	}
	return nr
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func prefixNet(p netip.Prefix) *net.IPNet {
	p = p.Masked()
	bits := 128
	if p.Addr().Is4() {
		bits = 32
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

func netipPrefix(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}
