package netpolicy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// serviceTable is every address and port at which kube-proxy would send
// a pod's connection to a Service's endpoints instead (cluster IPs,
// external IPs, load balancer IPs; node ports on this node's addresses),
// with the ready backends, indexed so that a pod's egress rules find the
// entries they can reach without looking at the others. Built once per
// Compiler; read-only after.
type serviceTable struct {
	// entries are sorted by address, port and protocol; a node port's
	// entry has no address (vip.Addr() invalid) and sorts first: it is
	// one per address of the node, which a pod's compile is given.
	entries []serviceEntry
	// byBackend is every entry's backends by address; at, the entries
	// with a backend or the address at each address, for the peers of
	// one address (most peers: a selected pod's).
	byBackend []backendRef
	at        map[netip.Addr][]int
	// nodePorts are the indexes of the node ports' entries.
	nodePorts []int
	warnings  []Warning
}

// serviceEntry is one address and port of a Service.
type serviceEntry struct {
	svc      string // the Service, "namespace/name"
	name     string // policy.Service.Name
	proto    policy.Protocol
	vip      netip.AddrPort
	v4       bool // the address family of a node port's entry
	backends []policy.Backend
}

type backendRef struct {
	addr  netip.Addr
	entry int
}

// serviceTable is built on the first pod whose egress is isolated, or
// taken from the Compiler's ServiceTables when it was built from the same
// objects.
func (c *Compiler) serviceTable() *serviceTable {
	c.servicesOnce.Do(func() {
		if c.tables != nil {
			c.services = c.tables.get(c.snap)
		} else {
			c.services = newServiceTable(c.snap)
		}
	})
	return c.services
}

// ServiceTables keeps the last service table an agent's rounds built, for
// the next round to take when the cluster's Services and EndpointSlices
// are the same objects: cached objects are never changed, a change is a
// new object, so the same objects make the same table. At 10k Services a
// table is ~35 MB of allocations and most of a round's CPU, and most
// rounds (a label, a policy, a pod) change no Service. It is safe for
// concurrent use.
type ServiceTables struct {
	mu     sync.Mutex
	svcs   map[string]*Service
	slices map[string]*EndpointSlice
	table  *serviceTable
}

func (m *ServiceTables) get(snap *Snapshot) *serviceTable {
	m.mu.Lock()
	if m.table != nil && samePointers(m.svcs, snap.Services) && samePointers(m.slices, snap.EndpointSlices) {
		defer m.mu.Unlock()
		return m.table
	}
	m.mu.Unlock()
	t := newServiceTable(snap)
	m.mu.Lock()
	// A snapshot's maps are its own, never changed: they can be kept.
	m.svcs, m.slices, m.table = snap.Services, snap.EndpointSlices, t
	m.mu.Unlock()
	return t
}

func samePointers[T any](a, b map[string]*T) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// ServiceKeyOfSlice is the Service ("namespace/name") an EndpointSlice
// belongs to; "" for none.
func ServiceKeyOfSlice(es *EndpointSlice) string {
	if es == nil || es.Metadata.Labels[ServiceNameLabel] == "" {
		return ""
	}
	return es.Metadata.Namespace + "/" + es.Metadata.Labels[ServiceNameLabel]
}

func newServiceTable(snap *Snapshot) *serviceTable {
	slicesOf := make(map[string][]*EndpointSlice)
	for _, es := range snap.EndpointSlices {
		if k := ServiceKeyOfSlice(es); k != "" {
			slicesOf[k] = append(slicesOf[k], es)
		}
	}
	t := &serviceTable{}
	for key, svc := range snap.Services {
		if svc == nil {
			continue
		}
		name := objectKey(svc.Metadata, key)
		t.addService(name, svc, slicesOf[name])
	}
	slices.SortFunc(t.entries, func(a, b serviceEntry) int {
		return cmp.Or(a.vip.Compare(b.vip), strings.Compare(string(a.proto), string(b.proto)),
			cmp.Compare(a.svc, b.svc), strings.Compare(a.name, b.name))
	})
	t.at = make(map[netip.Addr][]int)
	for i, e := range t.entries {
		if !e.vip.Addr().IsValid() {
			t.nodePorts = append(t.nodePorts, i)
		} else {
			t.at[e.vip.Addr()] = append(t.at[e.vip.Addr()], i)
		}
		for _, b := range e.backends {
			t.byBackend = append(t.byBackend, backendRef{b.Addr.Addr(), i})
			t.at[b.Addr.Addr()] = append(t.at[b.Addr.Addr()], i)
		}
	}
	slices.SortFunc(t.byBackend, func(a, b backendRef) int { return cmp.Or(a.addr.Compare(b.addr), cmp.Compare(a.entry, b.entry)) })
	slices.SortFunc(t.warnings, func(a, b Warning) int {
		return cmp.Or(strings.Compare(a.Object, b.Object), strings.Compare(a.Message, b.Message))
	})
	return t
}

