package report

import (
	"fmt"
	"slices"
)

// Metric describes one column of the report.
type Metric struct {
	Key, Label, Unit string
	HigherBetter     bool
	Group            string // table it is shown in
	StackOnly        bool   // only a configuration with a stack process (cni-usernet, a peer) has it
}

// Metrics are the node-to-pod rows' columns.
var Metrics = []Metric{
	{"tcp_n2p_gbps", "TCP node→pod", "Gbit/s", true, "Bulk TCP (iperf3, one stream)", false},
	{"tcp_p2n_gbps", "TCP pod→node", "Gbit/s", true, "Bulk TCP (iperf3, one stream)", false},
	{"tcp_n2p_retrans", "retransmits node→pod", "", false, "Bulk TCP (iperf3, one stream)", false},
	{"tcp_p2n_retrans", "retransmits pod→node", "", false, "Bulk TCP (iperf3, one stream)", false},
	{"redis_set_krps", "redis SET", "k rps", true, "Requests", false},
	{"redis_get_krps", "redis GET", "k rps", true, "Requests", false},
	{"redis_set_p50_ms", "SET p50", "ms", false, "Requests", false},
	{"redis_get_p50_ms", "GET p50", "ms", false, "Requests", false},
	{"nginx_rps", "nginx 10 MiB", "req/s", true, "Requests", false},
	{"nginx_mbs", "nginx 10 MiB", "MB/s", true, "Requests", false},
	{"rr_p50_us", "TCP_RR p50", "µs", false, "Latency and cost", false},
	{"rr_p99_us", "TCP_RR p99", "µs", false, "Latency and cost", false},
	{"cpu_n2p", "all CPUs, node→pod", "cores per Gbit/s", false, "Latency and cost", false},
	{"cpu_p2n", "all CPUs, pod→node", "cores per Gbit/s", false, "Latency and cost", false},
	{"stack_cpu_n2p", "stack, node→pod", "cores per Gbit/s", false, "Latency and cost", true},
	{"stack_cpu_p2n", "stack, pod→node", "cores per Gbit/s", false, "Latency and cost", true},
	{"rss_mib", "idle stack RSS", "MiB", false, "Latency and cost", true},
	{"cpu_gb_n2p", "all CPUs, node→pod", "core·s per GB", false, "CPU per unit of work", false},
	{"cpu_gb_p2n", "all CPUs, pod→node", "core·s per GB", false, "CPU per unit of work", false},
	{"stack_cpu_gb_n2p", "stack, node→pod", "core·s per GB", false, "CPU per unit of work", true},
	{"stack_cpu_gb_p2n", "stack, pod→node", "core·s per GB", false, "CPU per unit of work", true},
	{"cpu_redis", "all CPUs, redis", "core·ms per 1k requests", false, "CPU per unit of work", false},
	{"stack_cpu_redis", "stack, redis", "core·ms per 1k requests", false, "CPU per unit of work", true},
	{"cpu_rr", "all CPUs, TCP_RR", "core·ms per 1k round trips", false, "CPU per unit of work", false},
	{"stack_cpu_rr", "stack, TCP_RR", "core·ms per 1k round trips", false, "CPU per unit of work", true},
	{"stack_frames_rr", "stack frames out, TCP_RR", "per round trip", false, "CPU per unit of work", true},
	{"stack_wakeups_rr", "stack thread wake-ups, TCP_RR", "per round trip", false, "CPU per unit of work", true},
}

// CrossMetrics are the pod-to-pod rows' columns, across nodes and on one
// node. "a2b" is pod A sending (iperf3's client), "b2a" pod B (-R). The
// CPU of each unit of work is split by who used it (podCPU).
var CrossMetrics = append([]Metric{
	{"tcp_a2b_gbps", "TCP A→B", "Gbit/s", true, "Pod to pod", false},
	{"tcp_b2a_gbps", "TCP B→A", "Gbit/s", true, "Pod to pod", false},
	{"tcp_a2b_retrans", "retransmits A→B", "", false, "Pod to pod", false},
	{"tcp_b2a_retrans", "retransmits B→A", "", false, "Pod to pod", false},
	{"redis_set_krps", "redis SET", "k rps", true, "Pod to pod", false},
	{"redis_get_krps", "redis GET", "k rps", true, "Pod to pod", false},
	{"rr_p50_us", "TCP_RR p50", "µs", false, "Pod to pod", false},
	{"rr_p99_us", "TCP_RR p99", "µs", false, "Pod to pod", false},
}, slices.Concat(
	podCPU("gb_a2b", "A→B, ", "core·s per GB", "CPU per GB, bulk"),
	podCPU("gb_b2a", "B→A, ", "core·s per GB", "CPU per GB, bulk"),
	podCPU("redis", "", "core·ms per 1k requests", "CPU per 1,000 redis requests"),
	podCPU("rr", "", "core·ms per 1k round trips", "CPU per 1,000 TCP_RR round trips"),
)...)

