package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/loadgen"
	"github.com/cni-usernet/cni-usernet/hack/bench/procfs"
	"github.com/cni-usernet/cni-usernet/hack/bench/rig"
	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

// Ports of the servers in the pod.
const (
	iperfPort = 5201
	redisPort = 6379
	nginxPort = 8080
	rrPort    = 7777
)

// runWorkloads runs every workload once against pod a. A workload that fails
// records a failure for its cell and the next one runs.
func (b *bench) runWorkloads(ctx context.Context, r int, a *attachment) {
	if a.client != nil {
		b.crossWorkloads(ctx, r, a)
		return
	}
	if a.cfg.stack() {
		if err := b.idleStack(ctx, r, a); err != nil {
			b.fail(r, a.Config, "stack", err)
		}
	}
	b.runEach(ctx, r, a, []workload{
		{"iperf3", b.iperf},
		{"redis", b.redis},
		{"nginx", b.nginx},
		{"tcp_rr", b.tcpRR},
	})
	if a.tapDev != "" {
		b.tapBytes(ctx, r, a)
	}
}

// workload is one measurement against a pod.
type workload struct {
	name string
	run  func(context.Context, int, *attachment) error
}

// runEach runs the workloads in turn against pod a; a failure records a
// failure for its cell and the next one runs.
func (b *bench) runEach(ctx context.Context, r int, a *attachment, ws []workload) {
	for _, w := range ws {
		if ctx.Err() != nil {
			return
		}
		err := w.run(ctx, r, a)
		if err != nil && strings.Contains(err.Error(), "the server has terminated") && ctx.Err() == nil {
			// The server got a signal ("iperf3: interrupt - the server has
			// terminated" in its log) from outside the benchmark: seen on
			// a machine shared with other test suites. Once more, and the
			// first failure stays in the record.
			b.fail(r, a.Config, w.name+" (retried)", err)
			err = w.run(ctx, r, a)
		}
		if err != nil {
			b.fail(r, a.Config, w.name, err)
		}
	}
}

// tapBytes records the bytes that crossed a tap peer's device so far: the
// proof that the workloads took the tap path, not a loopback bypass.
func (b *bench) tapBytes(ctx context.Context, r int, a *attachment) {
	var total float64
	for _, f := range []string{"rx_bytes", "tx_bytes"} {
		out, err := rig.Output(ctx, 5*time.Second, a.NS, "cat", "/sys/class/net/"+a.tapDev+"/statistics/"+f)
		if err != nil {
			b.fail(r, a.Config, "tap counters", err)
			return
		}
		v, _ := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
		total += v
	}
	b.record(r, a.Config, "tap_gb", total/1e9)
	runlog.Logf("  %.1f GB through %s's tap so far", total/1e9, a.cfg.Peer)
}

