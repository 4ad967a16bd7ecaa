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

// The pod-to-pod rows' workloads, across nodes (xnode-*) and on one
// node (pod2pod-*): the servers in pod B, the load generators in pod A,
// so that every byte crosses both pods' stacks and the node or nodes
// between them (and across nodes the link or router).

// crossWorkloads runs every pod-to-pod workload once, srv being pod B.
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
	if srv.cfg.CrossNode == "vxlan" {
		b.vxlanBytes(ctx, r, srv)
	}
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

// cpuUse is the CPU time, in seconds, of what a pod-to-pod workload
// involves: read before it and after, then the difference.
type cpuUse struct {
	all    float64 // every CPU of the machine (/proc/stat)
	stacks float64 // both pods' stack processes; 0 for ptp pods
	server float64 // the server in pod B
	client float64 // the load generator in pod A, from its rusage when it exits
}

// cpuNow reads the machine's, the stacks' and the server's CPU time.
func cpuNow(srv *attachment, server *rig.Proc) cpuUse {
	u := cpuUse{all: procfs.SystemCPU(), stacks: stacksCPU(srv)}
	if server != nil {
		u.server = procfs.ProcessCPU(server.Pid())
	}
	return u
}

// since is u less u0, with the client's time the one it ran for.
func (u cpuUse) since(u0 cpuUse, client float64) cpuUse {
	return cpuUse{all: u.all - u0.all, stacks: u.stacks - u0.stacks, server: u.server - u0.server, client: client}
}

// recordPodCPU records u times per, the CPU per unit of work, under the
// metrics <who>_<what>: cpu_ for all CPUs, stack_cpu_ (a stack's row
// only), client_cpu_, server_cpu_, and other_cpu_: all CPUs less those
// processes, that is the kernel work no process was charged for (the
// node's forwarding, softirqs run outside the processes) and whatever
// else ran on the machine meanwhile.
func (b *bench) recordPodCPU(r int, srv *attachment, what string, u cpuUse, per float64) {
	b.record(r, srv.Config, "cpu_"+what, u.all*per)
	if srv.cfg.usernet() {
		b.record(r, srv.Config, "stack_cpu_"+what, u.stacks*per)
	}
	b.record(r, srv.Config, "client_cpu_"+what, u.client*per)
	b.record(r, srv.Config, "server_cpu_"+what, u.server*per)
	b.record(r, srv.Config, "other_cpu_"+what, (u.all-u.stacks-u.client-u.server)*per)
}

func (b *bench) crossIperf(ctx context.Context, r int, srv *attachment) error {
	p, err := b.serve(ctx, r, srv, "iperf3", iperfPort, "iperf3", "-s", "-p", strconv.Itoa(iperfPort))
	if err != nil {
		return err
	}
	defer b.rig.Stop(p)
	secs := strconv.Itoa(int(b.o.IperfTime.Seconds()))
	for _, dir := range []string{"a2b", "b2a"} {
		argv := []string{"iperf3", "-c", srv.dialIP(), "-p", strconv.Itoa(iperfPort), "-t", secs, "-J"}
		if dir == "b2a" {
			argv = append(argv, "-R")
		}
		u0 := cpuNow(srv, p)
		out, client, err := rig.OutputCPU(ctx, b.o.IperfTime+30*time.Second, srv.client.NS, argv...)
		u := cpuNow(srv, p).since(u0, client)
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
			b.recordPodCPU(r, srv, "gb_"+dir, u, 1/gb)
		}
		runlog.Logf("  iperf3 %s %.2f Gbit/s, %.0f retransmits", dir, gbps, retrans)
	}
	return nil
}

// crossRedis is the node→pod redis workload from pod A: the same
// redis-benchmark run, its CPU per 1,000 requests split by process.
func (b *bench) crossRedis(ctx context.Context, r int, srv *attachment) error {
	p, err := b.serve(ctx, r, srv, "redis", redisPort, "redis-server", "--port", strconv.Itoa(redisPort),
		"--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", b.tmp)
	if err != nil {
		return err
	}
	defer b.rig.Stop(p)
	u0 := cpuNow(srv, p)
	out, client, err := rig.OutputCPU(ctx, 5*time.Minute, srv.client.NS, "redis-benchmark", "-h", srv.dialIP(), "-p", strconv.Itoa(redisPort),
		"-n", strconv.Itoa(b.o.RedisN), "-t", "set,get", "--csv")
	u := cpuNow(srv, p).since(u0, client)
	if err != nil {
		return err
	}
	res, err := loadgen.ParseRedis(out)
	if err != nil {
		return err
	}
	// core·ms per 1000 requests, SET and GET together.
	kreq := float64(2*b.o.RedisN) / 1000
	b.recordPodCPU(r, srv, "redis", u, 1000/kreq)
	for _, t := range []string{"set", "get"} {
		b.record(r, srv.Config, "redis_"+t+"_krps", res[t][0]/1000)
		b.record(r, srv.Config, "redis_"+t+"_p50_ms", res[t][1])
	}
	runlog.Logf("  redis SET %.0f GET %.0f rps; per 1k requests %.1f core·ms (stacks %.1f, client %.1f, server %.1f)",
		res["set"][0], res["get"][0], u.all*1000/kreq, u.stacks*1000/kreq, u.client*1000/kreq, u.server*1000/kreq)
	return nil
}

func (b *bench) crossRR(ctx context.Context, r int, srv *attachment) error {
	p, err := b.serve(ctx, r, srv, "rr", rrPort, b.self, "rr-server", "-listen", fmt.Sprintf(":%d", rrPort))
	if err != nil {
		return err
	}
	defer b.rig.Stop(p)
	u0 := cpuNow(srv, p)
	out, client, err := rig.OutputCPU(ctx, b.o.RRTime+time.Minute, srv.client.NS, b.self, "rr-client",
		"-addr", net.JoinHostPort(srv.dialIP(), strconv.Itoa(rrPort)), "-time", b.o.RRTime.String())
	u := cpuNow(srv, p).since(u0, client)
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
		// core·ms per 1000 round trips, the client's warm-up included.
		b.recordPodCPU(r, srv, "rr", u, 1000/(float64(res.N+loadgen.RRWarmup)/1000))
	}
	runlog.Logf("  TCP_RR p50 %.1f µs, p99 %.1f µs (%d round trips)", res.P50US, res.P99US, res.N)
	return nil
}
