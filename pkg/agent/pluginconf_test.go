package agent

import (
	"context"
	"encoding/json"
	"strconv"
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
