package report

import (
	"strings"

	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

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
func (d *Data) failedRounds(cfg, key string) int {
	n := 0
	for _, f := range d.Failures {
		if f.Config == cfg && (f.Workload == workloadOf(key) || f.Workload == "setup") {
			n++
		}
	}
	return n
}

// failedWhy is the last error of the workload behind metric key for cfg
// (or of its setup; with anyFailure, of anything), shortened for a table
// cell; "" when none.
func (d *Data) failedWhy(cfg, key string, anyFailure bool) string {
	for i := len(d.Failures) - 1; i >= 0; i-- {
		f := d.Failures[i]
		if f.Config == cfg && (f.Workload == workloadOf(key) || f.Workload == "setup" || anyFailure) {
			return shortReason(f.Error)
		}
	}
	return ""
}

// shortReason is the gist of an error for a table cell: the first line,
// without the command line that the bench puts in front of the exit status.
func shortReason(err string) string {
	l := FirstLine(err)
	if i := strings.LastIndex(l, ": exit status "); i >= 0 {
		l = l[i+2:]
	}
	return runlog.Tail(l, 120)
}

// FirstLine is the first line of s.
func FirstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func mdCell(s string) string { return strings.ReplaceAll(s, "|", "\\|") }
