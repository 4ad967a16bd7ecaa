package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/cgroup"
	"github.com/cni-usernet/cni-usernet/hack/bench/loadgen"
	"github.com/cni-usernet/cni-usernet/hack/bench/procfs"
	"github.com/cni-usernet/cni-usernet/hack/bench/report"
	"github.com/cni-usernet/cni-usernet/hack/bench/rig"
	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
	"github.com/cni-usernet/cni-usernet/pkg/node/podcgroup"
)

// The sizing section (--sizing, on in full runs): what a stack adds to
// its pod's memory, for users sizing requests and limits. One more pod is
// attached with usernet-hardware's configuration and a pod UID, and the
// benchmark makes the cgroup kubelet would have made for that pod in a
// kubepods tree of its own (cgroup.Prefix+"sizing/kubepods", a tree one level
// down as kubelet's --cgroup-root makes it). The plugin then finds the
// pod's cgroup by the UID and puts the stack in it right after starting
// it, as on a node: the cgroup holds the stack alone, and is charged what
// the pod would be. A tree of our own, not the node's: a kubelet removes a
// pod cgroup it does not know, with its processes. The workloads' servers
// stay outside it.

const sizingRow = report.SizingRow

func (b *bench) sizing(ctx context.Context, live []*attachment) {
	i := slices.IndexFunc(live, func(a *attachment) bool { return a.Config == "usernet-hardware" })
	if i < 0 {
		b.skipped[sizingRow] = "needs configuration usernet-hardware"
		if why, ok := b.skipped["usernet-hardware"]; ok {
			b.skipped[sizingRow] = why
		}
		return
	}
	fs, err := b.cgroups()
	if err == nil && fs.V2 == "" && fs.Memory == "" {
		err = fmt.Errorf("no memory cgroup hierarchy (%s)", fs)
	}
	if err != nil {
		b.skipped[sizingRow] = err.Error()
		runlog.Logf("sizing: skipped: %v", err)
		return
	}
	runlog.Logf("sizing: a stack alone in its pod's cgroup (%s)", fs)
	if err := b.sizeStack(ctx, fs, live[i]); err != nil {
		b.fail(0, sizingRow, "setup", err)
	}
}

