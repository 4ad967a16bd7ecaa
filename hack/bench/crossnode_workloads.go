package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/loadgen"
	"github.com/cni-usernet/cni-usernet/hack/bench/procfs"
	"github.com/cni-usernet/cni-usernet/hack/bench/rig"
	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

// The cross-node rows' workloads: the servers in the pod on node B, the
// load generators in the pod on node A, so that every byte crosses both
// pods' stacks, both nodes and the link (or router) between them.

// crossWorkloads runs every cross-node workload once, srv being the pod
// on node B.
func (b *bench) crossWorkloads(ctx context.Context, r int, srv *attachment) {
	if srv.cfg.usernet() {
		for _, a := range []*attachment{srv.client, srv} {
			if err := b.idleStack(ctx, r, a); err != nil { // refreshes the stack PID
				b.fail(r, srv.Config, "stack", err)
			}
		}
	}
	b.runEach(ctx, r, srv, []workload{
		{"iperf3", b.crossIperf},
		{"redis", b.crossRedis},
		{"tcp_rr", b.crossRR},
	})
}

// vxlanBytes records the bytes node A's VXLAN device has carried so far:
// the proof that the pods' traffic took the tunnel.
func (b *bench) vxlanBytes(ctx context.Context, r int, srv *attachment) {
	out, err := rig.Output(ctx, 5*time.Second, srv.client.Node, "ip", "-j", "-s", "link", "show", "type", "vxlan")
	if err != nil {
		b.fail(r, srv.Config, "vxlan counters", err)
		return
	}
	var links []struct {
		Name  string `json:"ifname"`
		Stats struct {
			RX struct {
				Bytes float64 `json:"bytes"`
			} `json:"rx"`
			TX struct {
				Bytes float64 `json:"bytes"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		b.fail(r, srv.Config, "vxlan counters", fmt.Errorf("want one VXLAN device on node A, got %q (%v)", out, err))
		return
	}
	gb := (links[0].Stats.RX.Bytes + links[0].Stats.TX.Bytes) / 1e9
	b.record(r, srv.Config, "vxlan_gb", gb)
	runlog.Logf("  %.1f GB through node A's %s so far", gb, links[0].Name)
}

// stacksCPU is the CPU time of both pods' stacks (0 for ptp pods).
func stacksCPU(srv *attachment) float64 {
	return procfs.ProcessCPU(srv.StackPID) + procfs.ProcessCPU(srv.client.StackPID)
}

func (b *bench) crossIperf(ctx context.Context, r int, srv *attachment) error {
	p, err := b.serve(ctx, r, srv, "iperf3", iperfPort, "iperf3", "-s", "-p", strconv.Itoa(iperfPort))
	if err != nil {
		return err
	}
	defer b.rig.Stop(p)
	stack := srv.cfg.usernet()
	secs := strconv.Itoa(int(b.o.IperfTime.Seconds()))
	for _, dir := range []string{"a2b", "b2a"} {
		argv := []string{"iperf3", "-c", srv.IP, "-p", strconv.Itoa(iperfPort), "-t", secs, "-J"}
		if dir == "b2a" {
			argv = append(argv, "-R")
		}
		sys0, stack0 := procfs.SystemCPU(), stacksCPU(srv)
		out, err := rig.Output(ctx, b.o.IperfTime+30*time.Second, srv.client.NS, argv...)
		sysS, stackS := procfs.SystemCPU()-sys0, stacksCPU(srv)-stack0
		gbps, retrans, bytes, perr := loadgen.ParseIperf(out)
		if perr != nil {
			return fmt.Errorf("%s: %w", dir, perr)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
		b.record(r, srv.Config, "tcp_"+dir+"_gbps", gbps)
		b.record(r, srv.Config, "tcp_"+dir+"_retrans", retrans)
		if gb := bytes / 1e9; gb > 0 {
			b.record(r, srv.Config, "cpu_gb_"+dir, sysS/gb)
			if stack {
				b.record(r, srv.Config, "stack_cpu_gb_"+dir, stackS/gb)
			}
		}
		runlog.Logf("  iperf3 %s %.2f Gbit/s, %.0f retransmits", dir, gbps, retrans)
	}
	return nil
}

func (b *bench) crossRedis(ctx context.Context, r int, srv *attachment) error {
	p, err := b.serve(ctx, r, srv, "redis", redisPort, "redis-server", "--port", strconv.Itoa(redisPort),
		"--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", b.tmp)
	if err != nil {
		return err
	}
	defer b.rig.Stop(p)
	sys0, stack0 := procfs.SystemCPU(), stacksCPU(srv)
	out, err := rig.Output(ctx, 5*time.Minute, srv.client.NS, "redis-benchmark", "-h", srv.IP, "-p", strconv.Itoa(redisPort),
		"-n", strconv.Itoa(b.o.RedisN), "-t", "set,get", "--csv")
	sysS, stackS := procfs.SystemCPU()-sys0, stacksCPU(srv)-stack0
	if err != nil {
		return err
	}
	res, err := loadgen.ParseRedis(out)
	if err != nil {
		return err
	}
	kreq := float64(2*b.o.RedisN) / 1000
	b.record(r, srv.Config, "cpu_redis", sysS*1000/kreq)
	if srv.cfg.usernet() {
		b.record(r, srv.Config, "stack_cpu_redis", stackS*1000/kreq)
	}
	for _, t := range []string{"set", "get"} {
		b.record(r, srv.Config, "redis_"+t+"_krps", res[t][0]/1000)
		b.record(r, srv.Config, "redis_"+t+"_p50_ms", res[t][1])
	}
	runlog.Logf("  redis SET %.0f GET %.0f rps", res["set"][0], res["get"][0])
	return nil
}

func (b *bench) crossRR(ctx context.Context, r int, srv *attachment) error {
	p, err := b.serve(ctx, r, srv, "rr", rrPort, b.self, "rr-server", "-listen", fmt.Sprintf(":%d", rrPort))
	if err != nil {
		return err
	}
	defer b.rig.Stop(p)
	sys0 := procfs.SystemCPU()
	out, err := rig.Output(ctx, b.o.RRTime+time.Minute, srv.client.NS, b.self, "rr-client",
		"-addr", net.JoinHostPort(srv.IP, strconv.Itoa(rrPort)), "-time", b.o.RRTime.String())
	sysS := procfs.SystemCPU() - sys0
	if err != nil {
		return err
	}
	var res loadgen.RRResult
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("parsing rr-client output %q: %w", out, err)
	}
	b.record(r, srv.Config, "rr_p50_us", res.P50US)
	b.record(r, srv.Config, "rr_p99_us", res.P99US)
	if res.N > 0 {
		b.record(r, srv.Config, "cpu_rr", sysS*1000/(float64(res.N+loadgen.RRWarmup)/1000))
	}
	runlog.Logf("  TCP_RR p50 %.1f µs, p99 %.1f µs (%d round trips)", res.P50US, res.P99US, res.N)
	return nil
}
