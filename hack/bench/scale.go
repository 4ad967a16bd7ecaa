package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/loadgen"
	"github.com/cni-usernet/cni-usernet/hack/bench/procfs"
	"github.com/cni-usernet/cni-usernet/hack/bench/report"
	"github.com/cni-usernet/cni-usernet/hack/bench/rig"
	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

// The scale section (--scale, on in full runs): how the cost grows with the
// work, run once after the rounds.
//
//   - scaleIdle: ScalePods idle pods attached one after another through
//     cni-usernet (usernet-hardware's configuration): the total PSS of
//     their stack processes (smaps_rollup; PSS splits every shared page
//     among the processes that map it, so the binary's text counts once in
//     the sum) per pod, and the ADD latency of the last 20, taken with
//     ScalePods-20 stacks already running.
//   - streams: one pod, iperf3 with each of Streams concurrent streams
//     node→pod (two iperf3 clients from 2 streams on, more past iperf3's
//     limit of 128 streams per client),
//     aggregate Gbit/s and the stack's peak RSS, for kernel and
//     usernet-hardware.

const (
	scaleIdle   = report.ScaleIdleRow
	scalePrefix = nsPrefix + "scale-"
	// iperfMaxStreams is iperf3's limit on -P.
	iperfMaxStreams = 128
)

func (b *bench) scale(ctx context.Context, live []*attachment) {
	byName := map[string]*attachment{}
	for _, a := range live {
		byName[a.Config] = a
	}
	if u := byName["usernet-hardware"]; u != nil {
		runlog.Logf("scale: %d idle cni-usernet pods", b.o.ScalePods)
		if err := b.idlePods(ctx, u); err != nil {
			b.fail(0, scaleIdle, "idle pods", err)
		}
	} else {
		b.skipped[scaleIdle] = "needs configuration usernet-hardware"
	}
	for _, name := range []string{"kernel", "usernet-hardware"} {
		a := byName[name]
		if a == nil {
			continue
		}
		for _, n := range b.o.Streams {
			if ctx.Err() != nil {
				return
			}
			runlog.Logf("scale: %s, %d streams node→pod", name, n)
			workload := fmt.Sprintf("streams %d", n)
			err := b.streams(ctx, a, n)
			if err != nil && strings.Contains(err.Error(), "the server has terminated") && ctx.Err() == nil {
				b.fail(0, name, workload+" (retried)", err) // as in runWorkloads
				err = b.streams(ctx, a, n)
			}
			if err != nil {
				b.fail(0, name, workload, err)
			}
		}
	}
}

// idlePods attaches ScalePods pods with u's configuration one at a time,
// reads their stacks' memory once they are idle, and detaches them.
func (b *bench) idlePods(ctx context.Context, u *attachment) error {
	n := b.o.ScalePods
	for i := range n {
		if err := b.rig.AddNS(ctx, fmt.Sprintf("%s%d", scalePrefix, i)); err != nil {
			return err
		}
	}
	b.mu.Lock()
	b.scaleUp = u.ConfPath // from here on, cleanup detaches them
	b.mu.Unlock()
	out, err := rig.Output(ctx, 15*time.Minute, nodeNS, b.cniArgs("addmany", u.ConfPath, "--netns-prefix", "/run/netns/"+scalePrefix,
		"--id-prefix", scalePrefix, "--n", strconv.Itoa(n), "--parallel", "1")...)
	if err != nil {
		return err
	}
	var res addBenchResult
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("parsing addmany output %q: %w", out, err)
	}
	if len(res.Errors) > 0 {
		return fmt.Errorf("%d of %d ADDs failed, first: %s", len(res.Errors), n, res.Errors[0])
	}
	last := res.AddMS[max(0, len(res.AddMS)-20):]
	b.record(0, scaleIdle, "pods", float64(n))
	b.record(0, scaleIdle, "add_all_p50_ms", quantile(res.AddMS, 0.5))
	b.record(0, scaleIdle, "add_last20_p50_ms", quantile(last, 0.5))
	b.record(0, scaleIdle, "add_last20_p99_ms", quantile(last, 0.99))
	runlog.Logf("  ADD of %d pods one at a time: p50 %.0f ms; last 20: p50 %.0f, p99 %.0f ms", n, quantile(res.AddMS, 0.5), quantile(last, 0.5), quantile(last, 0.99))

	time.Sleep(5 * time.Second) // let the stacks settle after start
	pids, err := b.stackPIDs(ctx, scalePrefix)
	if err != nil {
		return err
	}
	if len(pids) != n {
		return fmt.Errorf("cni-usernet status lists %d healthy stacks of the %d pods", len(pids), n)
	}
	var sum procfs.Smaps
	for _, pid := range pids {
		s, err := procfs.ReadSmapsRollup(pid)
		if err != nil {
			return err
		}
		sum.Add(s)
	}
	const mib = 1024 * 1024
	b.record(0, scaleIdle, "pss_per_pod_mib", sum.Pss/float64(n)/mib)
	b.record(0, scaleIdle, "pss_anon_per_pod_mib", sum.PssAnon/float64(n)/mib)
	b.record(0, scaleIdle, "pss_file_per_pod_mib", sum.PssFile/float64(n)/mib)
	b.record(0, scaleIdle, "rss_per_pod_mib", sum.Rss/float64(n)/mib)
	b.record(0, scaleIdle, "pss_total_mib", sum.Pss/mib)
	runlog.Logf("  %d stacks: PSS %.1f MiB per pod (anon %.1f, file %.1f), RSS %.1f MiB per pod, %.0f MiB in all",
		n, sum.Pss/float64(n)/mib, sum.PssAnon/float64(n)/mib, sum.PssFile/float64(n)/mib, sum.Rss/float64(n)/mib, sum.Pss/mib)

	// What idle stacks cost the node: their CPU over idleCPUWindow.
	cpu0 := procfs.ProcessesCPU(pids)
	time.Sleep(idleCPUWindow)
	perPodMin := (procfs.ProcessesCPU(pids) - cpu0) * 1000 / float64(n) * float64(time.Minute) / float64(idleCPUWindow)
	b.record(0, scaleIdle, "idle_cpu_ms_per_pod_min", perPodMin)
	runlog.Logf("  idle: %.2f ms of CPU per pod per minute", perPodMin)

	t0 := time.Now()
	dres, err := b.scaleDown(ctx, u.ConfPath)
	if err != nil {
		return err
	}
	b.record(0, scaleIdle, "del_p50_ms", quantile(dres.DelMS, 0.5))
	runlog.Logf("  DEL of %d pods: p50 %.0f ms, %.0f s in all", n, quantile(dres.DelMS, 0.5), time.Since(t0).Seconds())
	return nil
}

