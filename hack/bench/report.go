package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/cgroup"
	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

// metric describes one column of the report.
type metric struct {
	Key, Label, Unit string
	HigherBetter     bool
	Group            string // table it is shown in
	StackOnly        bool   // only a configuration with a stack process (cni-usernet, a peer) has it
}

var metrics = []metric{
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

// scaleMetrics are the scale section's idle-pod numbers (row scale-idle).
var scaleMetrics = []metric{
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
func (b *bench) streamMetrics() []metric {
	var ms []metric
	for _, n := range b.o.Streams {
		ms = append(ms, metric{fmt.Sprintf("streams_%d_gbps", n), fmt.Sprintf("%d streams", n), "Gbit/s", true, "", false})
	}
	for _, n := range b.o.Streams {
		ms = append(ms, metric{fmt.Sprintf("streams_%d_rss_mib", n), fmt.Sprintf("stack peak RSS, %d streams", n), "MiB", false, "", true})
	}
	return ms
}

// limitMetrics are the limits section's columns (rows kernel@LIMIT,
// usernet-hardware@LIMIT; ratios to kernel@LIMIT).
var limitMetrics = []metric{
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

var addMetrics = []metric{
	{"add_p50_ms", "ADD p50", "ms", false, "", false},
	{"add_p99_ms", "ADD p99", "ms", false, "", false},
	{"del_p50_ms", "DEL p50", "ms", false, "", false},
}

// cell summarises one metric of one configuration over the rounds.
type cell struct {
	Median float64  `json:"median"`
	Min    float64  `json:"min"`
	Max    float64  `json:"max"`
	N      int      `json:"n"`
	Ratio  *float64 `json:"ratio,omitempty"` // median / baseline median
}

func median(s []float64) float64 {
	s = slices.Clone(s)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// cells computes every cell; ratios for the add-* rows are to add-ptp.
func (b *bench) cells() map[string]map[string]*cell {
	vals := map[string]map[string][]float64{}
	for _, s := range b.samples {
		if vals[s.Config] == nil {
			vals[s.Config] = map[string][]float64{}
		}
		vals[s.Config][s.Metric] = append(vals[s.Config][s.Metric], s.Value)
	}
	out := map[string]map[string]*cell{}
	for cfg, ms := range vals {
		out[cfg] = map[string]*cell{}
		for m, v := range ms {
			out[cfg][m] = &cell{Median: median(v), Min: slices.Min(v), Max: slices.Max(v), N: len(v)}
		}
	}
	for cfg, ms := range out {
		base := baseline
		if c := configByName(cfg); c != nil {
			base = c.ratioTo()
		}
		if strings.HasPrefix(cfg, "add-") {
			base = "add-ptp"
		}
		if _, l, ok := limitOf(cfg); ok {
			base = limitRow(baseline, l)
		}
		for m, c := range ms {
			if bc := out[base][m]; bc != nil && bc.Median != 0 {
				r := c.Median / bc.Median
				c.Ratio = &r
			}
		}
	}
	return out
}

// problems lists the cells of configurations that ran but produced no
// number, with the last error seen for them, and the stacks that did not
// take the GSO setting asked for.
func (b *bench) problems() []string {
	cells := b.cells()
	lastErr := func(cfg, m string) string {
		for i := len(b.failures) - 1; i >= 0; i-- {
			if f := b.failures[i]; f.Config == cfg {
				return f.Workload + ": " + firstLine(f.Error)
			}
		}
		return "no error recorded"
	}
	var out []string
	for _, f := range b.failures {
		switch {
		case f.Workload == "gso-check":
			out = append(out, fmt.Sprintf("%s gso-check (%s)", f.Config, f.Error))
		case strings.HasSuffix(f.Workload, "(retried)"):
			// the retry's own outcome decides
		case f.Config == scaleIdle || f.Config == sizingRow || strings.HasPrefix(f.Workload, "streams") || strings.Contains(f.Config, "@"):
			out = append(out, fmt.Sprintf("%s %s (%s)", f.Config, f.Workload, firstLine(f.Error)))
		}
	}
	for _, c := range b.selected() {
		if _, skip := b.skipped[c.Name]; skip {
			continue
		}
		if c.Peer != "" {
			// A peer that fails is a fact about the peer, shown in the
			// table with its reason; it does not fail our benchmark.
			continue
		}
		ms := metrics
		if c.CrossNode != "" {
			ms = crossMetrics
		}
		for _, m := range ms {
			if (!m.StackOnly || c.stack()) && cells[c.Name][m.Key] == nil {
				out = append(out, fmt.Sprintf("%s %s (%s)", c.Name, m.Key, lastErr(c.Name, m.Key)))
			}
		}
	}
	for _, ac := range addConfigs {
		if slices.ContainsFunc(b.atts, func(a *attachment) bool { return a.Config == ac.Of }) && cells[ac.Name]["add_p99_ms"] == nil {
			out = append(out, fmt.Sprintf("%s add_p99_ms (%s)", ac.Name, lastErr(ac.Name, "")))
		}
	}
	return out
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func fmtNum(v float64) string {
	switch a := max(v, -v); {
	case a == 0:
		return "0"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

func (c *cell) String() string {
	s := fmtNum(c.Median)
	if c.N > 1 {
		s += fmt.Sprintf(" (%s–%s)", fmtNum(c.Min), fmtNum(c.Max))
	}
	if c.Ratio != nil {
		s += fmt.Sprintf(" ×%.2f", *c.Ratio)
	}
	return s
}

// target is a goal from the issue, shown against the measured number.
type target struct {
	What, Goal string
	Value      func(map[string]map[string]*cell) (float64, bool)
	Met        func(float64) bool
}

func ratioOf(cfg, m string) func(map[string]map[string]*cell) (float64, bool) {
	return func(cs map[string]map[string]*cell) (float64, bool) {
		if c := cs[cfg][m]; c != nil && c.Ratio != nil {
			return *c.Ratio, true
		}
		return 0, false
	}
}

func medianOf(cfg, m string) func(map[string]map[string]*cell) (float64, bool) {
	return func(cs map[string]map[string]*cell) (float64, bool) {
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
	{"stack PSS per idle pod (scale section)", "≤ 8 MiB", medianOf(scaleIdle, "pss_per_pod_mib"), atMost(8)},
}

func atLeast(goal float64) func(float64) bool { return func(v float64) bool { return v >= goal } }
func atMost(goal float64) func(float64) bool  { return func(v float64) bool { return v <= goal } }

// between is the ratio of two configurations' medians of metric m.
func between(cfg, other, m string) func(map[string]map[string]*cell) (float64, bool) {
	return func(cs map[string]map[string]*cell) (float64, bool) {
		a, b := cs[cfg][m], cs[other][m]
		if a == nil || b == nil || b.Median == 0 {
			return 0, false
		}
		return a.Median / b.Median, true
	}
}

func (b *bench) writeReport() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	cells := b.cells()
	host, _ := os.Hostname()
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	meta := map[string]any{
		"started": b.started.UTC().Format(time.RFC3339), "finished": time.Now().UTC().Format(time.RFC3339),
		"host": host, "kernel": strings.TrimSpace(string(kernel)), "cpus": runtime.NumCPU(),
		"options": b.o, "args": os.Args[1:],
	}

	var cfgs []map[string]string
	for _, c := range b.selected() {
		status := "ran"
		if why, ok := b.skipped[c.Name]; ok {
			status = "skipped: " + why
		}
		cfgs = append(cfgs, map[string]string{"name": c.Name, "desc": c.Desc, "status": status})
	}
	if err := writeJSON(filepath.Join(b.o.Out, "samples.json"), map[string]any{
		"meta": meta, "configs": cfgs, "attachments": b.atts, "samples": b.samples, "failures": b.failures,
	}); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(b.o.Out, "summary.json"), map[string]any{
		"baseline": baseline, "configs": cfgs, "metrics": metrics, "cells": cells,
	}); err != nil {
		return err
	}

	var w strings.Builder
	fmt.Fprintf(&w, "# cni-usernet benchmark\n\n")
	fmt.Fprintf(&w, "%s, kernel %s, %d CPUs; %d round(s), configurations interleaved (reversed in even rounds); iperf3 %s per direction, redis-benchmark -n %d, ab -n %d -c 5 (10 MiB), TCP_RR %s, ADD of %d pods %d at a time.\n\n",
		b.started.UTC().Format("2006-01-02 15:04 UTC"), meta["kernel"], runtime.NumCPU(), b.o.Rounds, b.o.IperfTime, b.o.RedisN, b.o.NginxN, b.o.RRTime, b.o.AddPods, b.o.AddParallel)
	fmt.Fprintf(&w, "Cells: median (min–max over rounds) ×ratio to the `%s` row (ADD rows: to `add-ptp`). For ratios of µs, ms, retransmits, cores and MiB, lower is better.\n", baseline)
	// A run of cross-node rows alone has none of these.
	podRun := len(b.podRows()) > 0
	if podRun {
		b.summary(&w, cells)

		groups := []string{}
		for _, m := range metrics {
			if !slices.Contains(groups, m.Group) {
				groups = append(groups, m.Group)
			}
		}
		for _, g := range groups {
			var ms []metric
			for _, m := range metrics {
				if m.Group == g {
					ms = append(ms, m)
				}
			}
			fmt.Fprintf(&w, "\n## %s\n\n", g)
			b.table(&w, cells, ms, b.podRows())
		}
	}
	if rows := b.crossRows(); len(rows) > 0 {
		b.crossReport(&w, cells, rows)
	}

	if podRun {
		fmt.Fprintf(&w, "\n## CNI ADD/DEL latency (%d pods, %d concurrent)\n\n", b.o.AddPods, b.o.AddParallel)
		var addRows []*config
		for _, ac := range addConfigs {
			addRows = append(addRows, &config{Name: ac.Name})
		}
		b.table(&w, cells, addMetrics, addRows)
	}

	if b.o.Scale && podRun {
		fmt.Fprintf(&w, "\n## Scale: %d idle cni-usernet pods (usernet-hardware), attached one at a time\n\n", b.o.ScalePods)
		b.table(&w, cells, scaleMetrics, []*config{{Name: scaleIdle}})
		fmt.Fprintf(&w, "\nPSS from /proc/PID/smaps_rollup of every stack, summed (a page shared by k processes counts 1/k in each, so the binary's text counts once), divided by the pods. ADD of the last 20 runs with %d stacks already up.\n", b.o.ScalePods-20)
		fmt.Fprintf(&w, "\n## Scale: concurrent TCP streams node→pod (iperf3 -P, %s)\n\n", b.o.IperfTime)
		var rows []*config
		for _, n := range []string{"kernel", "usernet-hardware"} {
			if c := configByName(n); c != nil && slices.Contains(b.selected(), c) {
				rows = append(rows, c)
			}
		}
		b.table(&w, cells, b.streamMetrics(), rows)
	}

	if len(b.o.CPULimits) > 0 {
		b.limitsReport(&w, cells)
	}
	if b.o.Sizing && podRun {
		b.sizingReport(&w, cells)
	}

	if podRun {
		fmt.Fprintf(&w, "\n## Targets (goals, not assertions)\n\n| target | goal | measured | |\n|---|---|---|---|\n")
		for _, t := range targets {
			v, ok := t.Value(cells)
			switch {
			case !ok:
				fmt.Fprintf(&w, "| %s | %s | — | not measured |\n", t.What, t.Goal)
			case t.Met(v):
				fmt.Fprintf(&w, "| %s | %s | %s | met |\n", t.What, t.Goal, fmtNum(v))
			default:
				fmt.Fprintf(&w, "| %s | %s | %s | **not met** |\n", t.What, t.Goal, fmtNum(v))
			}
		}
	}

	fmt.Fprintf(&w, "\n## Configurations\n\n| configuration | what | status | pod IP | host veth | GSO reported by the stack |\n|---|---|---|---|---|---|\n")
	for _, c := range cfgs {
		ip, veth, gso := "", "", ""
		for _, a := range b.atts {
			if a.Config == c["name"] {
				ip, veth = a.IP, a.HostVeth
				var st stackStatus
				if json.Unmarshal(a.Status, &st) == nil && st.GSO.Mode != "" {
					gso = fmt.Sprintf("%s, maxSize %d, maxSegs %d", st.GSO.Mode, st.GSO.MaxSize, st.GSO.MaxSegs)
				}
			}
		}
		fmt.Fprintf(&w, "| %s | %s | %s | %s | %s | %s |\n", c["name"], c["desc"], c["status"], ip, veth, gso)
	}
	var peers []*config
	for _, c := range b.selected() {
		if c.Peer != "" {
			peers = append(peers, c)
		}
	}
	if len(peers) > 0 {
		fmt.Fprintf(&w, "\n## How the peers are set up\n\n| configuration | method | GB through the tap device, whole run |\n|---|---|---|\n")
		for _, c := range peers {
			gb := "n/a"
			if cl := cells[c.Name]["tap_gb"]; cl != nil {
				gb = fmtNum(cl.Max)
			}
			fmt.Fprintf(&w, "| %s | %s | %s |\n", c.Name, mdCell(c.Method), gb)
		}
	}
	if len(b.failures) > 0 {
		fmt.Fprintf(&w, "\n## Failures\n\n| round | configuration | workload | error |\n|---|---|---|---|\n")
		for _, f := range b.failures {
			fmt.Fprintf(&w, "| %d | %s | %s | %s |\n", f.Round, f.Config, f.Workload, strings.ReplaceAll(runlog.Tail(firstLine(f.Error), 300), "|", "\\|"))
		}
	}
	return os.WriteFile(filepath.Join(b.o.Out, "table.md"), []byte(w.String()), 0o644)
}

func (b *bench) table(w *strings.Builder, cells map[string]map[string]*cell, ms []metric, rows []*config) {
	fmt.Fprintf(w, "| configuration |")
	for _, m := range ms {
		if m.Unit != "" {
			fmt.Fprintf(w, " %s (%s) |", m.Label, m.Unit)
		} else {
			fmt.Fprintf(w, " %s |", m.Label)
		}
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(ms)))
	for _, c := range rows {
		if why, ok := b.skipped[c.Name]; ok {
			fmt.Fprintf(w, "| %s | skipped: %s |%s\n", c.Name, mdCell(why), strings.Repeat(" |", len(ms)-1))
			continue
		}
		fmt.Fprintf(w, "| %s |", c.Name)
		for _, m := range ms {
			switch cl := cells[c.Name][m.Key]; {
			case cl != nil:
				s := cl.String()
				if n := b.failedRounds(c.Name, m.Key); n > 0 {
					s += fmt.Sprintf(", %d round(s) failed", n)
				}
				fmt.Fprintf(w, " %s |", s)
			case m.StackOnly && !c.stack():
				fmt.Fprintf(w, " n/a |")
			default:
				if why := b.failedWhy(c.Name, m.Key); why != "" {
					fmt.Fprintf(w, " failed: %s |", mdCell(why))
				} else {
					fmt.Fprintf(w, " — |")
				}
			}
		}
		fmt.Fprintln(w)
	}
}

// workloadOf names the workload that produces metric key, as recorded in
// failures.
func workloadOf(key string) string {
	switch {
	case strings.HasPrefix(key, "tcp_"), strings.Contains(key, "_gb_"), strings.HasPrefix(key, "cpu_n2p"), strings.HasPrefix(key, "cpu_p2n"),
		strings.HasPrefix(key, "stack_cpu_n2p"), strings.HasPrefix(key, "stack_cpu_p2n"):
		return "iperf3"
	case strings.Contains(key, "redis"):
		return "redis"
	case strings.HasPrefix(key, "nginx"):
		return "nginx"
	case strings.HasPrefix(key, "rr_"):
		return "tcp_rr"
	case key == "rss_mib":
		return "stack"
	case strings.HasSuffix(key, "_n2p"), strings.HasSuffix(key, "_p2n"):
		return "iperf3"
	case strings.HasPrefix(key, "streams_"):
		n, _, _ := strings.Cut(strings.TrimPrefix(key, "streams_"), "_")
		return "streams " + n
	}
	return ""
}

// failedRounds counts the rounds in which the workload of metric key failed
// for configuration cfg.
func (b *bench) failedRounds(cfg, key string) int {
	n := 0
	for _, f := range b.failures {
		if f.Config == cfg && (f.Workload == workloadOf(key) || f.Workload == "setup") {
			n++
		}
	}
	return n
}

// failedWhy is the last error of the workload behind metric key for cfg
// (or of its setup), shortened for a table cell; "" when none.
func (b *bench) failedWhy(cfg, key string) string {
	for i := len(b.failures) - 1; i >= 0; i-- {
		f := b.failures[i]
		if f.Config == cfg && (f.Workload == workloadOf(key) || f.Workload == "setup" || cfg == scaleIdle) {
			return shortReason(f.Error)
		}
	}
	return ""
}

// shortReason is the gist of an error for a table cell: the first line,
// without the command line that b.output puts in front of the exit status.
func shortReason(err string) string {
	l := firstLine(err)
	if i := strings.LastIndex(l, ": exit status "); i >= 0 {
		l = l[i+2:]
	}
	return runlog.Tail(l, 120)
}

func mdCell(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

// summary is the table: the kernel row in units, every other row
// as ratios to it, CPU in units (all CPUs; the stack process alone).
func (b *bench) summary(w *strings.Builder, cells map[string]map[string]*cell) {
	fmt.Fprintf(w, "\n## Summary\n\nKernel row in units, the others as ×ratio to it (medians); CPU columns in units: all CPUs / the stack process alone.\n\n")
	fmt.Fprintf(w, "| configuration | node→pod | pod→node | redis SET / GET | nginx 10 MiB | TCP_RR p50 | core·s per GB pod→node | core·ms per 1k redis requests |\n|---|---|---|---|---|---|---|---|\n")
	val := func(cfg, key, unit string) string {
		cl := cells[cfg][key]
		switch {
		case cl == nil:
			if _, ok := b.skipped[cfg]; ok {
				return "skipped"
			}
			if why := b.failedWhy(cfg, key); why != "" {
				return "failed: " + mdCell(why)
			}
			return "—"
		case cfg == baseline || cl.Ratio == nil:
			return fmtNum(cl.Median) + " " + unit
		default:
			return fmt.Sprintf("%.2f×", *cl.Ratio)
		}
	}
	cpu := func(cfg, all, stack string) string {
		a, st := cells[cfg][all], cells[cfg][stack]
		switch {
		case a == nil:
			return "—"
		case st == nil:
			return fmtNum(a.Median)
		default:
			return fmtNum(a.Median) + " / " + fmtNum(st.Median)
		}
	}
	for _, c := range b.podRows() {
		if why, ok := b.skipped[c.Name]; ok {
			fmt.Fprintf(w, "| %s | skipped: %s | | | | | | |\n", c.Name, mdCell(why))
			continue
		}
		redis := val(c.Name, "redis_set_krps", "k rps")
		if get := val(c.Name, "redis_get_krps", "k rps"); get != redis || !strings.HasPrefix(get, "failed") {
			redis += " / " + get
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", c.Name,
			val(c.Name, "tcp_n2p_gbps", "Gbit/s"), val(c.Name, "tcp_p2n_gbps", "Gbit/s"), redis,
			val(c.Name, "nginx_rps", "req/s"), val(c.Name, "rr_p50_us", "µs"),
			cpu(c.Name, "cpu_gb_p2n", "stack_cpu_gb_p2n"), cpu(c.Name, "cpu_redis", "stack_cpu_redis"))
	}
}

// podRows are the configurations of the run measured against the node:
// all but the cross-node rows, which have a section of their own.
func (b *bench) podRows() []*config {
	var out []*config
	for _, c := range b.selected() {
		if c.CrossNode == "" {
			out = append(out, c)
		}
	}
	return out
}

// rerender rewrites a results directory's table.md and summary.json from
// its samples.json, with this version of the report.
func rerender(dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, "samples.json"))
	if err != nil {
		return err
	}
	var in struct {
		Meta struct {
			Started string  `json:"started"`
			Options options `json:"options"`
		} `json:"meta"`
		Configs     []map[string]string `json:"configs"`
		Attachments []*attachment       `json:"attachments"`
		Samples     []sample            `json:"samples"`
		Failures    []failure           `json:"failures"`
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return fmt.Errorf("parsing samples.json: %w", err)
	}
	b := &bench{o: in.Meta.Options, samples: in.Samples, failures: in.Failures, atts: in.Attachments, skipped: map[string]string{}}
	b.o.Out, b.o.Only, b.o.Peers = dir, nil, false
	for _, c := range in.Configs {
		b.o.Only = append(b.o.Only, c["name"])
		if why, ok := strings.CutPrefix(c["status"], "skipped: "); ok {
			b.skipped[c["name"]] = why
		}
	}
	for _, a := range b.atts {
		a.cfg = configByName(a.Config)
	}
	b.started, _ = time.Parse(time.RFC3339, in.Meta.Started)
	return b.writeReport()
}

func writeJSON(path string, v any) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(raw, '\n'), 0o644)
}

// limitsReport writes the limits section: one row per limit and
// configuration, ratios to the kernel veth under the same limit.
func (b *bench) limitsReport(w *strings.Builder, cells map[string]map[string]*cell) {
	var rows []*config
	for _, l := range b.o.CPULimits {
		for _, name := range limitConfigs {
			if c := configByName(name); c != nil {
				rows = append(rows, &config{Name: limitRow(name, l.Label), Plugin: c.Plugin})
			}
		}
	}
	var labels, ns []string
	for _, l := range b.o.CPULimits {
		labels, ns = append(labels, l.Label), append(ns, strconv.Itoa(b.limitRedisN(l)))
	}
	fmt.Fprintf(w, "\n## Under a pod's CPU limit\n\n")
	fmt.Fprintf(w, "The pod's server (and for cni-usernet its stack) in a cgroup with the limit's CFS quota (period %d ms; `max`: no quota); the clients in the node namespace, unlimited. iperf3 %s per direction, redis-benchmark -n %s (limits %s). Ratios to `kernel` under the same limit. The stack's share: its CPU time over the pod cgroup's. Throttled: the share of CFS periods in which the pod used up its quota. Machine: all CPUs' busy cores, the clients and the softirq work no pod is billed for included.\n",
		cgroup.CFSPeriodUs/1000, b.o.IperfTime, strings.Join(ns, " / "), strings.Join(labels, " / "))
	for _, g := range []string{"What the pod gets", "Where its CPU goes"} {
		var ms []metric
		for _, m := range limitMetrics {
			if m.Group == g {
				ms = append(ms, m)
			}
		}
		fmt.Fprintf(w, "\n### %s\n\n", g)
		b.table(w, cells, ms, rows)
	}
}

// sizingReport writes the sizing section: the stack's memory by phase.
func (b *bench) sizingReport(w *strings.Builder, cells map[string]map[string]*cell) {
	fmt.Fprintf(w, "\n## Sizing: a stack's memory, alone in its pod's cgroup (usernet-hardware)\n\n")
	if why, ok := b.skipped[sizingRow]; ok {
		fmt.Fprintf(w, "skipped: %s\n", mdCell(why))
		return
	}
	if len(cells[sizingRow]) == 0 {
		why := b.failedWhy(sizingRow, "")
		if why == "" {
			why = "no numbers"
		}
		fmt.Fprintf(w, "failed: %s\n", mdCell(why))
		return
	}
	fmt.Fprintf(w, "MiB. The stack in the cgroup the plugin put it in, its pod's (found by the pod's UID), alone. RSS: the stack's VmRSS, RssAnon and RssFile (the binary's text, shared by every stack on the node and charged to whichever cgroup first read it). Charged: the pod cgroup's memory.usage_in_bytes (v1) or memory.current (v2); anon and file from memory.stat, kernel: v1's kmem counter (no socket buffers: v1 charges them only under a TCP limit) or v2's kernel + sock. Peaks sampled every 100 ms. iperf3 %s per direction, redis-benchmark -n %d.\n\n", b.o.IperfTime, b.o.RedisN)
	fmt.Fprintf(w, "| phase |")
	for _, q := range sizingQuantities {
		fmt.Fprintf(w, " %s |", q.Label)
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(sizingQuantities)))
	for _, p := range sizingPhases {
		fmt.Fprintf(w, "| %s |", p.Label)
		for _, q := range sizingQuantities {
			if c := cells[sizingRow][p.Key+"_"+q.Key]; c != nil {
				fmt.Fprintf(w, " %s |", fmtNum(c.Median))
			} else {
				fmt.Fprintf(w, " — |")
			}
		}
		fmt.Fprintln(w)
	}
}
