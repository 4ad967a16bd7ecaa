package agent

import (
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/agent/noderoutes"
)

func TestRouteFlags(t *testing.T) {
	f, err := parseAgentFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	o, err := f.routeOptions()
	if err != nil {
		t.Fatal(err)
	}
	if o.Encapsulation != noderoutes.EncapAuto || o.VXLANPort != 4789 || o.VXLANVNI != 4097 || o.PodMTU != 0 {
		t.Errorf("defaults %+v, want auto, port 4789, VNI 4097, the pods' MTU automatic (0)", o)
	}
	f, err = parseAgentFlags([]string{"--encapsulation=never", "--vxlan-port=8472", "--vxlan-vni=7", "--mtu=1400"})
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := f.routeOptions(); o.Encapsulation != noderoutes.EncapNever || o.VXLANPort != 8472 || o.VXLANVNI != 7 || o.PodMTU != 1400 {
		t.Errorf("options %+v from the flags", o)
	}
	for _, bad := range [][]string{{"--encapsulation=ipip"}, {"--vxlan-port=0"}, {"--vxlan-port=65536"}, {"--vxlan-vni=0"}, {"--vxlan-vni=16777216"}, {"--mtu=575"}, {"--mtu=65536"}, {"--mtu=-1"}} {
		if _, err := parseAgentFlags(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
