// Package report turns the numbers of a benchmark run into summary.json
// and the BENCHMARKS-style tables of table.md. The run hands it plain
// data: its samples summarised into cells, its failures, and the rows of
// each section.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

// The rows of the sections whose numbers are not a configuration's.
const (
	ScaleIdleRow = "scale-idle" // the scale section's idle pods
	SizingRow    = "sizing"     // the sizing section's stack
)

// Settings are the knobs of the run that the report's header names.
type Settings struct {
	Rounds            int
	IperfTime, RRTime time.Duration
	RedisN, NginxN    int
	AddPods           int
	AddParallel       int
}

// Row is one row of a table: a configuration, or a section's row.
type Row struct {
	Name string
	// Stack says the row's traffic crosses a stack process, so the
	// stack-only columns apply to it.
	Stack bool
	// AnyFailure lets any failure of the row explain an empty cell, not
	// only that of the workload behind the column.
	AnyFailure bool
}

// GSO is the segmentation a stack reports.
type GSO struct {
	Mode             string
	MaxSize, MaxSegs int
}

// Config is one configuration the run selected, as the Configurations
// table shows it.
type Config struct {
	Name, Desc string
	Status     string // "ran" or "skipped: why"
	// IP and HostVeth are its pod's; GSO what its stack reported (nil:
	// no stack, or no report).
	IP, HostVeth string
	GSO          *GSO
	// Peer says the configuration is another userspace stack, set up as
	// Method says.
	Peer   bool
	Method string
}

// Data is everything the report shows of one run.
type Data struct {
	Started  time.Time
	Kernel   string // its release
	CPUs     int
	Settings Settings
	// Baseline is the row the others' ratios are taken against.
	Baseline string
	Cells    Cells
	Failures []Failure
	Skipped  map[string]string // row → why it did not run
	Configs  []Config          // in run order
	// PodRows are the configurations measured against the node; AddRows
	// the ADD/DEL latency rows. A run without pod rows (pod-to-pod rows
	// alone) has neither their tables, the scale and sizing sections
	// nor the targets.
	PodRows  []Row
	AddRows  []Row
	SameNode *SameNode // nil: no pod-to-pod rows on one node
	Cross    *Cross    // nil: no cross-node rows
	Scale    *Scale    // nil: no scale section
	Limits   *Limits   // nil: no limits section
	Sizing   bool      // the sizing section ran
}

// Write writes dir's summary.json and table.md.
func Write(dir string, d Data) error {
	var cfgs []map[string]string
	for _, c := range d.Configs {
		cfgs = append(cfgs, map[string]string{"name": c.Name, "desc": c.Desc, "status": c.Status})
	}
	if err := WriteJSON(filepath.Join(dir, "summary.json"), map[string]any{
		"baseline": d.Baseline, "configs": cfgs, "metrics": Metrics, "cells": d.Cells,
	}); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "table.md"), []byte(d.table()), 0o644)
}

// WriteJSON writes v to path, indented.
func WriteJSON(path string, v any) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(raw, '\n'), 0o644)
}

// table renders table.md.
func (d *Data) table() string {
	var w strings.Builder
	s := d.Settings
	fmt.Fprintf(&w, "# cni-usernet benchmark\n\n")
	fmt.Fprintf(&w, "%s, kernel %s, %d CPUs; %d round(s), configurations interleaved (reversed in even rounds); iperf3 %s per direction, redis-benchmark -n %d, ab -n %d -c 5 (10 MiB), TCP_RR %s, ADD of %d pods %d at a time.\n\n",
		d.Started.UTC().Format("2006-01-02 15:04 UTC"), d.Kernel, d.CPUs, s.Rounds, s.IperfTime, s.RedisN, s.NginxN, s.RRTime, s.AddPods, s.AddParallel)
	fmt.Fprintf(&w, "Cells: median (min–max over rounds) ×ratio to the `%s` row (ADD rows: to `add-ptp`). For ratios of µs, ms, retransmits, cores and MiB, lower is better.\n", d.Baseline)
	podRun := len(d.PodRows) > 0
	if podRun {
		d.summary(&w)
		groups, byGroup := groupsOf(Metrics)
		for _, g := range groups {
			fmt.Fprintf(&w, "\n## %s\n\n", g)
			d.grid(&w, byGroup[g], d.PodRows)
		}
	}
	if d.SameNode != nil && len(d.SameNode.Rows) > 0 {
		d.sameNodeSection(&w)
	}
	if d.Cross != nil && len(d.Cross.Rows) > 0 {
		d.crossSection(&w)
	}
	if podRun {
		fmt.Fprintf(&w, "\n## CNI ADD/DEL latency (%d pods, %d concurrent)\n\n", s.AddPods, s.AddParallel)
		d.grid(&w, addMetrics, d.AddRows)
	}
	if d.Scale != nil && podRun {
		d.scaleSection(&w)
	}
	if d.Limits != nil {
		d.limitsSection(&w)
	}
	if d.Sizing && podRun {
		d.sizingSection(&w)
	}
	if podRun {
		fmt.Fprintf(&w, "\n## Targets (goals, not assertions)\n\n| target | goal | measured | |\n|---|---|---|---|\n")
		for _, t := range targets {
			v, ok := t.Value(d.Cells)
			switch {
			case !ok:
				fmt.Fprintf(&w, "| %s | %s | — | not measured |\n", t.What, t.Goal)
			case t.Met(v):
				fmt.Fprintf(&w, "| %s | %s | %s | met |\n", t.What, t.Goal, FmtNum(v))
			default:
				fmt.Fprintf(&w, "| %s | %s | %s | **not met** |\n", t.What, t.Goal, FmtNum(v))
			}
		}
	}
	d.configurations(&w)
	if len(d.Failures) > 0 {
		fmt.Fprintf(&w, "\n## Failures\n\n| round | configuration | workload | error |\n|---|---|---|---|\n")
		for _, f := range d.Failures {
			fmt.Fprintf(&w, "| %d | %s | %s | %s |\n", f.Round, f.Config, f.Workload, strings.ReplaceAll(runlog.Tail(FirstLine(f.Error), 300), "|", "\\|"))
		}
	}
	return w.String()
}

