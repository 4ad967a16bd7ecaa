package rig

import (
	"context"
	"slices"
	"testing"
)

// TestCommand: the CNI role enters the namespace with nsenter (keeping the
// mount namespace), anything else with ip netns exec, and "" runs here.
func TestCommand(t *testing.T) {
	for _, tc := range []struct {
		ns   string
		argv []string
		want []string
	}{
		{"", []string{"ip", "link"}, []string{"ip", "link"}},
		{"ub-node", []string{"/bench", "cni", "add"}, []string{"nsenter", "--net=/var/run/netns/ub-node", "/bench", "cni", "add"}},
		{"ub-node", []string{"iperf3", "-s"}, []string{"ip", "netns", "exec", "ub-node", "iperf3", "-s"}},
	} {
		if got := Command(context.Background(), tc.ns, tc.argv...).Args; !slices.Equal(got, tc.want) {
			t.Errorf("Command(%q, %v): got %v, want %v", tc.ns, tc.argv, got, tc.want)
		}
	}
}
