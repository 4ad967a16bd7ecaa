package netpolicy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// serviceList is every Service VIP and port of the cluster with its ready
// backends, sorted by VIP; computed once per Compiler, for the pods whose
// egress is isolated (their stack resolves a VIP to a backend its egress
// rules allow).
func (c *Compiler) serviceList() ([]policy.Service, []Warning) {
	c.servicesOnce.Do(func() { c.services, c.servicesWarnings = compileServices(c.snap) })
	return c.services, c.servicesWarnings
}

func compileServices(snap *Snapshot) ([]policy.Service, []Warning) {
	slicesOf := make(map[string][]*EndpointSlice)
	for _, es := range snap.EndpointSlices {
		if es == nil {
			continue
		}
		if svc := es.Metadata.Labels[ServiceNameLabel]; svc != "" {
			k := es.Metadata.Namespace + "/" + svc
			slicesOf[k] = append(slicesOf[k], es)
		}
	}
	var out []policy.Service
	var warnings []Warning
	for key, svc := range snap.Services {
		if svc == nil {
			continue
		}
		name := objectKey(svc.Metadata, key)
		warn := func(format string, args ...any) {
			warnings = append(warnings, Warning{Object: name, Message: fmt.Sprintf(format, args...)})
		}
		for _, ip := range svc.Spec.ClusterIPs {
			if ip == "None" || ip == "" {
				continue
			}
			vip, err := netip.ParseAddr(ip)
			if err != nil {
				warn("cluster IP %q: %v, skipped", ip, err)
				continue
			}
			vip = vip.Unmap().WithZone("")
			for _, sp := range svc.Spec.Ports {
				proto := policy.Protocol(cmp.Or(sp.Protocol, string(policy.TCP)))
				if proto.Number() == 0 || sp.Port < 1 || sp.Port > 65535 {
					warn("port %q %s/%d unusable, skipped", sp.Name, sp.Protocol, sp.Port)
					continue
				}
				out = append(out, policy.Service{
					Name:     name + ":" + cmp.Or(sp.Name, strconv.Itoa(int(sp.Port))),
					Protocol: proto,
					VIP:      netip.AddrPortFrom(vip, uint16(sp.Port)),
					Backends: backends(slicesOf[name], vip.Is4(), sp.Name, proto),
				})
			}
		}
	}
	slices.SortFunc(out, func(a, b policy.Service) int {
		return cmp.Or(a.VIP.Compare(b.VIP), strings.Compare(string(a.Protocol), string(b.Protocol)))
	})
	slices.SortFunc(warnings, func(a, b Warning) int {
		return cmp.Or(strings.Compare(a.Object, b.Object), strings.Compare(a.Message, b.Message))
	})
	return out, warnings
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
