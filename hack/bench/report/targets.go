package report

// target is a goal for the data path, shown against the measured number.
type target struct {
	What, Goal string
	Value      func(Cells) (float64, bool)
	Met        func(float64) bool
}

func ratioOf(cfg, m string) func(Cells) (float64, bool) {
	return func(cs Cells) (float64, bool) {
		if c := cs[cfg][m]; c != nil && c.Ratio != nil {
			return *c.Ratio, true
		}
		return 0, false
	}
}

func medianOf(cfg, m string) func(Cells) (float64, bool) {
	return func(cs Cells) (float64, bool) {
		if c := cs[cfg][m]; c != nil {
			return c.Median, true
		}
		return 0, false
	}
}

// targets are the data path's goals: the peers' speed.
var targets = []target{
	{"bulk TCP node→pod, hardware GSO", "≥ 0.60 × kernel", ratioOf("usernet-hardware", "tcp_n2p_gbps"), atLeast(0.6)},
	{"bulk TCP pod→node, hardware GSO", "≥ 0.60 × kernel", ratioOf("usernet-hardware", "tcp_p2n_gbps"), atLeast(0.6)},
	{"bulk TCP node→pod, hardware GSO against runsc (host GSO)", "≥ 1.5 ×", between("usernet-hardware", "runsc-hostgso", "tcp_n2p_gbps"), atLeast(1.5)},
	{"bulk TCP pod→node, hardware GSO against runsc (host GSO)", "≥ 1.5 ×", between("usernet-hardware", "runsc-hostgso", "tcp_p2n_gbps"), atLeast(1.5)},
	{"software GSO pod→node against the kernel with offloads off", "≥ 0.5 ×", between("usernet-software", "kernel-nooffload", "tcp_p2n_gbps"), atLeast(0.5)},
	{"software GSO against off, pod→node", "≥ 2.5 ×", between("usernet-software", "usernet-off", "tcp_p2n_gbps"), atLeast(2.5)},
	{"redis SET, hardware GSO", "≥ 0.50 × kernel", ratioOf("usernet-hardware", "redis_set_krps"), atLeast(0.5)},
	{"redis GET, hardware GSO", "≥ 0.50 × kernel", ratioOf("usernet-hardware", "redis_get_krps"), atLeast(0.5)},
	{"TCP_RR p50, hardware GSO", "≤ 3 × kernel", ratioOf("usernet-hardware", "rr_p50_us"), atMost(3)},
	{"nginx 10 MiB req/s, hardware GSO", "≥ 0.80 × kernel", ratioOf("usernet-hardware", "nginx_rps"), atLeast(0.8)},
	{"stack CPU pod→node, hardware GSO", "≤ 1.5 core·s per GB", medianOf("usernet-hardware", "stack_cpu_gb_p2n"), atMost(1.5)},
	{"stack CPU redis, hardware GSO", "≤ 60 core·ms per 1k requests", medianOf("usernet-hardware", "stack_cpu_redis"), atMost(60)},
	{"cni-usernet ADD p99, 20 at once", "≤ 250 ms", medianOf("add-cni-usernet", "add_p99_ms"), atMost(250)},
	{"idle stack RSS, hardware GSO", "≤ 15 MiB", medianOf("usernet-hardware", "rss_mib"), atMost(15)},
	{"stack PSS per idle pod (scale section)", "≤ 8 MiB", medianOf(ScaleIdleRow, "pss_per_pod_mib"), atMost(8)},
}

func atLeast(goal float64) func(float64) bool { return func(v float64) bool { return v >= goal } }
func atMost(goal float64) func(float64) bool  { return func(v float64) bool { return v <= goal } }

// between is the ratio of two configurations' medians of metric m.
func between(cfg, other, m string) func(Cells) (float64, bool) {
	return func(cs Cells) (float64, bool) {
		a, b := cs[cfg][m], cs[other][m]
		if a == nil || b == nil || b.Median == 0 {
			return 0, false
		}
		return a.Median / b.Median, true
	}
}