// podCPU are the columns of a pod-to-pod workload's CPU, metrics
// <who>_cpu_<what>: all CPUs, both stacks, the client in pod A, the
// server in pod B, and the rest (all CPUs less those processes).
func podCPU(what, prefix, unit, group string) []Metric {
	return []Metric{
		{"cpu_" + what, prefix + "all CPUs", unit, false, group, false},
		{"stack_cpu_" + what, prefix + "both stacks", unit, false, group, true},
		{"client_cpu_" + what, prefix + "client", unit, false, group, false},
		{"server_cpu_" + what, prefix + "server", unit, false, group, false},
		{"other_cpu_" + what, prefix + "the rest", unit, false, group, false},
	}
}

// scaleMetrics are the scale section's idle-pod numbers (row ScaleIdleRow).
var scaleMetrics = []Metric{
	{"pss_per_pod_mib", "stack PSS per pod", "MiB", false, "", false},
	{"pss_anon_per_pod_mib", "of it anonymous", "MiB", false, "", false},
	{"pss_file_per_pod_mib", "of it file-backed", "MiB", false, "", false},
	{"rss_per_pod_mib", "stack RSS per pod", "MiB", false, "", false},
	{"idle_cpu_ms_per_pod_min", "idle stack CPU per pod", "ms per minute", false, "", false},
	{"add_all_p50_ms", "ADD p50, all", "ms", false, "", false},
	{"add_last20_p50_ms", "ADD p50, last 20", "ms", false, "", false},
	{"add_last20_p99_ms", "ADD p99, last 20", "ms", false, "", false},
	{"del_p50_ms", "DEL p50", "ms", false, "", false},
}

// streamMetrics are the scale section's concurrent-stream columns.
func streamMetrics(streams []int) []Metric {
	var ms []Metric
	for _, n := range streams {
		ms = append(ms, Metric{fmt.Sprintf("streams_%d_gbps", n), fmt.Sprintf("%d streams", n), "Gbit/s", true, "", false})
	}
	for _, n := range streams {
		ms = append(ms, Metric{fmt.Sprintf("streams_%d_rss_mib", n), fmt.Sprintf("stack peak RSS, %d streams", n), "MiB", false, "", true})
	}
	return ms
}

// limitMetrics are the limits section's columns (rows kernel@LIMIT,
// usernet-hardware@LIMIT; ratios to kernel@LIMIT).
var limitMetrics = []Metric{
	{"tcp_n2p_gbps", "TCP node→pod", "Gbit/s", true, "What the pod gets", false},
	{"tcp_p2n_gbps", "TCP pod→node", "Gbit/s", true, "What the pod gets", false},
	{"redis_set_krps", "redis SET", "k rps", true, "What the pod gets", false},
	{"redis_get_krps", "redis GET", "k rps", true, "What the pod gets", false},
	{"pod_cores_n2p", "pod, node→pod", "cores", false, "Where its CPU goes", false},
	{"pod_cores_p2n", "pod, pod→node", "cores", false, "Where its CPU goes", false},
	{"pod_cores_redis", "pod, redis", "cores", false, "Where its CPU goes", false},
	{"stack_share_n2p", "stack's share, node→pod", "of the pod's CPU", false, "Where its CPU goes", true},
	{"stack_share_p2n", "stack's share, pod→node", "of the pod's CPU", false, "Where its CPU goes", true},
	{"stack_share_redis", "stack's share, redis", "of the pod's CPU", false, "Where its CPU goes", true},
	{"throttled_n2p", "throttled, node→pod", "of periods", false, "Where its CPU goes", false},
	{"throttled_p2n", "throttled, pod→node", "of periods", false, "Where its CPU goes", false},
	{"throttled_redis", "throttled, redis", "of periods", false, "Where its CPU goes", false},
	{"machine_cores_n2p", "machine, node→pod", "cores", false, "Where its CPU goes", false},
	{"machine_cores_p2n", "machine, pod→node", "cores", false, "Where its CPU goes", false},
	{"machine_cores_redis", "machine, redis", "cores", false, "Where its CPU goes", false},
}

var addMetrics = []Metric{
	{"add_p50_ms", "ADD p50", "ms", false, "", false},
	{"add_p99_ms", "ADD p99", "ms", false, "", false},
	{"del_p50_ms", "DEL p50", "ms", false, "", false},
}

// sizingPhase is one row of the sizing table.
type sizingPhase struct{ Key, Label string }

var sizingPhases = []sizingPhase{
	{"idle", "idle, 5 s after ADD"},
	{"n2p", "peak during iperf3 node→pod"},
	{"p2n", "peak during iperf3 pod→node"},
	{"redis", "peak during redis-benchmark SET/GET"},
	{"after", "5 s after the traffic"},
	{"settled", "after 50 s quiet (the stack has handed its free heap back)"},
}

// sizingQuantities are the sizing table's columns, metric suffixes.
var sizingQuantities = []struct{ Key, Label string }{
	{"rss", "RSS"},
	{"rss_anon", "RSS anon"},
	{"rss_file", "RSS file"},
	{"charge", "pod cgroup charged"},
	{"anon", "charged anon"},
	{"file", "charged file"},
	{"kernel", "charged kernel"},
}

// groupsOf splits ms into its groups, in the order they first appear.
func groupsOf(ms []Metric) (names []string, byGroup map[string][]Metric) {
	byGroup = map[string][]Metric{}
	for _, m := range ms {
		if _, ok := byGroup[m.Group]; !ok {
			names = append(names, m.Group)
		}
		byGroup[m.Group] = append(byGroup[m.Group], m)
	}
	return names, byGroup
}
