package agent

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// TestPluginConfCapabilities: the entry the agent writes, chained or
// standalone, declares the capabilities whose arguments the plugin reads:
// the pod's annotations, its cgroup (the stack is charged to it) and,
// standalone, its bandwidth.
func TestPluginConfCapabilities(t *testing.T) {
	for _, args := range [][]string{
		{"--mode", "chain"},
		{"--mode", "standalone", "--subnet", "10.244.0.0/24"},
	} {
		f, err := parseAgentFlags(args)
		if err != nil {
			t.Fatal(err)
		}
		n := &nodeSetup{f: f}
		plugin, err := n.pluginConf(context.Background())
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		conf, err := libcni.ConfFromBytes(plugin)
		if err != nil {
			t.Fatalf("%v: the entry does not load: %v\n%s", args, err, plugin)
		}
		for _, c := range []string{"io.kubernetes.cri.pod-annotations", "cgroupPath"} {
			if !conf.Network.Capabilities[c] {
				t.Errorf("%v: entry %s: capability %q not declared", args, plugin, c)
			}
		}
		// Standalone, the plugin shapes its pods itself; chained, the
		// bandwidth plugin before it does, and a second shaper must not.
		if got, want := conf.Network.Capabilities["bandwidth"], f.mode == "standalone"; got != want {
			t.Errorf("%v: entry %s: capability bandwidth %v, want %v", args, plugin, got, want)
		}
	}
}

// The conflist's plugin entry asks ADD to wait for the pod's policy when
// the agent enforces it, in both modes; --network-policy=false leaves the
// key out (the primary CNI enforces policy).
func TestPluginConfNetworkPolicy(t *testing.T) {
	f, err := parseAgentFlags(nil)
	if err != nil || !f.networkPolicy {
		t.Fatalf("--network-policy default: got %v (%v), want true", f.networkPolicy, err)
	}
	for _, mode := range []string{"standalone", "chain"} {
		for _, on := range []bool{true, false} {
			f, err := parseAgentFlags([]string{"--mode", mode, "--subnet", "10.244.1.0/24", "--network-policy=" + strconv.FormatBool(on)})
			if err != nil {
				t.Fatal(err)
			}
			b, err := (&nodeSetup{f: f}).pluginConf(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var p map[string]any
			if err := json.Unmarshal(b, &p); err != nil {
				t.Fatal(err)
			}
			if got, ok := p["networkPolicy"]; on && got != true || !on && ok {
				t.Errorf("%s, --network-policy=%v: networkPolicy is %v (present %v)", mode, on, got, ok)
			}
		}
	}
}

// The standalone entry carries the pods' MTU: --mtu as given, or chosen
// from the node's links (noderoutes.PodMTU, tested in namespaces there):
// whatever the links, automatic leaves room for VXLAN's header.
func TestPluginConfMTU(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		want   int
		source string
	}{
		{[]string{"--mtu=1400"}, 1400, "--mtu"},
		{[]string{"--mtu=9000", "--encapsulation=never"}, 9000, "--mtu"},
		{nil, 0, "auto: "},
	} {
		f, err := parseAgentFlags(append([]string{"--mode", "standalone", "--subnet", "10.244.0.0/24"}, tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		n := &nodeSetup{f: f}
		b, err := n.pluginConf(context.Background())
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		var p struct{ MTU int }
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		if p.MTU != n.mtu.MTU || !strings.HasPrefix(n.mtu.Source, tc.source) {
			t.Errorf("%v: conflist MTU %d, chosen %+v; want the chosen one, from %q", tc.args, p.MTU, n.mtu, tc.source)
		}
		if tc.want != 0 && p.MTU != tc.want {
			t.Errorf("%v: MTU %d, want %d", tc.args, p.MTU, tc.want)
		}
		if tc.want == 0 && (p.MTU < 576 || p.MTU > 65535-50) {
			t.Errorf("automatic: MTU %d (%s), want 576..65485", p.MTU, n.mtu.Source)
		}
	}
}