func (b *bench) sizeStack(ctx context.Context, fs *cgroup.FS, u *attachment) (err error) {
	top := cgroup.Prefix + sizingRow
	defer func() {
		for _, m := range fs.Mounts() {
			if rerr := cgroup.RemoveTree(m, filepath.Join(m, top)); rerr != nil && err == nil {
				err = rerr
			}
		}
	}()
	uid := fmt.Sprintf("%s%d", cgroup.Prefix, time.Now().UnixNano())
	var g *cgroup.Group
	rel := top
	for _, next := range []string{"kubepods", "besteffort", "pod" + uid, ""} {
		// The plugin checks that the pod's cgroup is in every hierarchy
		// it charges: cpu and cpuacct as well as memory.
		if g, err = fs.Create(rel, "cpu", "memory"); err != nil {
			return err
		}
		if next != "" {
			rel += "/" + next
		}
	}
	want := "/" + g.Rel // where the plugin puts the stack
	ctrl := "memory"
	if g.V2 {
		want, ctrl = want+"/"+podcgroup.StackLeaf, ""
	}

	a := &attachment{Config: sizingRow, NS: nsPrefix + "pod-" + sizingRow, ID: nsPrefix + sizingRow, ConfPath: u.ConfPath, cfg: u.cfg}
	if err := b.rig.AddNS(ctx, a.NS); err != nil {
		return err
	}
	b.mu.Lock()
	b.atts = append(b.atts, a) // from here on, cleanup runs DEL
	b.mu.Unlock()
	defer func() {
		if derr := b.detach(a); derr != nil && err == nil {
			err = derr
		}
	}()
	if _, err := b.cniAdd(ctx, a, "--id", a.ID, "--netns", "/run/netns/"+a.NS, "--pod-uid", uid); err != nil {
		return err
	}
	st, err := b.stackStatus(ctx, a)
	if err != nil {
		return err
	}
	a.StackPID = st.PID
	pl, err := cgroup.PlacementOf(a.StackPID)
	if err != nil {
		return err
	}
	if pl[ctrl] != want {
		return fmt.Errorf("the stack is in memory cgroup %q, not in its pod's, %q (see the plugin's log in logs/cni-usernet)", pl[ctrl], want)
	}
	runlog.Logf("  sizing pod %s ip %s, stack %d in %s", a.NS, a.IP, a.StackPID, g.Memory)

	measure := func(phase string) error {
		u, err := g.MemUsage()
		if err != nil {
			return err
		}
		rss, err := procfs.ReadRSS(a.StackPID)
		if err != nil {
			return err
		}
		b.recordSizing(phase, rss, u)
		return nil
	}
	sleep := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	if !sleep(5 * time.Second) {
		return ctx.Err()
	}
	if err := measure("idle"); err != nil {
		return err
	}
	srv, err := b.serve(ctx, 0, a, "sizing-iperf3", iperfPort, "iperf3", "-s", "-p", strconv.Itoa(iperfPort))
	if err != nil {
		return err
	}
	secs := strconv.Itoa(int(b.o.IperfTime.Seconds()))
	for _, dir := range []string{"n2p", "p2n"} {
		argv := []string{"iperf3", "-c", a.IP, "-p", strconv.Itoa(iperfPort), "-t", secs, "-J"}
		if dir == "p2n" {
			argv = append(argv, "-R")
		}
		err := b.peakDuring(dir, a.StackPID, g, func() error {
			out, err := rig.Output(ctx, b.o.IperfTime+time.Minute, nodeNS, argv...)
			if _, _, _, perr := loadgen.ParseIperf(out); perr != nil {
				return perr
			}
			return err
		})
		if err != nil {
			b.rig.Stop(srv)
			return fmt.Errorf("iperf3 %s: %w", dir, err)
		}
	}
	b.rig.Stop(srv)
	srv, err = b.serve(ctx, 0, a, "sizing-redis", redisPort, "redis-server", "--port", strconv.Itoa(redisPort),
		"--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", b.tmp)
	if err != nil {
		return err
	}
	err = b.peakDuring("redis", a.StackPID, g, func() error {
		out, err := rig.Output(ctx, 5*time.Minute, nodeNS, "redis-benchmark", "-h", a.IP, "-p", strconv.Itoa(redisPort),
			"-n", strconv.Itoa(b.o.RedisN), "-t", "set,get", "--csv")
		if err != nil {
			return err
		}
		_, err = loadgen.ParseRedis(out)
		return err
	})
	b.rig.Stop(srv)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	// The stack hands its free heap back after two quiet 15 s windows
	// (docs/performance.md); 50 s leaves one window's slack.
	t0 := time.Now()
	if !sleep(5 * time.Second) {
		return ctx.Err()
	}
	if err := measure("after"); err != nil {
		return err
	}
	if !sleep(50*time.Second - time.Since(t0)) {
		return ctx.Err()
	}
	return measure("settled")
}

func (b *bench) recordSizing(phase string, r procfs.RSS, u cgroup.MemUsage) {
	const mib = 1 << 20
	b.record(0, sizingRow, phase+"_rss", r.Total/mib)
	b.record(0, sizingRow, phase+"_rss_anon", r.Anon/mib)
	b.record(0, sizingRow, phase+"_rss_file", r.File/mib)
	b.record(0, sizingRow, phase+"_charge", u.Charge/mib)
	b.record(0, sizingRow, phase+"_anon", u.Anon/mib)
	b.record(0, sizingRow, phase+"_file", u.File/mib)
	b.record(0, sizingRow, phase+"_kernel", u.Kernel/mib)
	runlog.Logf("  %s: RSS %.1f MiB (anon %.1f, file %.1f), pod cgroup charged %.1f MiB (anon %.1f, file %.1f, kernel %.1f)",
		phase, r.Total/mib, r.Anon/mib, r.File/mib, u.Charge/mib, u.Anon/mib, u.File/mib, u.Kernel/mib)
}

// peakDuring runs load and records the stack's peak RSS and its cgroup's
// peak charge (each with its split at that moment), sampled every 100 ms.
func (b *bench) peakDuring(phase string, pid int, g *cgroup.Group, load func() error) error {
	var (
		mu      sync.Mutex
		peakRSS procfs.RSS
		peak    cgroup.MemUsage
		serr    error
	)
	sample := func() {
		r, err1 := procfs.ReadRSS(pid)
		u, err2 := g.MemUsage()
		mu.Lock()
		defer mu.Unlock()
		if err1 != nil || err2 != nil {
			if serr == nil {
				serr = fmt.Errorf("sampling the stack's memory: %v %v", err1, err2)
			}
			return
		}
		if r.Total > peakRSS.Total {
			peakRSS = r
		}
		if u.Charge > peak.Charge {
			peak = u
		}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			sample()
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	err := load()
	close(done)
	wg.Wait()
	sample()
	if err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	b.recordSizing(phase, peakRSS, peak)
	return nil
}
