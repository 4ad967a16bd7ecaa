package main

import (
	"strings"
	"testing"
)

// TestViolations: each rule catches what it forbids, and the tree's
// own layout passes.
func TestViolations(t *testing.T) {
	m := Module + "/"
	for _, c := range []struct {
		name string
		pkg  Package
		want string // "" : no violation
	}{
		{"plugin links the stack", Package{m + "pkg/cni", []string{m + "pkg/api/control", m + "pkg/stack/relay"}}, "pkg/stack/relay"},
		{"plugin's binary links netstack", Package{m + "cmd/cni-usernet", []string{"gvisor.dev/gvisor/pkg/tcpip"}}, "gvisor.dev/gvisor/pkg/tcpip"},
		{"plugin links client-go", Package{m + "pkg/cni", []string{"k8s.io/client-go/kubernetes"}}, "client-go"},
		{"agent links client-go", Package{m + "pkg/agent", []string{"k8s.io/client-go/kubernetes"}}, ""},
		{"contract links the agent", Package{m + "pkg/api/control", []string{m + "pkg/agent/metrics"}}, "pkg/agent/metrics"},
		{"contract links node code", Package{m + "pkg/api/netconf", []string{m + "pkg/node/shaping"}}, "pkg/node/shaping"},
		{"contract links the stack's enforcement", Package{m + "pkg/api/policy", []string{m + "pkg/stack/enforce"}}, "pkg/stack/enforce"},
		{"node code links a contract", Package{m + "pkg/node/podkernel", []string{m + "pkg/api/podnet"}}, ""},
		{"stack links the plugin", Package{m + "pkg/stack/podstack", []string{m + "pkg/cni"}}, "pkg/cni"},
		{"stack links netstack", Package{m + "pkg/stack/podstack", []string{"gvisor.dev/gvisor/pkg/tcpip/stack"}}, ""},
		{"plugin's binary links the agent's installer", Package{m + "cmd/cni-usernet", []string{m + "pkg/node/install", m + "pkg/agent/install"}}, "pkg/agent/install"},
		{"a command links the agent", Package{m + "pkg/cli/status", []string{m + "pkg/agent/metrics"}}, "pkg/agent/metrics"},
		{"plugin links the agent", Package{m + "pkg/cni", []string{m + "pkg/agent"}}, "pkg/agent"},
		{"agent's binary links the agent", Package{m + "cmd/cni-usernet-agent", []string{m + "pkg/agent", m + "pkg/node/install"}}, ""},
		{"agent links the plugin", Package{m + "pkg/agent", []string{m + "pkg/cni"}}, "pkg/cni"},
		{"a name that only starts like a group", Package{m + "pkg/cnitool", []string{m + "pkg/stack"}}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := strings.Join(Violations([]Package{c.pkg}), "\n")
			if c.want == "" && got != "" {
				t.Errorf("violation reported: %s", got)
			}
			if c.want != "" && !strings.Contains(got, c.want) {
				t.Errorf("got %q, want a violation naming %s", got, c.want)
			}
		})
	}
}

func TestTreeKeepsTheRule(t *testing.T) {
	pkgs, err := list(Module+"/cmd/...", Module+"/pkg/...")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range Violations(pkgs) {
		t.Error(v)
	}
}
