package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/cgroup"
	"github.com/cni-usernet/cni-usernet/hack/bench/report"
	"github.com/cni-usernet/cni-usernet/pkg/agent/noderoutes"
)

// cells summarises the run's samples; ratios are to each row's ratio row
// (ratioTo).
func (b *bench) cells() report.Cells { return report.Summarise(b.samples, ratioTo) }

// ratioTo is the row the ratios of row are taken against: a
// configuration's own choice, add-ptp for the ADD rows, the baseline
// under the same limit for the limits section's rows.
func ratioTo(row string) string {
	base := baseline
	if c := configByName(row); c != nil {
		base = c.ratioTo()
	}
	if strings.HasPrefix(row, "add-") {
		base = "add-ptp"
	}
	if _, l, ok := limitOf(row); ok {
		base = limitRow(baseline, l)
	}
	return base
}

// problems lists the cells of configurations that ran but produced no
// number, with the last error seen for them, and the stacks that did not
// take the GSO setting asked for.
func (b *bench) problems() []string {
	cells := b.cells()
	lastErr := func(cfg, m string) string {
		for i := len(b.failures) - 1; i >= 0; i-- {
			if f := b.failures[i]; f.Config == cfg {
				return f.Workload + ": " + report.FirstLine(f.Error)
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
			out = append(out, fmt.Sprintf("%s %s (%s)", f.Config, f.Workload, report.FirstLine(f.Error)))
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
		ms := report.Metrics
		if c.CrossNode != "" || c.SameNode {
			ms = report.CrossMetrics
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

// writeReport writes the run's record, samples.json, and the report of
// it: summary.json and table.md.
func (b *bench) writeReport() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	host, _ := os.Hostname()
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	meta := map[string]any{
		"started": b.started.UTC().Format(time.RFC3339), "finished": time.Now().UTC().Format(time.RFC3339),
		"host": host, "kernel": strings.TrimSpace(string(kernel)), "cpus": runtime.NumCPU(),
		"options": b.o, "args": os.Args[1:],
	}
	d := b.reportData()
	d.Kernel = meta["kernel"].(string)
	var cfgs []map[string]string
	for _, c := range d.Configs {
		cfgs = append(cfgs, map[string]string{"name": c.Name, "desc": c.Desc, "status": c.Status})
	}
	if err := report.WriteJSON(filepath.Join(b.o.Out, "samples.json"), map[string]any{
		"meta": meta, "configs": cfgs, "attachments": b.atts, "samples": b.samples, "failures": b.failures,
	}); err != nil {
		return err
	}
	return report.Write(b.o.Out, d)
}

// reportData is what the report shows of the run.
func (b *bench) reportData() report.Data {
	d := report.Data{
		Started: b.started, CPUs: runtime.NumCPU(),
		Settings: report.Settings{
			Rounds: b.o.Rounds, IperfTime: b.o.IperfTime, RRTime: b.o.RRTime, RedisN: b.o.RedisN, NginxN: b.o.NginxN,
			AddPods: b.o.AddPods, AddParallel: b.o.AddParallel,
		},
		Baseline: baseline, Cells: b.cells(), Failures: b.failures, Skipped: b.skipped, Sizing: b.o.Sizing,
	}
	row := func(c *config) report.Row { return report.Row{Name: c.Name, Stack: c.stack()} }
	var crossRows, sameNodeRows []report.Row
	for _, c := range b.selected() {
		rc := report.Config{Name: c.Name, Desc: c.Desc, Status: "ran", Peer: c.Peer != "", Method: c.Method}
		if why, ok := b.skipped[c.Name]; ok {
			rc.Status = "skipped: " + why
		}
		for _, a := range b.atts {
			if a.Config == c.Name {
				rc.IP, rc.HostVeth = a.IP, a.HostVeth
				var st stackStatus
				if json.Unmarshal(a.Status, &st) == nil && st.GSO.Mode != "" {
					rc.GSO = &report.GSO{Mode: st.GSO.Mode, MaxSize: st.GSO.MaxSize, MaxSegs: st.GSO.MaxSegs}
				}
			}
		}
		d.Configs = append(d.Configs, rc)
		switch {
		case c.SameNode:
			sameNodeRows = append(sameNodeRows, row(c))
		case c.CrossNode != "":
			crossRows = append(crossRows, row(c))
		default:
			d.PodRows = append(d.PodRows, row(c))
		}
	}
	if len(sameNodeRows) > 0 {
		d.SameNode = &report.SameNode{Rows: sameNodeRows, Subnet: subnet4, Baseline: configByName(sameNodeRows[0].Name).ratioTo()}
		for _, r := range sameNodeRows {
			if c := configByName(r.Name); c.Service {
				d.SameNode.Service, d.SameNode.ServiceSubnet = c.ratioTo(), serviceSubnet
				break
			}
		}
	}
	if len(crossRows) > 0 {
		d.Cross = &report.Cross{
			Rows: crossRows, VXLANMTU: xVXLANMTU, FlannelDev: xFlannelDev, FlannelVNI: xFlannelVNI, FlannelPort: xFlannelPort,
			AgentVNI: noderoutes.DefaultVXLANVNI, AgentPort: noderoutes.DefaultVXLANPort,
		}
	}
	for _, ac := range addConfigs {
		d.AddRows = append(d.AddRows, report.Row{Name: ac.Name})
	}
	if b.o.Scale {
		d.Scale = &report.Scale{Pods: b.o.ScalePods, Streams: b.o.Streams}
		for _, n := range []string{"kernel", "usernet-hardware"} {
			if c := configByName(n); c != nil && slices.Contains(b.selected(), c) {
				d.Scale.StreamRows = append(d.Scale.StreamRows, row(c))
			}
		}
	}
	if len(b.o.CPULimits) > 0 {
		d.Limits = &report.Limits{PeriodMs: cgroup.CFSPeriodUs / 1000}
		for _, l := range b.o.CPULimits {
			for _, name := range b.limitConfigNames() {
				if c := configByName(name); c != nil {
					d.Limits.Rows = append(d.Limits.Rows, report.Row{Name: limitRow(name, l.Label), Stack: c.usernet()})
				}
			}
			d.Limits.Labels = append(d.Limits.Labels, l.Label)
			d.Limits.RedisN = append(d.Limits.RedisN, b.limitRedisN(l))
		}
	}
	return d
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
		Samples     []report.Sample     `json:"samples"`
		Failures    []report.Failure    `json:"failures"`
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
