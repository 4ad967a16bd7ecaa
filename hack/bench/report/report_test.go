package report

import (
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	if got := Median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median: got %v, want 2.5", got)
	}
	if got := Median([]float64{5, 1, 4}); got != 4 {
		t.Errorf("median: got %v, want 4", got)
	}
}

func TestShortReason(t *testing.T) {
	got := shortReason("redis-benchmark -h 10.199.3.1 -p 6379: exit status 1: Error: Connection reset by peer\n\"test\",\"rps\"")
	if want := "exit status 1: Error: Connection reset by peer"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestTable: a cell shows its median, range and ratio, a stack-only
// column n/a for a row without a stack, and a failed workload its reason.
func TestTable(t *testing.T) {
	samples := []Sample{
		{Round: 1, Config: "kernel", Metric: "tcp_n2p_gbps", Value: 20},
		{Round: 2, Config: "kernel", Metric: "tcp_n2p_gbps", Value: 30},
		{Round: 1, Config: "usernet-hardware", Metric: "tcp_n2p_gbps", Value: 10},
		{Round: 1, Config: "usernet-hardware", Metric: "rss_mib", Value: 12},
	}
	d := Data{
		Started: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC), Kernel: "6.1", CPUs: 2,
		Settings: Settings{Rounds: 2, IperfTime: 3 * time.Second},
		Baseline: "kernel",
		Cells:    Summarise(samples, func(string) string { return "kernel" }),
		Failures: []Failure{{Round: 1, Config: "usernet-hardware", Workload: "redis", Error: "redis-benchmark: exit status 1: refused"}},
		PodRows:  []Row{{Name: "kernel"}, {Name: "usernet-hardware", Stack: true}},
	}
	got := d.table()
	for _, want := range []string{
		"2026-01-02 03:04 UTC, kernel 6.1, 2 CPUs; 2 round(s)",
		"| kernel | 25.0 (20.0–30.0) ×1.00 |",
		"| usernet-hardware | 10.0 ×0.40 |",
		"| kernel | 25.0 Gbit/s |",
		"| usernet-hardware | 0.40× |",
		"failed: exit status 1: refused",
		" n/a |",
		"| 1 | usernet-hardware | redis | redis-benchmark: exit status 1: refused |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table.md has no %q:\n%s", want, got)
		}
	}
}

// TestSameNodeSection: a run of the pod-to-pod rows on one node alone
// has their section, with ratios to its kernel row, the CPU split by
// process, n/a for the kernel row's stacks, and no node→pod tables.
func TestSameNodeSection(t *testing.T) {
	samples := []Sample{
		{Round: 1, Config: "pod2pod-kernel", Metric: "rr_p50_us", Value: 40},
		{Round: 1, Config: "pod2pod-usernet", Metric: "rr_p50_us", Value: 100},
		{Round: 1, Config: "pod2pod-kernel", Metric: "client_cpu_redis", Value: 20},
		{Round: 1, Config: "pod2pod-usernet", Metric: "client_cpu_redis", Value: 22},
		{Round: 1, Config: "pod2pod-usernet", Metric: "stack_cpu_redis", Value: 30},
		{Round: 1, Config: "pod2pod-usernet", Metric: "other_cpu_redis", Value: 5},
	}
	d := Data{
		Started: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC), Settings: Settings{Rounds: 1},
		Baseline: "kernel",
		Cells:    Summarise(samples, func(string) string { return "pod2pod-kernel" }),
		SameNode: &SameNode{Rows: []Row{{Name: "pod2pod-kernel"}, {Name: "pod2pod-usernet", Stack: true}}, Subnet: "10.199.0.0/24", Baseline: "pod2pod-kernel"},
	}
	got := d.table()
	for _, want := range []string{
		"## Pod to pod on one node",
		"host-local, 10.199.0.0/24",
		"Ratios to `pod2pod-kernel`",
		"### CPU per 1,000 redis requests",
		"| configuration | all CPUs (core·ms per 1k requests) | both stacks (core·ms per 1k requests) | client (core·ms per 1k requests) | server (core·ms per 1k requests) | the rest (core·ms per 1k requests) |",
		"| pod2pod-kernel | — | n/a | 20.0 ×1.00 | — | — |",
		"| pod2pod-usernet | — | 30.0 | 22.0 ×1.10 | — | 5.00 |",
		"| pod2pod-usernet | — | — | — | — | — | — | 100 ×2.50 | — |",
		"### CPU per GB, bulk",
		"A→B, the rest",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table.md has no %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"## Summary", "## Pod to pod across two nodes", "## Targets"} {
		if strings.Contains(got, not) {
			t.Errorf("table.md has %q in a run of the pod-to-pod rows alone", not)
		}
	}
}