// serve starts a server in the pod and waits until it listens. A runsc pod's
// servers run in its sandbox for the whole benchmark: nil, nothing to start.
func (b *bench) serve(ctx context.Context, r int, a *attachment, name string, port int, argv ...string) (*rig.Proc, error) {
	if a.runscID != "" {
		return nil, nil
	}
	p, err := b.rig.Start(a.NS, fmt.Sprintf("r%d-%s-%s", r, a.Config, name), argv...)
	if err != nil {
		return nil, err
	}
	if err := rig.WaitListen(ctx, p, a.NS, port); err != nil {
		b.rig.Stop(p)
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return p, nil
}

// idleStack refreshes the stack PID (it may have been restarted) and records
// its resident memory while no workload runs.
func (b *bench) idleStack(ctx context.Context, r int, a *attachment) error {
	if a.cfg.usernet() {
		st, err := b.stackStatus(ctx, a)
		if err != nil {
			return err
		}
		a.Status = st.raw
		if st.PID != a.StackPID {
			runlog.Logf("  %s: stack pid %d (was %d)", a.Config, st.PID, a.StackPID)
			a.StackPID = st.PID
		}
	}
	rss, err := procfs.VMRSS(a.StackPID)
	if err != nil {
		return err
	}
	b.record(r, a.Config, "rss_mib", rss)
	runlog.Logf("  idle stack RSS %.1f MiB", rss)
	return nil
}

// iperf runs one stream each way. "n2p" is the node sending to the pod,
// "p2n" (-R) the pod sending, where the pod's stack segments.
func (b *bench) iperf(ctx context.Context, r int, a *attachment) error {
	srv, err := b.serve(ctx, r, a, "iperf3", iperfPort, "iperf3", "-s", "-p", strconv.Itoa(iperfPort))
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
		sys0, stack0 := procfs.SystemCPU(), procfs.ProcessCPU(a.StackPID)
		t0 := time.Now()
		out, err := rig.Output(ctx, b.o.IperfTime+30*time.Second, nodeNS, argv...)
		wall := time.Since(t0).Seconds()
		sysCores, stackCores := (procfs.SystemCPU()-sys0)/wall, (procfs.ProcessCPU(a.StackPID)-stack0)/wall
		gbps, retrans, bytes, perr := loadgen.ParseIperf(out)
		if perr != nil { // iperf3 -J reports its own errors in the JSON
			return fmt.Errorf("%s: %w", dir, perr)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
		b.record(r, a.Config, "tcp_"+dir+"_gbps", gbps)
		b.record(r, a.Config, "tcp_"+dir+"_retrans", retrans)
		if gb := bytes / 1e9; gb > 0 {
			b.record(r, a.Config, "cpu_gb_"+dir, sysCores*wall/gb)
			if a.StackPID > 0 {
				b.record(r, a.Config, "stack_cpu_gb_"+dir, stackCores*wall/gb)
			}
		}
		if gbps > 0 {
			b.record(r, a.Config, "cpu_"+dir, sysCores/gbps)
			if a.StackPID > 0 {
				b.record(r, a.Config, "stack_cpu_"+dir, stackCores/gbps)
			}
		}
		runlog.Logf("  iperf3 %s %.2f Gbit/s, %.0f retransmits, %.2f cores busy (stack: %.2f)", dir, gbps, retrans, sysCores, stackCores)
	}
	return nil
}

func (b *bench) redis(ctx context.Context, r int, a *attachment) error {
	srv, err := b.serve(ctx, r, a, "redis", redisPort, "redis-server", "--port", strconv.Itoa(redisPort),
		"--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no", "--dir", b.tmp)
	if err != nil {
		return err
	}
	defer b.rig.Stop(srv)
	sys0, stack0 := procfs.SystemCPU(), procfs.ProcessCPU(a.StackPID)
	out, err := rig.Output(ctx, 5*time.Minute, nodeNS, "redis-benchmark", "-h", a.IP, "-p", strconv.Itoa(redisPort),
		"-n", strconv.Itoa(b.o.RedisN), "-t", "set,get", "--csv")
	sysS, stackS := procfs.SystemCPU()-sys0, procfs.ProcessCPU(a.StackPID)-stack0
	if err != nil {
		return err
	}
	res, err := loadgen.ParseRedis(out)
	if err != nil {
		return err
	}
	// core·ms per 1000 requests (SET and GET together); the run includes
	// redis-benchmark's own start, which is small beside 2×RedisN requests.
	kreq := float64(2*b.o.RedisN) / 1000
	b.record(r, a.Config, "cpu_redis", sysS*1000/kreq)
	if a.StackPID > 0 {
		b.record(r, a.Config, "stack_cpu_redis", stackS*1000/kreq)
	}
	for _, t := range []string{"set", "get"} {
		b.record(r, a.Config, "redis_"+t+"_krps", res[t][0]/1000)
		b.record(r, a.Config, "redis_"+t+"_p50_ms", res[t][1])
	}
	runlog.Logf("  redis SET %.0f GET %.0f rps, p50 %.3f / %.3f ms", res["set"][0], res["get"][0], res["set"][1], res["get"][1])
	return nil
}

const nginxConf = `daemon off;
master_process on;
worker_processes auto;
user root;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 256; }
http {
    access_log off;
    sendfile on;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    default_type application/octet-stream;
    server {
        listen %[2]d;
        root %[3]s;
    }
}
`

// writeNginxConf writes the nginx configuration of pod a; nginx keeps its
// pid, logs and temp files in dir.
func (b *bench) writeNginxConf(a *attachment) (dir, conf string, err error) {
	dir = filepath.Join(b.tmp, "nginx-"+a.Config)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	conf = filepath.Join(dir, "nginx.conf")
	return dir, conf, os.WriteFile(conf, fmt.Appendf(nil, nginxConf, dir, nginxPort, filepath.Join(b.tmp, "www")), 0o644)
}

func (b *bench) nginx(ctx context.Context, r int, a *attachment) error {
	var dir, conf string
	if a.runscID == "" {
		var err error
		if dir, conf, err = b.writeNginxConf(a); err != nil {
			return err
		}
	}
	srv, err := b.serve(ctx, r, a, "nginx", nginxPort, "nginx", "-e", filepath.Join(dir, "error.log"), "-p", dir, "-c", conf)
	if err != nil {
		return err
	}
	defer b.rig.Stop(srv)
	// -t first: it implies -n 50000, which the -n after it overrides; the
	// time limit only bounds a pathologically slow configuration.
	limit := 300
	if b.o.Quick {
		limit = 60
	}
	out, err := rig.Output(ctx, time.Duration(limit+60)*time.Second, nodeNS, "ab", "-q", "-t", strconv.Itoa(limit),
		"-n", strconv.Itoa(b.o.NginxN), "-c", "5", "-s", "30", fmt.Sprintf("http://%s:%d/10m.bin", a.IP, nginxPort))
	if err != nil {
		return err
	}
	res, err := loadgen.ParseAB(out)
	if err != nil {
		return err
	}
	if res.Failed > 0 || res.Complete == 0 {
		return fmt.Errorf("ab: %v of %v requests failed", res.Failed, res.Complete)
	}
	if res.Length != 10<<20 {
		return fmt.Errorf("ab: document length %v, want %d", res.Length, 10<<20)
	}
	b.record(r, a.Config, "nginx_rps", res.RPS)
	b.record(r, a.Config, "nginx_mbs", res.KBps*1024/1e6)
	runlog.Logf("  nginx 10 MiB: %.1f req/s, %.0f MB/s (%v requests)", res.RPS, res.KBps*1024/1e6, res.Complete)
	return nil
}

func (b *bench) tcpRR(ctx context.Context, r int, a *attachment) error {
	srv, err := b.serve(ctx, r, a, "rr", rrPort, b.self, "rr-server", "-listen", fmt.Sprintf(":%d", rrPort))
	if err != nil {
		return err
	}
	defer b.rig.Stop(srv)
	// The frames the stack sends to the wire per round trip: one (the
	// answer, carrying the request's ACK) when nothing but the round
	// trips moves; a count, so the same on a loaded machine as a quiet one.
	// Only cni-usernet's stack reports it: a peer's stack process is
	// measured for CPU and wake-ups alone.
	counted := a.StackPID > 0 && a.cfg.usernet()
	var frames0 uint64
	if counted {
		st, err := b.stackStatus(ctx, a)
		if err != nil {
			return err
		}
		frames0 = st.Stats.Wire.TxPackets
	}
	sys0, stack0, wake0 := procfs.SystemCPU(), procfs.ProcessCPU(a.StackPID), procfs.ProcessWakeups(a.StackPID)
	out, err := rig.Output(ctx, b.o.RRTime+time.Minute, nodeNS, b.self, "rr-client",
		"-addr", net.JoinHostPort(a.IP, strconv.Itoa(rrPort)), "-time", b.o.RRTime.String())
	sysS, stackS, wakes := procfs.SystemCPU()-sys0, procfs.ProcessCPU(a.StackPID)-stack0, procfs.ProcessWakeups(a.StackPID)-wake0
	if err != nil {
		return err
	}
	frames := -1.0
	if counted {
		st, err := b.stackStatus(ctx, a)
		if err != nil {
			return err
		}
		frames = float64(st.Stats.Wire.TxPackets - frames0)
	}
	var res loadgen.RRResult
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("parsing rr-client output %q: %w", out, err)
	}
	b.record(r, a.Config, "rr_p50_us", res.P50US)
	b.record(r, a.Config, "rr_p99_us", res.P99US)
	// core·ms per 1000 round trips, the client's warm-up included.
	if krt := float64(res.N+loadgen.RRWarmup) / 1000; res.N > 0 {
		b.record(r, a.Config, "cpu_rr", sysS*1000/krt)
		if a.StackPID > 0 {
			b.record(r, a.Config, "stack_cpu_rr", stackS*1000/krt)
			// (the connection's handshake and close: a few frames in
			// thousands of round trips)
			if counted {
				b.record(r, a.Config, "stack_frames_rr", frames/(krt*1000))
			}
			b.record(r, a.Config, "stack_wakeups_rr", float64(wakes)/(krt*1000))
		}
	}
	runlog.Logf("  TCP_RR p50 %.1f µs, p99 %.1f µs (%d round trips)", res.P50US, res.P99US, res.N)
	return nil
}

