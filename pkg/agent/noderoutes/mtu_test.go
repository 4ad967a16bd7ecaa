package noderoutes

import (
	"strings"
	"testing"
)

func TestChooseMTU(t *testing.T) {
	eth := func(mtu int, v4 bool) underlayLink {
		return underlayLink{name: "eth0", mtu: mtu, v4: v4, why: "default route"}
	}
	for _, tc := range []struct {
		name  string
		o     MTUOptions
		links []underlayLink
		want  int
		err   string
	}{
		{"explicit", MTUOptions{MTU: 9000}, []underlayLink{eth(1500, true)}, 9000, ""},
		{"smallest less VXLAN", MTUOptions{PodCIDRs: prefixes("10.244.0.0/24")}, []underlayLink{eth(9000, true), eth(1500, true)}, 1450, ""},
		{"never", MTUOptions{Encapsulation: EncapNever, PodCIDRs: prefixes("10.244.0.0/24")}, []underlayLink{eth(1500, true)}, 1500, ""},
		{"other family's link ignored", MTUOptions{PodCIDRs: prefixes("10.244.0.0/24")}, []underlayLink{eth(9000, true), eth(1280, false)}, 8950, ""},
		{"no pod CIDRs: both families", MTUOptions{}, []underlayLink{eth(1500, true), eth(1500, false)}, 1430, ""},
		{"no link", MTUOptions{PodCIDRs: prefixes("10.244.0.0/24")}, nil, 1450, ""},
		{"no link, IPv6", MTUOptions{PodCIDRs: prefixes("fd10::/64")}, nil, 1430, ""},
		{"no link, never", MTUOptions{Encapsulation: EncapNever}, nil, 1500, ""},
		{"capped", MTUOptions{Encapsulation: EncapNever, PodCIDRs: prefixes("10.244.0.0/24")}, []underlayLink{eth(70000, true)}, 65535, ""},
		{"too small for IPv6", MTUOptions{PodCIDRs: prefixes("fd10::/64")}, []underlayLink{eth(1300, false)}, 0, "below the 1280"},
		{"too small", MTUOptions{PodCIDRs: prefixes("10.244.0.0/24")}, []underlayLink{eth(600, true)}, 0, "below the 576"},
	} {
		c, err := chooseMTU(tc.o, tc.links)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: got %d, %v; want an error saying %q", tc.name, c.MTU, err, tc.err)
			}
			continue
		}
		if err != nil || c.MTU != tc.want {
			t.Errorf("%s: got %d (%s), %v; want %d", tc.name, c.MTU, c.Source, err, tc.want)
		}
	}
}
