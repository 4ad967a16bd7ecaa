package main

import (
	"reflect"
	"testing"

	"github.com/cni-usernet/cni-usernet/hack/bench/report"
)

func TestParseCPULimits(t *testing.T) {
	got, err := parseCPULimits("100m, 0.5,2,max")
	if err != nil {
		t.Fatal(err)
	}
	want := []cpuLimit{{"100m", 0.1}, {"0.5", 0.5}, {"2", 2}, {"max", 0}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got, err := parseCPULimits(""); err != nil || len(got) != 0 {
		t.Errorf("empty: got %v, %v; want none, nil", got, err)
	}
	for _, bad := range []string{"5m", "0", "-1", "1.5m", "one", "100m,100m", "1000"} {
		if _, err := parseCPULimits(bad); err == nil {
			t.Errorf("%q: got no error", bad)
		}
	}
}

// A row under a limit is compared with the kernel veth under the same
// limit, never with the unlimited kernel row.
func TestLimitRatios(t *testing.T) {
	b := &bench{samples: []report.Sample{
		{Round: 1, Config: "kernel", Metric: "tcp_n2p_gbps", Value: 20},
		{Round: 1, Config: "kernel@100m", Metric: "tcp_n2p_gbps", Value: 4},
		{Round: 1, Config: "usernet-hardware@100m", Metric: "tcp_n2p_gbps", Value: 1},
		{Round: 1, Config: "usernet-hardware", Metric: "tcp_n2p_gbps", Value: 10},
	}}
	cells := b.cells()
	for _, c := range []struct {
		row  string
		want float64
	}{{"usernet-hardware@100m", 0.25}, {"usernet-hardware", 0.5}, {"kernel@100m", 1}} {
		if r := cells[c.row]["tcp_n2p_gbps"].Ratio; r == nil || *r != c.want {
			t.Errorf("%s: got ratio %v, want %v", c.row, r, c.want)
		}
	}
	if cfg, l, ok := limitOf("usernet-hardware@0.5"); !ok || cfg != "usernet-hardware" || l != "0.5" {
		t.Errorf("limitOf: got %q %q %v, want usernet-hardware 0.5 true", cfg, l, ok)
	}
}

// A redirect mode is measured under the limits when the run has it, and
// leaves no skipped row behind when it does not.
func TestLimitConfigNames(t *testing.T) {
	b := &bench{o: options{Only: []string{"kernel", "usernet-hardware", "usernet-hardware-redirectboth"}}}
	if got, want := b.limitConfigNames(), []string{"kernel", "usernet-hardware", "usernet-hardware-redirectboth"}; !reflect.DeepEqual(got, want) {
		t.Errorf("with the redirect mode selected: %v, want %v", got, want)
	}
	b = &bench{o: options{Only: []string{"kernel", "usernet-hardware"}}}
	if got, want := b.limitConfigNames(), []string{"kernel", "usernet-hardware"}; !reflect.DeepEqual(got, want) {
		t.Errorf("without it: %v, want %v", got, want)
	}
}