// scaleDown detaches the scale section's pods (one at a time) and removes
// their namespaces; cleanup calls it too when a run stops half-way.
func (b *bench) scaleDown(ctx context.Context, conf string) (addBenchResult, error) {
	var res addBenchResult
	out, err := rig.Output(ctx, 15*time.Minute, nodeNS, b.cniArgs("delmany", conf, "--netns-prefix", "/run/netns/"+scalePrefix,
		"--id-prefix", scalePrefix, "--n", strconv.Itoa(b.o.ScalePods), "--parallel", "4")...)
	if err == nil {
		err = json.Unmarshal(out, &res)
	}
	if err == nil && len(res.Errors) > 0 {
		err = fmt.Errorf("%d DELs failed, first: %s", len(res.Errors), res.Errors[0])
	}
	b.mu.Lock()
	b.scaleUp = ""
	b.mu.Unlock()
	b.rig.RemoveNSFunc(ctx, func(ns string) bool { return strings.HasPrefix(ns, scalePrefix) })
	return res, err
}

// stackPIDs returns the PIDs of the healthy stacks whose container ID
// starts with prefix.
func (b *bench) stackPIDs(ctx context.Context, prefix string) ([]int, error) {
	out, err := rig.Output(ctx, time.Minute, nodeNS, b.o.BinDir+"/cni-usernet", "status", "--json", "--state-dir", b.tmp+"/state")
	if err != nil {
		return nil, err
	}
	var sts []stackStatus
	if err := json.Unmarshal(out, &sts); err != nil {
		return nil, fmt.Errorf("parsing cni-usernet status: %w", err)
	}
	var pids []int
	for _, s := range sts {
		if strings.HasPrefix(s.ContainerID, prefix) && s.Healthy && s.PID > 0 {
			pids = append(pids, s.PID)
		}
	}
	return pids, nil
}

// streams runs n concurrent streams node→pod against pod a: aggregate
// Gbit/s, and for a stack the peak RSS sampled while they run.
func (b *bench) streams(ctx context.Context, a *attachment, n int) error {
	// iperf3 3.12 (Debian 12) runs every stream of a client in one thread:
	// with one client process, many streams would measure that thread.
	// From 2 streams on, two clients (more past 2×128), one per core.
	clients := max(min(n, 2), (n+iperfMaxStreams-1)/iperfMaxStreams)
	var srvs []*rig.Proc
	defer func() {
		for _, s := range srvs {
			b.rig.Stop(s)
		}
	}()
	for i := range clients {
		port := iperfPort + 10 + i
		s, err := b.serve(ctx, 0, a, fmt.Sprintf("iperf3-streams%d-%d", n, i), port, "iperf3", "-s", "-p", strconv.Itoa(port))
		if err != nil {
			return err
		}
		srvs = append(srvs, s)
	}
	stopSampling := make(chan struct{})
	var peak float64
	var sampler sync.WaitGroup
	if a.StackPID > 0 {
		sampler.Add(1)
		go func() {
			defer sampler.Done()
			for {
				if rss, err := procfs.VMRSS(a.StackPID); err == nil && rss > peak {
					peak = rss
				}
				select {
				case <-stopSampling:
					return
				case <-time.After(200 * time.Millisecond):
				}
			}
		}()
	}
	secs := strconv.Itoa(int(b.o.IperfTime.Seconds()))
	type result struct {
		gbps float64
		err  error
	}
	results := make([]result, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			per := n / clients
			if i < n%clients {
				per++
			}
			out, err := rig.Output(ctx, b.o.IperfTime+time.Minute, nodeNS, "iperf3", "-c", a.IP, "-p", strconv.Itoa(iperfPort+10+i),
				"-t", secs, "-P", strconv.Itoa(per), "-J")
			gbps, _, _, perr := loadgen.ParseIperf(out)
			if perr != nil {
				err = perr
			}
			results[i] = result{gbps, err}
		}()
	}
	wg.Wait()
	close(stopSampling)
	sampler.Wait()
	var sum float64
	for i, r := range results {
		if r.err != nil {
			return fmt.Errorf("client %d of %d: %w", i+1, clients, r.err)
		}
		sum += r.gbps
	}
	b.record(0, a.Config, fmt.Sprintf("streams_%d_gbps", n), sum)
	msg := ""
	if a.StackPID > 0 {
		b.record(0, a.Config, fmt.Sprintf("streams_%d_rss_mib", n), peak)
		msg = fmt.Sprintf(", stack peak RSS %.1f MiB", peak)
	}
	runlog.Logf("  %d streams: %.2f Gbit/s%s", n, sum, msg)
	return nil
}

// idleCPUWindow is how long the scale section watches its idle stacks'
// CPU: long enough for the Go runtime's background work and the stacks'
// own timers to show.
const idleCPUWindow = 20 * time.Second