// configurations writes the table of the configurations and, when the
// run has peers, how each is set up.
func (d *Data) configurations(w *strings.Builder) {
	fmt.Fprintf(w, "\n## Configurations\n\n| configuration | what | status | pod IP | host veth | GSO reported by the stack |\n|---|---|---|---|---|---|\n")
	for _, c := range d.Configs {
		gso := ""
		if c.GSO != nil {
			gso = fmt.Sprintf("%s, maxSize %d, maxSegs %d", c.GSO.Mode, c.GSO.MaxSize, c.GSO.MaxSegs)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", c.Name, c.Desc, c.Status, c.IP, c.HostVeth, gso)
	}
	var peers []Config
	for _, c := range d.Configs {
		if c.Peer {
			peers = append(peers, c)
		}
	}
	if len(peers) > 0 {
		fmt.Fprintf(w, "\n## How the peers are set up\n\n| configuration | method | GB through the tap device, whole run |\n|---|---|---|\n")
		for _, c := range peers {
			gb := "n/a"
			if cl := d.Cells[c.Name]["tap_gb"]; cl != nil {
				gb = FmtNum(cl.Max)
			}
			fmt.Fprintf(w, "| %s | %s | %s |\n", c.Name, mdCell(c.Method), gb)
		}
	}
}

// grid writes one table: a column per metric, a row per row.
func (d *Data) grid(w *strings.Builder, ms []Metric, rows []Row) {
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
		if why, ok := d.Skipped[c.Name]; ok {
			fmt.Fprintf(w, "| %s | skipped: %s |%s\n", c.Name, mdCell(why), strings.Repeat(" |", len(ms)-1))
			continue
		}
		fmt.Fprintf(w, "| %s |", c.Name)
		for _, m := range ms {
			switch cl := d.Cells[c.Name][m.Key]; {
			case cl != nil:
				s := cl.String()
				if n := d.failedRounds(c.Name, m.Key); n > 0 {
					s += fmt.Sprintf(", %d round(s) failed", n)
				}
				fmt.Fprintf(w, " %s |", s)
			case m.StackOnly && !c.Stack:
				fmt.Fprintf(w, " n/a |")
			default:
				if why := d.failedWhy(c.Name, m.Key, c.AnyFailure); why != "" {
					fmt.Fprintf(w, " failed: %s |", mdCell(why))
				} else {
					fmt.Fprintf(w, " — |")
				}
			}
		}
		fmt.Fprintln(w)
	}
}

// summary is the headline table: the baseline row in units, every other
// row as ratios to it, CPU in units (all CPUs; the stack process alone).
func (d *Data) summary(w *strings.Builder) {
	fmt.Fprintf(w, "\n## Summary\n\nKernel row in units, the others as ×ratio to it (medians); CPU columns in units: all CPUs / the stack process alone.\n\n")
	fmt.Fprintf(w, "| configuration | node→pod | pod→node | redis SET / GET | nginx 10 MiB | TCP_RR p50 | core·s per GB pod→node | core·ms per 1k redis requests |\n|---|---|---|---|---|---|---|---|\n")
	val := func(cfg, key, unit string) string {
		cl := d.Cells[cfg][key]
		switch {
		case cl == nil:
			if _, ok := d.Skipped[cfg]; ok {
				return "skipped"
			}
			if why := d.failedWhy(cfg, key, false); why != "" {
				return "failed: " + mdCell(why)
			}
			return "—"
		case cfg == d.Baseline || cl.Ratio == nil:
			return FmtNum(cl.Median) + " " + unit
		default:
			return fmt.Sprintf("%.2f×", *cl.Ratio)
		}
	}
	cpu := func(cfg, all, stack string) string {
		a, st := d.Cells[cfg][all], d.Cells[cfg][stack]
		switch {
		case a == nil:
			return "—"
		case st == nil:
			return FmtNum(a.Median)
		default:
			return FmtNum(a.Median) + " / " + FmtNum(st.Median)
		}
	}
	for _, c := range d.PodRows {
		if why, ok := d.Skipped[c.Name]; ok {
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