// addLatency attaches and detaches AddPods pods with the configuration of a.
func (b *bench) addLatency(ctx context.Context, r int, name string, a *attachment) error {
	const prefix = nsPrefix + "add-"
	var made []string
	defer func() {
		for _, ns := range made {
			b.rig.RemoveNS(context.Background(), ns)
		}
	}()
	for i := range b.o.AddPods {
		ns := fmt.Sprintf("%s%d", prefix, i)
		if err := b.rig.AddNS(ctx, ns); err != nil {
			return err
		}
		made = append(made, ns)
	}
	out, err := rig.Output(ctx, 10*time.Minute, nodeNS, b.cniArgs("addbench", a.ConfPath, "--netns-prefix", "/run/netns/"+prefix,
		"--n", strconv.Itoa(b.o.AddPods), "--parallel", strconv.Itoa(b.o.AddParallel))...)
	if err != nil {
		return err
	}
	var res addBenchResult
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("parsing addbench output %q: %w", out, err)
	}
	for _, ms := range res.AddMS {
		b.record(r, name, "add_ms", ms)
	}
	if len(res.Errors) > 0 {
		return fmt.Errorf("%d of %d ADD/DEL failed, first: %s", len(res.Errors), 2*b.o.AddPods, res.Errors[0])
	}
	b.record(r, name, "add_p50_ms", quantile(res.AddMS, 0.50))
	b.record(r, name, "add_p99_ms", quantile(res.AddMS, 0.99))
	b.record(r, name, "del_p50_ms", quantile(res.DelMS, 0.50))
	runlog.Logf("  ADD p50 %.1f ms, p99 %.1f ms; DEL p50 %.1f ms", quantile(res.AddMS, 0.5), quantile(res.AddMS, 0.99), quantile(res.DelMS, 0.5))
	return nil
}

// quantile returns the q-quantile (nearest rank) of vs, or 0 if empty.
func quantile(vs []float64, q float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1)+0.5)]
}
