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
}

// Validate checks Options.
func (o Options) Validate() error {
	if o.Self == "" {
		return errors.New("node routes: no node name")
	}
	if o.Protocol < 0 || o.Protocol > 255 || (o.Protocol > 0 && o.Protocol <= unix.RTPROT_STATIC) {
		return fmt.Errorf("node routes: protocol %d: want 5..255 (0-4 belong to the kernel and iproute2)", o.Protocol)
	}
	return nil
}

// Status is the outcome of one Sync: the routes in place and the pod
// CIDRs that have none.
type Status struct {
	Routes   []Route   `json:"routes"`
	Problems []Problem `json:"problems,omitempty"`
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
}

// New returns a Manager; it changes nothing until Sync.
func New(o Options) (*Manager, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Protocol == 0 {
		o.Protocol = DefaultProtocol
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{opts: o, log: log.With("component", "noderoutes"), reported: map[Problem]bool{}}, nil
}

// kernelRoute is a planned route resolved against the node's links.
type kernelRoute struct {
	Route
	link int
}

// Sync makes the node's routes of our protocol exactly those the nodes
// call for: collect (plan, resolve each next hop, read our routes), then
// act (delete, replace). It goes on past a failed change and returns all
// failures; problems are not errors, they are in the Status and logged.
func (m *Manager) Sync(nodes []Node) (Status, error) {
	planned, probs := Plan(m.opts.Self, nodes)
	var want []kernelRoute
	for _, r := range planned {
		link, why := m.nextHop(r.Via)
		if why == "" {
			why = m.foreignRoute(r.Dst)
		}
		if why != "" {
			probs = append(probs, Problem{Node: r.Node, Dst: r.Dst, Reason: why})
			continue
		}
		want = append(want, kernelRoute{r, link})
	}
	have, err := m.list()
	if err != nil {
		return Status{Problems: probs}, err
	}

	var errs []error
	wanted := map[netip.Prefix]kernelRoute{}
	for _, w := range want {
		wanted[w.Dst] = w
	}
	for dst, h := range have {
		if w, ok := wanted[dst]; ok && w.Via == h.Via && w.link == h.link {
			continue
		}
		if _, ok := wanted[dst]; ok {
			continue // replaced below
		}
		if err := m.del(h); err != nil {
			errs = append(errs, err)
		} else {
			m.log.Info("route removed", "dst", dst, "via", h.Via)
		}
	}
	var st Status
	for _, w := range want {
		if h, ok := have[w.Dst]; ok && h.Via == w.Via && h.link == w.link {
			st.Routes = append(st.Routes, w.Route)
			continue
		}
		if err := netlink.RouteReplace(m.nl(w)); err != nil {
			errs = append(errs, fmt.Errorf("adding route %s: %w", w.Route, err))
			probs = append(probs, Problem{Node: w.Node, Dst: w.Dst, Reason: "adding the route failed: " + err.Error()})
			continue
		}
		m.log.Info("route added", "dst", w.Dst, "via", w.Via, "node", w.Node)
		st.Routes = append(st.Routes, w.Route)
	}
	st.Problems = probs
	m.report(probs)
	return st, errors.Join(errs...)
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

// RemoveAll deletes every route of our protocol (uninstall). Routes
// already gone are success.
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
	return errors.Join(errs...)
}

func (m *Manager) list() (map[netip.Prefix]kernelRoute, error) {
	rs, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL,
		&netlink.Route{Protocol: netlink.RouteProtocol(m.opts.Protocol), Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing routes of protocol %d: %w", m.opts.Protocol, err)
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
		out[dst] = kernelRoute{Route{Dst: dst, Via: via.Unmap()}, r.LinkIndex}
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