// addService adds the entries of one Service: per port, each cluster IP
// (a headless Service has none), each external IP, each load balancer
// IP kube-proxy short-cuts (type LoadBalancer, not ipMode Proxy), and
// the node port per address family, each with the ready backends of its
// address family.
func (t *serviceTable) addService(name string, svc *Service, eps []*EndpointSlice) {
	warn := func(format string, args ...any) {
		t.warnings = append(t.warnings, Warning{Object: name, Message: fmt.Sprintf(format, args...)})
	}
	parse := func(what string, ips []string) []netip.Addr {
		var out []netip.Addr
		for _, ip := range ips {
			if ip == "None" || ip == "" {
				continue
			}
			a, err := netip.ParseAddr(ip)
			if err != nil {
				warn("%s %q: %v, skipped", what, ip, err)
				continue
			}
			out = append(out, a.Unmap().WithZone(""))
		}
		return out
	}
	clusterIPs := parse("cluster IP", svc.Spec.ClusterIPs)
	addrs := append(slices.Clone(clusterIPs), parse("external IP", svc.Spec.ExternalIPs)...)
	if svc.Spec.Type == "LoadBalancer" {
		var lb []string
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if in.IPMode != "Proxy" {
				lb = append(lb, in.IP)
			}
		}
		addrs = append(addrs, parse("load balancer IP", lb)...)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	for _, sp := range svc.Spec.Ports {
		proto := policy.Protocol(cmp.Or(sp.Protocol, string(policy.TCP)))
		if proto.Number() == 0 || sp.Port < 1 || sp.Port > 65535 {
			warn("port %q %s/%d unusable, skipped", sp.Name, sp.Protocol, sp.Port)
			continue
		}
		portName := name + ":" + cmp.Or(sp.Name, strconv.Itoa(int(sp.Port)))
		var byFamily [2][]policy.Backend // IPv4, IPv6
		var have [2]bool
		family := func(v4 bool) []policy.Backend {
			i := 1
			if v4 {
				i = 0
			}
			if !have[i] {
				byFamily[i], have[i] = backends(eps, v4, sp.Name, proto), true
			}
			return byFamily[i]
		}
		for _, a := range addrs {
			t.entries = append(t.entries, serviceEntry{svc: name, name: portName, proto: proto,
				vip: netip.AddrPortFrom(a, uint16(sp.Port)), v4: a.Is4(), backends: family(a.Is4())})
		}
		if sp.NodePort > 0 && sp.NodePort <= 65535 && (svc.Spec.Type == "NodePort" || svc.Spec.Type == "LoadBalancer") {
			// kube-proxy answers a node port for each family the
			// Service has, with that family's endpoints.
			for _, v4 := range []bool{true, false} {
				if slices.ContainsFunc(clusterIPs, func(a netip.Addr) bool { return a.Is4() == v4 }) {
					t.entries = append(t.entries, serviceEntry{svc: name, name: portName, proto: proto,
						vip: netip.AddrPortFrom(netip.Addr{}, uint16(sp.NodePort)), v4: v4, backends: family(v4)})
				}
			}
		}
	}
}

