package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// report is the run's results: policy-scale.md for people,
// policy-scale.txt one line per cluster, build and event for scripts.
type report struct {
	started, finished time.Time
	runs              []*runResult
}

func (r *report) write(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, "policy-scale.md"), []byte(r.markdown()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "policy-scale.txt"), []byte(r.lines()), 0o644)
}

func kib(n int) string          { return fmt.Sprintf("%.1f", float64(n)/1024) }
func mib(n int) string          { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }
func ms(d time.Duration) string { return fmt.Sprintf("%d", d.Milliseconds()) }

// lines is the machine-readable form: one line per cluster, build and
// event, the initial sync as event=initial-sync.
func (r *report) lines() string {
	var b strings.Builder
	for _, x := range r.runs {
		head := fmt.Sprintf("policy-scale build=%s rev=%s pods=%d services=%d endpoints=%d policies=%d local=%d",
			x.build.name, orDash(x.build.rev), x.spec.Pods, x.spec.Services, x.spec.Services*x.spec.Endpoints, x.spec.Policies, x.spec.Local)
		if x.spec.ClusterPolicies > 0 {
			head += fmt.Sprintf(" cluster_policies=%d", x.spec.ClusterPolicies)
		}
		fmt.Fprintf(&b, "%s event=initial-sync sync_ms=%s cpu_ms=%.0f pods_touched=%d pushes=%d push_bytes_total=%d push_bytes_max=%d agent_rss_mib=%.1f agent_heap_mib=%.1f settled=%t\n",
			head, ms(x.sync.took), x.syncCPUMS, x.sync.pushes.pods, x.sync.pushes.pushes, x.sync.pushes.bytes, x.sync.pushes.max, x.rssMiB, x.heapMiB, x.sync.settled)
		for _, e := range x.events {
			fmt.Fprintf(&b, "%s event=%s cpu_ms=%.1f sched_cpu_ms=%.1f sched_cpu_median_ms=%.1f pods_touched=%d pushes=%d push_bytes_max=%d last_push_ms=%.0f agent_rss_mib=%.1f reps=%d settled=%t\n",
				head, e.kind, e.cpuMS, e.schedMS, e.schedMedianMS, e.touched, e.pushes, e.maxPush, e.tookMS, x.rssMiB, len(e.reps), e.settled)
		}
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Policy at scale: %s UTC\n\n", r.started.UTC().Format("2006-01-02 15:04"))
	b.WriteString("`make bench-policy` (`hack/bench/policyscale`): the node agent of each build, as a process, against a fake API server " +
		"holding a synthetic cluster, with 100 local pods whose stacks are fake control sockets. " +
		"Every local pod is egress-isolated (a default-deny-egress-but-DNS policy in every namespace). " +
		"An event's CPU is the agent's utime+stime from the injection until no push for the quiet time and its CPU back at idle, " +
		"less its idle rate over that window, the mean of the repetitions: from ticks of 10 ms, so a few ms either way (even below zero) " +
		"for an event that costs next to nothing; the threads' run time beside it is exact to the nanosecond, and its median over the repetitions " +
		"leaves out the agent's idle bursts (its collector, its watches: ~15 ms each) that land in some repetitions and not others. " +
		"pods touched and the largest push are the most any repetition saw.\n\n")
	seen := map[string]bool{}
	for _, x := range r.runs {
		if seen[x.cluster] {
			continue
		}
		seen[x.cluster] = true
		s := x.spec
		fmt.Fprintf(&b, "## %d pods, %d Services, %d endpoints, %d policies\n\n", s.Pods, s.Services, s.Services*s.Endpoints, s.Policies)
		fmt.Fprintf(&b, "%d namespaces, %d local pods, %d ready endpoints a Service.", s.Namespaces, s.Local, s.Endpoints)
		if s.ClusterPolicies > 0 {
			fmt.Fprintf(&b, " %d ClusterNetworkPolicies (Admin and Baseline in turn, each over a tenth of the namespaces).", s.ClusterPolicies)
		}
		b.WriteString("\n\n")
		b.WriteString("Initial sync (agent start to the last of the first pushes):\n\n")
		b.WriteString("| build | revision | command | sync (ms) | CPU (ms) | pushes | bytes pushed (MiB) | largest push (KiB) | RSS after sync (MiB) | live heap after sync (MiB) | RSS at end / peak (MiB) | idle CPU (ms/s) | run took (s) |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, y := range r.runs {
			if y.cluster != x.cluster {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s | `%s` | %s | %.0f | %d | %s | %s | %.0f | %s | %.0f / %.0f | %.1f | %.0f |\n",
				y.build.name, orDash(y.build.rev), y.command, ms(y.sync.took), y.syncCPUMS, y.sync.pushes.pushes,
				mib(y.sync.pushes.bytes), kib(y.sync.pushes.max), y.rssMiB, heapOrDash(y.heapMiB), y.endRSSMiB, y.hwmMiB, y.idleMSs, y.took.Seconds())
		}
		b.WriteString("\nEvents:\n\n")
		b.WriteString("| event | build | CPU (ms) | CPU, threads (ms) | CPU, threads, median (ms) | pods touched | pushes | largest push (KiB) | to last push (ms) | settled |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
		for _, kind := range eventKinds {
			for _, y := range r.runs {
				if y.cluster != x.cluster {
					continue
				}
				for _, e := range y.events {
					if e.kind != kind {
						continue
					}
					fmt.Fprintf(&b, "| %s | %s | %.1f | %.1f | %.1f | %d | %d | %s | %.0f | %t |\n",
						e.kind, y.build.name, e.cpuMS, e.schedMS, e.schedMedianMS, e.touched, e.pushes, kib(e.maxPush), e.tookMS, e.settled)
				}
			}
		}
		b.WriteString("\nThe fake API server's requests:\n\n")
		for _, y := range r.runs {
			if y.cluster != x.cluster {
				continue
			}
			fmt.Fprintf(&b, "- %s: %s; Events posted %d; unknown: %s\n", y.build.name, y.requests, y.evPosted, orDash(y.unknown))
		}
		b.WriteString("\n")
	}
	if !r.finished.IsZero() {
		fmt.Fprintf(&b, "Whole run: %s.\n", r.finished.Sub(r.started).Round(time.Second))
	}
	return b.String()
}

func heapOrDash(m float64) string {
	if m == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", m)
}
