package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/cgroup"
	"github.com/cni-usernet/cni-usernet/hack/bench/loadgen"
	"github.com/cni-usernet/cni-usernet/hack/bench/procfs"
	"github.com/cni-usernet/cni-usernet/hack/bench/rig"
	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

// The limits section (--cpu-limits): what a pod's CPU limit leaves it
// once its stack is charged to it. For each limit and each of limitConfigs
// the pod's processes go into a cgroup with that CFS quota, as kubelet
// sets a pod's: the server, and for cni-usernet the pod's stack, moved
// there the way the plugin moves it into the pod's cgroup at ADD. The
// load generators stay in the node namespace, outside any limit. The
// kernel veth's pod is only its server: the pod kernel's TCP receive runs
// in softirq on whatever CPU and task the interrupt finds, mostly the
// node's sender, and is billed to no pod.

// limitConfigs are the configurations always measured under each limit;
// limitOptional are measured too when the run has them (--only), so that
// a path that is not the default is weighed where users meet the price
// first, against the kernel's pod under the same limit.
var (
	limitConfigs  = []string{"kernel", "usernet-hardware"}
	limitOptional = []string{"usernet-hardware-redirectboth"}
)

// limitConfigNames are the configurations this run measures under each
// limit.
func (b *bench) limitConfigNames() []string {
	out := slices.Clone(limitConfigs)
	for _, n := range limitOptional {
		if c := configByName(n); c != nil && slices.Contains(b.selected(), c) {
			out = append(out, n)
		}
	}
	return out
}

// cpuLimit is one CPU limit, as a pod spec writes it.
type cpuLimit struct {
	Label string  `json:"label"` // "100m", "2", "max"
	Cores float64 `json:"cores"` // 0: no quota
}

