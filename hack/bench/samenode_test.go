// SPDX-License-Identifier: Apache-2.0

package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/cni-usernet/cni-usernet/hack/bench/report"
)

// TestSameNodeSelection: the pod-to-pod rows on one node run in full and
// quick runs, --only pod2pod runs them alone, --pod2pod=false leaves
// them out, and they are neither node→pod nor cross-node rows.
func TestSameNodeSelection(t *testing.T) {
	both := []string{"pod2pod-kernel", "pod2pod-usernet", "pod2pod-usernet-redirect", "pod2pod-usernet-redirectboth", "pod2pod-usernet-direct",
		"pod2pod-kernel-svc", "pod2pod-usernet-svc", "pod2pod-usernet-direct-svc"}
	for _, tc := range []struct {
		args []string
		want []string // the rows of the section of pod to pod on one node
		only bool     // and nothing else
	}{
		{[]string{"-bin", "x"}, both, false},
		{[]string{"-bin", "x", "-quick"}, both, false},
		{[]string{"-bin", "x", "-pod2pod=false"}, nil, false},
		{[]string{"-bin", "x", "-only", "pod2pod"}, both, true},
		{[]string{"-bin", "x", "-quick", "-pod2pod=false", "-only", "pod2pod"}, both, true},
		{[]string{"-bin", "x", "-only", "kernel,pod2pod-usernet"}, []string{"pod2pod-usernet"}, false},
		{[]string{"-bin", "x", "-only", "xnode"}, nil, false},
	} {
		o, err := parseOptions(tc.args)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		d := (&bench{o: o}).reportData()
		var got []string
		if d.SameNode != nil {
			got = names(d.SameNode.Rows)
			if d.SameNode.Baseline != "pod2pod-kernel" {
				t.Errorf("%v: ratios to %q, want pod2pod-kernel", tc.args, d.SameNode.Baseline)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%v: pod-to-pod rows on one node %v, want %v", tc.args, got, tc.want)
		}
		for _, r := range names(d.PodRows) {
			if strings.HasPrefix(r, "pod2pod") {
				t.Errorf("%v: %s among the node→pod rows", tc.args, r)
			}
		}
		if tc.only && (len(d.PodRows) > 0 || d.Cross != nil) {
			t.Errorf("%v: also selected %v and cross-node %v", tc.args, names(d.PodRows), d.Cross)
		}
	}
}

// TestSameNodeRatios: the usernet row's ratios are to the kernel
// pod-to-pod row of the same run, not to the node→pod kernel row.
func TestSameNodeRatios(t *testing.T) {
	b := &bench{samples: []report.Sample{
		{Round: 1, Config: "kernel", Metric: "redis_set_krps", Value: 100},
		{Round: 1, Config: "pod2pod-kernel", Metric: "redis_set_krps", Value: 40},
		{Round: 1, Config: "pod2pod-usernet", Metric: "redis_set_krps", Value: 10},
	}}
	cells := b.cells()
	for cfg, want := range map[string]float64{"pod2pod-kernel": 1, "pod2pod-usernet": 0.25} {
		if c := cells[cfg]["redis_set_krps"]; c == nil || c.Ratio == nil || *c.Ratio != want {
			t.Errorf("%s: cell %v, want ratio %v", cfg, c, want)
		}
	}
}

// TestSameNodeProblems: a pod-to-pod row on one node is held to the
// pod-to-pod columns (a missing per-process CPU cell is a problem, a
// node→pod column such as nginx is not), the stack columns only for
// the usernet row.
func TestSameNodeProblems(t *testing.T) {
	o, err := parseOptions([]string{"-bin", "x", "-only", "pod2pod"})
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{o: o, skipped: map[string]string{}}
	for _, row := range []string{"pod2pod-kernel", "pod2pod-usernet", "pod2pod-usernet-redirect", "pod2pod-usernet-redirectboth", "pod2pod-usernet-direct",
		"pod2pod-kernel-svc", "pod2pod-usernet-svc", "pod2pod-usernet-direct-svc"} {
		for _, m := range report.CrossMetrics {
			if m.Key == "client_cpu_redis" || m.StackOnly && strings.HasPrefix(row, "pod2pod-kernel") {
				continue
			}
			b.samples = append(b.samples, report.Sample{Round: 1, Config: row, Metric: m.Key, Value: 1})
		}
	}
	got := b.problems()
	want := []string{"pod2pod-kernel client_cpu_redis (no error recorded)", "pod2pod-usernet client_cpu_redis (no error recorded)",
		"pod2pod-usernet-redirect client_cpu_redis (no error recorded)", "pod2pod-usernet-redirectboth client_cpu_redis (no error recorded)",
		"pod2pod-usernet-direct client_cpu_redis (no error recorded)", "pod2pod-kernel-svc client_cpu_redis (no error recorded)",
		"pod2pod-usernet-svc client_cpu_redis (no error recorded)", "pod2pod-usernet-direct-svc client_cpu_redis (no error recorded)"}
	if !slices.Equal(got, want) {
		t.Errorf("problems: got %q, want %q", got, want)
	}
}
