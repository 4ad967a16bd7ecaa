package netconf

import (
	"strings"
	"testing"
)

func TestLimitsValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		l    Limits
		want string // "" for valid
	}{
		{"nothing", Limits{}, ""},
		{"both", Limits{IngressRate: 10e6, IngressBurst: 1 << 30, EgressRate: 50e6, EgressBurst: 1 << 30}, ""},
		{"ingress without burst", Limits{IngressRate: 10e6}, "ingressRate 10000000 bit/s needs a ingressBurst"},
		{"egress without burst", Limits{EgressRate: 10e6}, "needs a egressBurst"},
		{"below a byte", Limits{EgressRate: 7, EgressBurst: 100}, "below one byte per second"},
		{"burst past 32 bits of bytes", Limits{IngressRate: 10e6, IngressBurst: 1 << 40}, "ingressBurst 1099511627776 bits is too large"},
		{"burst without rate is ignored", Limits{IngressBurst: 1 << 20}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.l.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Errorf("got %v, want valid", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("got %v, want an error with %q", err, c.want)
			}
		})
	}
}