// parseCPULimits reads a comma-separated list of Kubernetes CPU
// quantities ("100m", "0.5", "2") and "max" for a cgroup without quota.
func parseCPULimits(s string) ([]cpuLimit, error) {
	var out []cpuLimit
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		l := cpuLimit{Label: f}
		if f != "max" {
			var err error
			if m, ok := strings.CutSuffix(f, "m"); ok {
				var n int
				n, err = strconv.Atoi(m)
				l.Cores = float64(n) / 1000
			} else {
				l.Cores, err = strconv.ParseFloat(f, 64)
			}
			// The kernel takes no quota under 1 ms of a period; 10m is
			// kubelet's smallest that keeps its meaning.
			if err != nil || l.Cores < 0.01 || l.Cores > 256 {
				return nil, fmt.Errorf("-cpu-limits: %q is not a CPU limit from 10m to 256, or max", f)
			}
		}
		for _, o := range out {
			if o.Label == l.Label {
				return nil, fmt.Errorf("-cpu-limits: %q given twice", f)
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// limitRow is the report's row of configuration cfg under limit label.
func limitRow(cfg, label string) string { return cfg + "@" + label }

// limitOf splits a row of the limits section into its configuration
// and limit; ok is false for any other row.
func limitOf(row string) (cfg, label string, ok bool) {
	return strings.Cut(row, "@")
}

// limitRedisN scales redis-benchmark's requests with the limit, so that a
// pod held to a tenth of a core answers them in about the time an
// unlimited one takes for RedisN.
func (b *bench) limitRedisN(l cpuLimit) int {
	if l.Cores == 0 || l.Cores >= 1 {
		return b.o.RedisN
	}
	return max(2000, int(float64(b.o.RedisN)*l.Cores))
}

func (b *bench) limits(ctx context.Context, live []*attachment) {
	byName := map[string]*attachment{}
	for _, a := range live {
		byName[a.Config] = a
	}
	fs, err := b.cgroups()
	type job struct {
		l cpuLimit
		a *attachment
	}
	var jobs []job
	for _, l := range b.o.CPULimits {
		for _, name := range b.limitConfigNames() {
			row := limitRow(name, l.Label)
			switch a := byName[name]; {
			case err != nil:
				b.skipped[row] = err.Error()
			case a == nil:
				b.skipped[row] = "needs configuration " + name
				if why, ok := b.skipped[name]; ok {
					b.skipped[row] = why
				}
			default:
				jobs = append(jobs, job{l, a})
			}
		}
	}
	if err != nil {
		runlog.Logf("limits: skipped: %v", err)
		return
	}
	runlog.Logf("limits: %s", fs)
	for r := 1; r <= b.o.Rounds; r++ {
		for _, j := range roundOrder(jobs, r) {
			if ctx.Err() != nil {
				return
			}
			row := limitRow(j.a.Config, j.l.Label)
			runlog.Logf("limits round %d/%d: %s", r, b.o.Rounds, row)
			if err := b.underLimit(ctx, r, fs, j.l, j.a); err != nil {
				b.fail(r, row, "setup", err)
			}
		}
	}
}

// cgroups finds the hierarchies once per run; sweep runs at cleanup.
func (b *bench) cgroups() (*cgroup.FS, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cgfs == nil {
		fs := &cgroup.FS{}
		if err := fs.Detect(); err != nil {
			return nil, err
		}
		b.cgfs = fs
	}
	return b.cgfs, nil
}

// podCgroup is a pod's cgroup in the limits section: the quota on the
// pod, the server and the stack in children of their own so that the
// stack's share is read from the kernel's counters, not from /proc's
// ticks. v1's quota, like v2's, holds a cgroup's descendants.
type podCgroup struct {
	pod, server, stack *cgroup.Group
}

func (b *bench) underLimit(ctx context.Context, r int, fs *cgroup.FS, l cpuLimit, a *attachment) (err error) {
	row := limitRow(a.Config, l.Label)
	base := cgroup.Prefix + strings.ReplaceAll(row, "@", "-")
	var pc podCgroup
	defer func() {
		for _, m := range fs.Mounts() {
			if rerr := cgroup.RemoveTree(m, filepath.Join(m, base)); rerr != nil && err == nil {
				err = rerr
			}
		}
	}()
	if pc.pod, err = fs.Create(base, "cpu"); err != nil {
		return err
	}
	if err := pc.pod.SetCPULimit(l.Cores); err != nil {
		return err
	}
	if pc.server, err = fs.Create(base+"/server", "cpu"); err != nil {
		return err
	}
	if a.cfg.usernet() {
		if pc.stack, err = fs.Create(base+"/stack", "cpu"); err != nil {
			return err
		}
		// The stack may have been restarted since the last round.
		st, err := b.stackStatus(ctx, a)
		if err != nil {
			return err
		}
		a.StackPID = st.PID
		was, err := cgroup.PlacementOf(a.StackPID)
		if err != nil {
			return err
		}
		if err := pc.stack.Join(a.StackPID); err != nil {
			return err
		}
		defer func() {
			if rerr := fs.Restore(a.StackPID, was, pc.stack); rerr != nil && err == nil {
				err = fmt.Errorf("moving the stack back: %w", rerr)
			}
		}()
	}
	if err := b.limitIperf(ctx, r, row, a, pc); err != nil {
		b.fail(r, row, "iperf3", err)
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := b.limitRedis(ctx, r, row, l, a, pc); err != nil {
		b.fail(r, row, "redis", err)
	}
	return nil
}

// serveLimited starts a server in the pod and moves it, with anything it
// forked, into the pod's server cgroup before any client connects.
func (b *bench) serveLimited(ctx context.Context, r int, row string, a *attachment, pc podCgroup, name string, port int, argv ...string) (*rig.Proc, error) {
	p, err := b.serve(ctx, r, a, strings.ReplaceAll(row, "@", "-")+"-"+name, port, argv...)
	if err != nil {
		return nil, err
	}
	if p == nil {
		b.rig.Stop(p)
		return nil, fmt.Errorf("%s: no server process to limit", row)
	}
	pids := procfs.ProcessGroup(p.Pid())
	if len(pids) == 0 {
		b.rig.Stop(p)
		return nil, fmt.Errorf("%s: server %d has no live process", name, p.Pid())
	}
	for _, pid := range pids {
		if err := pc.server.Join(pid); err != nil {
			b.rig.Stop(p)
			return nil, err
		}
	}
	return p, nil
}

// cpuSnap is the counters a limited workload is measured between.
type cpuSnap struct {
	at                  time.Time
	pod, stack, machine float64 // CPU seconds
	periods, throttled  float64
}

func (pc podCgroup) snap() (cpuSnap, error) {
	s := cpuSnap{at: time.Now(), machine: procfs.SystemCPU()}
	var err error
	if s.pod, err = pc.pod.CPUSeconds(); err != nil {
		return s, err
	}
	if pc.stack != nil {
		if s.stack, err = pc.stack.CPUSeconds(); err != nil {
			return s, err
		}
	}
	s.periods, s.throttled, err = pc.pod.Throttling()
	return s, err
}

// recordCPU records where the CPU went during workload w: the cores the
// pod's cgroup used, the stack's share of them, the share of CFS periods
// in which the pod ran out of quota, and the whole machine's busy cores
// (the node's clients and the softirq work no pod is billed for).
func (b *bench) recordCPU(r int, row, w string, s0, s1 cpuSnap, stack bool) {
	wall := s1.at.Sub(s0.at).Seconds()
	pod := s1.pod - s0.pod
	b.record(r, row, "pod_cores_"+w, pod/wall)
	b.record(r, row, "machine_cores_"+w, (s1.machine-s0.machine)/wall)
	if stack && pod > 0 {
		b.record(r, row, "stack_share_"+w, (s1.stack-s0.stack)/pod)
	}
	if p := s1.periods - s0.periods; p > 0 {
		b.record(r, row, "throttled_"+w, (s1.throttled-s0.throttled)/p)
	}
}

func (b *bench) limitIperf(ctx context.Context, r int, row string, a *attachment, pc podCgroup) error {
	srv, err := b.serveLimited(ctx, r, row, a, pc, "iperf3", iperfPort, "iperf3", "-s", "-p", strconv.Itoa(iperfPort))
	if err != nil {
		return err
	}
	defer b.rig.Stop(srv)
	secs := strconv.Itoa(int(b.o.IperfTime.Seconds()))
	for _, dir := range []string{"n2p", "p2n"} {
		argv := []string{"iperf3", "-c", a.IP, "-p", strconv.Itoa(iperfPort), "-t", secs, "-J"}
		if dir == "p2n" {
			argv = append(argv, "-R")
		}
		s0, err := pc.snap()
		if err != nil {
			return err
		}
		out, err := rig.Output(ctx, b.o.IperfTime+time.Minute, nodeNS, argv...)
		s1, serr := pc.snap()
		gbps, _, _, perr := loadgen.ParseIperf(out)
		switch {
		case perr != nil:
			return fmt.Errorf("%s: %w", dir, perr)
		case err != nil:
			return fmt.Errorf("%s: %w", dir, err)
		case serr != nil:
			return serr
		}
		b.record(r, row, "tcp_"+dir+"_gbps", gbps)
		b.recordCPU(r, row, dir, s0, s1, pc.stack != nil)
		runlog.Logf("  iperf3 %s %.2f Gbit/s; pod %.2f cores, stack %.0f%% of them, throttled in %.0f%% of periods",
			dir, gbps, (s1.pod-s0.pod)/s1.at.Sub(s0.at).Seconds(), 100*share(s1.stack-s0.stack, s1.pod-s0.pod), 100*share(s1.throttled-s0.throttled, s1.periods-s0.periods))
	}
	return nil
}

func (b *bench) limitRedis(ctx context.Context, r int, row string, l cpuLimit, a *attachment, pc podCgroup) error {
	srv, err := b.serveLimited(ctx, r, row, a, pc, "redis", redisPort, "redis-server", "--port", strconv.Itoa(redisPort),
		"--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", b.tmp)
	if err != nil {
		return err
	}
	defer b.rig.Stop(srv)
	s0, err := pc.snap()
	if err != nil {
		return err
	}
	out, err := rig.Output(ctx, 10*time.Minute, nodeNS, "redis-benchmark", "-h", a.IP, "-p", strconv.Itoa(redisPort),
		"-n", strconv.Itoa(b.limitRedisN(l)), "-t", "set,get", "--csv")
	s1, serr := pc.snap()
	if err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	res, err := loadgen.ParseRedis(out)
	if err != nil {
		return err
	}
	for _, t := range []string{"set", "get"} {
		b.record(r, row, "redis_"+t+"_krps", res[t][0]/1000)
	}
	b.recordCPU(r, row, "redis", s0, s1, pc.stack != nil)
	runlog.Logf("  redis SET %.0f GET %.0f rps (%d each); pod %.2f cores, stack %.0f%% of them, throttled in %.0f%% of periods",
		res["set"][0], res["get"][0], b.limitRedisN(l), (s1.pod-s0.pod)/s1.at.Sub(s0.at).Seconds(),
		100*share(s1.stack-s0.stack, s1.pod-s0.pod), 100*share(s1.throttled-s0.throttled, s1.periods-s0.periods))
	return nil
}

func share(part, whole float64) float64 {
	if whole <= 0 {
		return 0
	}
	return part / whole
}
