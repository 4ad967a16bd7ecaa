package rig

import (
	"context"
	"slices"
	"testing"
	"time"
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

// TestOutputCPU: the command's own CPU time comes back with its output,
// its children's included, and waiting costs none.
func TestOutputCPU(t *testing.T) {
	ctx := context.Background()
	out, cpu, err := OutputCPU(ctx, time.Minute, "", "sh", "-c", `sh -c 'i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done'; echo done`)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "done\n" || cpu < 0.05 {
		t.Errorf("a busy child: got output %q, %.3f CPU seconds; want \"done\\n\", at least 0.05", out, cpu)
	}
	if _, cpu, err = OutputCPU(ctx, time.Minute, "", "sleep", "0.5"); err != nil || cpu > 0.1 {
		t.Errorf("sleep 0.5: got %.3f CPU seconds (%v), want under 0.1", cpu, err)
	}
}
