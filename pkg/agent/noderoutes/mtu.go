package noderoutes

import (
	"fmt"
	"net/netip"

	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
)

// DefaultLinkMTU is the underlay's MTU assumed when no link of the node
// says: Ethernet's.
const DefaultLinkMTU = 1500

// The pods' MTU the plugin accepts (podnet.MinMTU and the rest).
const (
	minPodMTU4 = podnet.MinMTU
	minPodMTU6 = podnet.MinMTUv6
	maxPodMTU  = podnet.MaxMTU
)

// MTUOptions are what the pods' MTU is chosen from (PodMTU). The zero
// value of each field is described with it.
type MTUOptions struct {
	// MTU is the operator's choice (the agent's --mtu), taken as it is.
	// Zero: chosen from the node's links.
	MTU int
	// Encapsulation is the node routes' (--encapsulation): unless it is
	// EncapNever, the VXLAN overhead is left for, since with EncapAuto a
	// node may join from another subnet at any time and the pods' MTU
	// must already fit its tunnel. Zero: EncapAuto.
	Encapsulation Encapsulation
	// InternalIPs are this node's: the link holding one is the VXLAN
	// devices' underlay and, for peers on its subnet, the direct routes'
	// link. Empty: only the default routes' links count.
	InternalIPs []netip.Addr
	// PodCIDRs are this node's pod subnets: their families are those of
	// the underlays the pods' packets may be tunnelled over (a VXLAN
	// route's underlay is of its pod CIDR's family). Empty: both
	// families.
	PodCIDRs []netip.Prefix
}

// MTUChoice is the pods' MTU and how it was chosen, for the log and the
// node routes' Status.
type MTUChoice struct {
	MTU int `json:"mtu"`
	// Source says how: "--mtu", or "auto: " with the link, its MTU and
	// the overhead taken off ("auto: eth0 (IPv4 default route) 1500 - 50
	// VXLAN over IPv4").
	Source string `json:"source"`
}

// underlayLink is a link of the node that may carry the pods' packets to
// another node, in one family.
type underlayLink struct {
	name string
	mtu  int
	v4   bool
	// why it counts: "IPv4 default route", "InternalIP 10.0.0.1".
	why string
}

// vxlanOverhead is what VXLAN adds to a pod's packet over an underlay of
// the family.
func vxlanOverhead(v4 bool) int {
	if v4 {
		return vxlanOverhead4
	}
	return vxlanOverhead6
}

func familyName(v4 bool) string {
	if v4 {
		return "IPv4"
	}
	return "IPv6"
}

// chooseMTU is PodMTU's decision over the links collected: per family of
// the pods, each link of the family less that family's VXLAN overhead
// (none with EncapNever); the smallest wins. Calico chooses the same way
// (the smallest host link, less the largest overhead of an enabled
// encapsulation). No link: DefaultLinkMTU less the largest overhead.
func chooseMTU(o MTUOptions, links []underlayLink) (MTUChoice, error) {
	if o.MTU != 0 {
		return MTUChoice{MTU: o.MTU, Source: "--mtu"}, nil
	}
	want := map[bool]bool{}
	for _, c := range o.PodCIDRs {
		want[c.Addr().Is4()] = true
	}
	if len(want) == 0 {
		want[true], want[false] = true, true
	}
	encap := o.Encapsulation != EncapNever
	overhead := func(v4 bool) int {
		if !encap {
			return 0
		}
		return vxlanOverhead(v4)
	}
	describe := func(base string, v4 bool) string {
		if !encap {
			return "auto: " + base + ", no encapsulation (--encapsulation never)"
		}
		return fmt.Sprintf("auto: %s - %d VXLAN over %s", base, vxlanOverhead(v4), familyName(v4))
	}
	var c MTUChoice
	for _, l := range links {
		if !want[l.v4] {
			continue
		}
		if m := l.mtu - overhead(l.v4); c.MTU == 0 || m < c.MTU {
			c = MTUChoice{MTU: m, Source: describe(fmt.Sprintf("%s (%s) %d", l.name, l.why, l.mtu), l.v4)}
		}
	}
	if c.MTU == 0 {
		v4 := !want[false] // IPv6's overhead is the larger
		c = MTUChoice{MTU: DefaultLinkMTU - overhead(v4),
			Source: describe(fmt.Sprintf("no link but loopback carries the node's InternalIP or a default route, %d", DefaultLinkMTU), v4)}
	}
	c.MTU = min(c.MTU, maxPodMTU)
	lowest := minPodMTU4
	if want[false] && len(o.PodCIDRs) > 0 {
		lowest = minPodMTU6
	}
	if c.MTU < lowest {
		return c, fmt.Errorf("the pods' MTU would be %d (%s), below the %d the pods need: set --mtu, or a larger MTU on the link", c.MTU, c.Source, lowest)
	}
	return c, nil
}
