package main

import (
	"slices"
	"testing"

	"github.com/cni-usernet/cni-usernet/hack/bench/report"
)

func names(cs []report.Row) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// TestCrossNodeSelection: the cross-node rows run in full runs, not in
// --quick (CI), and --only xnode runs them alone.
func TestCrossNodeSelection(t *testing.T) {
	all := []string{"xnode-kernel", "xnode-usernet", "xnode-kernel-vxlan", "xnode-usernet-vxlan"}
	for _, tc := range []struct {
		args []string
		want []string // the cross-node rows selected
		only bool     // and nothing else
	}{
		{[]string{"-bin", "x"}, all, false},
		{[]string{"-bin", "x", "-quick"}, nil, false},
		{[]string{"-bin", "x", "-crossnode=false"}, nil, false},
		{[]string{"-bin", "x", "-quick", "-only", "xnode"}, all, true},
		{[]string{"-bin", "x", "-only", "kernel,xnode-usernet-vxlan"}, []string{"xnode-usernet-vxlan"}, false},
	} {
		o, err := parseOptions(tc.args)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		d := (&bench{o: o}).reportData()
		var got []string
		if d.Cross != nil {
			got = names(d.Cross.Rows)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%v: cross-node rows %v, want %v", tc.args, got, tc.want)
		}
		if tc.only && len(d.PodRows) > 0 {
			t.Errorf("%v: also selected %v", tc.args, names(d.PodRows))
		}
	}
}

// TestCrossNodeRatios: a cross-node row's ratios are to the kernel row
// of its topology.
func TestCrossNodeRatios(t *testing.T) {
	b := &bench{samples: []report.Sample{
		{Round: 1, Config: "kernel", Metric: "redis_set_krps", Value: 100},
		{Round: 1, Config: "xnode-kernel", Metric: "redis_set_krps", Value: 40},
		{Round: 1, Config: "xnode-usernet", Metric: "redis_set_krps", Value: 10},
		{Round: 1, Config: "xnode-kernel-vxlan", Metric: "redis_set_krps", Value: 50},
		{Round: 1, Config: "xnode-usernet-vxlan", Metric: "redis_set_krps", Value: 20},
	}}
	cells := b.cells()
	for cfg, want := range map[string]float64{"xnode-kernel": 1, "xnode-usernet": 0.25, "xnode-kernel-vxlan": 1, "xnode-usernet-vxlan": 0.4} {
		if c := cells[cfg]["redis_set_krps"]; c == nil || c.Ratio == nil || *c.Ratio != want {
			t.Errorf("%s: cell %v, want ratio %v", cfg, c, want)
		}
	}
}

// TestCrossNodeAddresses: the nodes of a row share no address or pod
// CIDR, and a direct row's nodes share a subnet, a vxlan row's do not.
func TestCrossNodeAddresses(t *testing.T) {
	for _, c := range allConfigs {
		if c.CrossNode == "" {
			continue
		}
		n := crossNodes(c)
		if n[0].IP.Addr() == n[1].IP.Addr() || n[0].PodCIDR.Overlaps(n[1].PodCIDR) || n[0].NS == n[1].NS {
			t.Errorf("%s: nodes %+v and %+v overlap", c.Name, n[0], n[1])
		}
		same := n[0].IP.Masked() == n[1].IP.Masked()
		if same != (c.CrossNode == "direct") {
			t.Errorf("%s (%s): nodes on one subnet: %v", c.Name, c.CrossNode, same)
		}
		if c.ratioTo() == c.Name && c.usernet() || configByName(c.ratioTo()).CrossNode != c.CrossNode {
			t.Errorf("%s: ratios to %s", c.Name, c.ratioTo())
		}
	}
}