// forPod is the Services a pod whose egress rules are rules (compiled into
// egress) must carry: each entry with a backend the rules admit, with
// those backends only (the stack would pick among them alone); and, with
// no backend admitted, each entry whose own address and port the rules
// admit, without backends, so that the stack denies it as kube-proxy's
// translation would (a connection to it reaches a backend, all denied),
// rather than judge it as the plain address it is not. Every other entry
// is left out: its address is judged as itself and no rule admits it,
// as none admits its backends. node are this node's addresses, where
// the node ports are answered; svcs the Services carried.
func (t *serviceTable) forPod(egress *policy.Matcher, rules []policy.Rule, node []netip.Addr) (out []policy.Service, svcs map[string]bool) {
	cand := t.candidates(rules, node)
	allows := func(a netip.AddrPort, proto policy.Protocol) bool {
		ok, _ := egress.Allow(policy.Egress, a.Addr(), proto.Number(), a.Port())
		return ok
	}
	add := func(e *serviceEntry, vip netip.AddrPort) {
		var admitted []policy.Backend
		for _, b := range e.backends {
			if allows(b.Addr, e.proto) {
				admitted = append(admitted, b)
			}
		}
		switch {
		case len(admitted) == 0 && !allows(vip, e.proto):
			return
		case len(admitted) > 0 && len(admitted) == len(e.backends):
			admitted = e.backends // shared, read-only
		}
		out = append(out, policy.Service{Name: e.name, Protocol: e.proto, VIP: vip, Backends: admitted})
		if svcs == nil {
			svcs = map[string]bool{}
		}
		svcs[e.svc] = true
	}
	for _, i := range cand {
		e := &t.entries[i]
		if e.vip.Addr().IsValid() {
			add(e, e.vip)
			continue
		}
		for _, a := range node {
			if a.Is4() == e.v4 {
				add(e, netip.AddrPortFrom(a, e.vip.Port()))
			}
		}
	}
	slices.SortStableFunc(out, func(a, b policy.Service) int {
		return cmp.Or(a.VIP.Compare(b.VIP), strings.Compare(string(a.Protocol), string(b.Protocol)))
	})
	return out, svcs
}

// candidates are the entries (indexes, ascending) whose backends or
// address a rule's peers hold: the only ones the rules can admit
// anything of. A rule without peers holds every address.
func (t *serviceTable) candidates(rules []policy.Rule, node []netip.Addr) []int {
	// Rules share their peers (a policy's peers, named ports' groups):
	// each block is looked up once.
	blocks := make(map[netip.Prefix]bool)
	for _, r := range rules {
		if len(r.Peers) == 0 {
			all := make([]int, len(t.entries))
			for i := range all {
				all[i] = i
			}
			return all
		}
		for _, p := range r.Peers {
			blocks[p.CIDR.Masked()] = true
		}
	}
	mark := make(map[int]bool)
	for p := range blocks {
		if p.IsSingleIP() {
			for _, i := range t.at[p.Addr()] {
				mark[i] = true
			}
		} else {
			lo := p.Addr()
			i, _ := slices.BinarySearchFunc(t.byBackend, lo, func(b backendRef, a netip.Addr) int { return b.addr.Compare(a) })
			for ; i < len(t.byBackend) && p.Contains(t.byBackend[i].addr); i++ {
				mark[t.byBackend[i].entry] = true
			}
			// Entries with an address come after the node ports.
			n := len(t.nodePorts)
			j, _ := slices.BinarySearchFunc(t.entries[n:], lo, func(e serviceEntry, a netip.Addr) int { return e.vip.Addr().Compare(a) })
			for j += n; j < len(t.entries) && p.Contains(t.entries[j].vip.Addr()); j++ {
				mark[j] = true
			}
		}
		if slices.ContainsFunc(node, p.Contains) {
			for _, k := range t.nodePorts {
				mark[k] = true
			}
		}
	}
	out := make([]int, 0, len(mark))
	for i := range mark {
		out = append(out, i)
	}
	slices.Sort(out)
	return out
}

// backends is the ready endpoints of a Service port: the EndpointSlices'
// port of the same name and protocol, on the addresses of the VIP's family.
func backends(eps []*EndpointSlice, v4 bool, portName string, proto policy.Protocol) []policy.Backend {
	family := "IPv6"
	if v4 {
		family = "IPv4"
	}
	var out []policy.Backend
	for _, es := range eps {
		if es.AddressType != "" && es.AddressType != family {
			continue
		}
		for _, ep := range es.Ports {
			if ep.Port == nil || *ep.Port < 1 || *ep.Port > 65535 {
				continue
			}
			name, p := "", policy.TCP
			if ep.Name != nil {
				name = *ep.Name
			}
			if ep.Protocol != nil {
				p = policy.Protocol(*ep.Protocol)
			}
			if name != portName || p != proto {
				continue
			}
			for _, e := range es.Endpoints {
				if e.Conditions.Ready != nil && !*e.Conditions.Ready {
					continue
				}
				for _, s := range e.Addresses {
					a, err := netip.ParseAddr(s)
					if err != nil {
						continue
					}
					if a = a.Unmap().WithZone(""); a.Is4() == v4 {
						out = append(out, policy.Backend{Addr: netip.AddrPortFrom(a, uint16(*ep.Port))})
					}
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b policy.Backend) int { return a.Addr.Compare(b.Addr) })
	return slices.Compact(out)
}
