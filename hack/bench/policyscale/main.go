// Command policyscale measures the node agent's NetworkPolicy controller
// at cluster scale, black-box: it runs the real agent process of each
// build against a fake API server holding a synthetic cluster, with 100
// local pods whose stacks are fake control sockets, and measures the
// agent's CPU, memory and pushes through the initial sync and through
// single events (a pod's label change, a pod added, an EndpointSlice
// change no local pod's rules reach, a policy added).
//
// hack/bench/policyscale/run.sh builds the builds (this tree and a
// baseline revision) and is the normal entry point (make bench-policy).
// Needs root: it runs in its own network and mount namespaces.
package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
)

// clusters are the sizes the benchmark knows, by name.
var clusters = map[string]clusterSpec{
	// 10k pods / 2k Services / 1k policies, 100 namespaces.
	"10k": {Pods: 10000, Services: 2000, Policies: 1000, Namespaces: 100, Endpoints: 5, Local: 100},
	// 100k pods / 10k Services / 50k endpoints / 5k policies, 500
	// namespaces.
	"100k": {Pods: 100000, Services: 10000, Policies: 5000, Namespaces: 500, Endpoints: 5, Local: 100},
	// A small one for trying the harness.
	"1k": {Pods: 1000, Services: 200, Policies: 100, Namespaces: 10, Endpoints: 5, Local: 100},
}

// build is one agent build under test.
type build struct {
	name string // baseline or current
	rev  string // the revision it was built from, for the report
	bin  string // the directory holding its binaries
}

type options struct {
	builds   []build
	clusters []string
	reps     int
	out      string
	quiet    time.Duration
	// clusterPolicies is ClusterNetworkPolicies added to every cluster.
	clusterPolicies int
	timeout         time.Duration
	keep            bool
}

func parseOptions(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("policyscale", flag.ContinueOnError)
	baseBin := fs.String("baseline-bin", "", "directory with the baseline build's cni-usernet (or cni-usernet-agent)")
	baseRev := fs.String("baseline-rev", "", "the baseline's revision, for the report")
	curBin := fs.String("current-bin", "", "directory with this tree's build")
	curRev := fs.String("current-rev", "", "this tree's revision, for the report")
	cl := fs.String("clusters", "10k,100k", "cluster sizes to run, of: 1k, 10k, 100k")
	fs.IntVar(&o.reps, "reps", 5, "injections of each event kind")
	fs.IntVar(&o.clusterPolicies, "cluster-policies", 0, "ClusterNetworkPolicies (Admin and Baseline in turn) added to each cluster, and the cluster-policy-added event; 0: none, and their CRD absent")
	fs.StringVar(&o.out, "out", "", "results directory (policy-scale.md, policy-scale.txt, logs/)")
	fs.DurationVar(&o.quiet, "quiet", time.Second, "time without a push (and with the agent's CPU idle) after which an event has settled")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "longest wait for one event to settle (the initial sync: 5 times as long)")
	fs.BoolVar(&o.keep, "keep", false, "keep the state and run directories")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *baseBin != "" {
		o.builds = append(o.builds, build{"baseline", *baseRev, *baseBin})
	}
	if *curBin != "" {
		o.builds = append(o.builds, build{"current", *curRev, *curBin})
	}
	if len(o.builds) == 0 {
		return nil, fmt.Errorf("no build: give --baseline-bin, --current-bin or both")
	}
	for _, c := range strings.Split(*cl, ",") {
		if _, ok := clusters[c]; !ok {
			return nil, fmt.Errorf("--clusters: unknown size %q", c)
		}
		o.clusters = append(o.clusters, c)
	}
	if o.out == "" || o.reps < 1 {
		return nil, fmt.Errorf("--out is required and --reps must be positive")
	}
	return o, nil
}

func main() {
	if code, ok := reexecInSandbox(); ok {
		os.Exit(code)
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "policyscale:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	o, err := parseOptions(args)
	if err != nil {
		return err
	}
	if err := setupSandbox(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(filepath.Join(o.out, "logs"), 0o755); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	tmp, err := os.MkdirTemp("", "policyscale.")
	if err != nil {
		return err
	}
	if !o.keep {
		defer os.RemoveAll(tmp)
	}
	tok := make([]byte, 16)
	rand.Read(tok)
	token := hex.EncodeToString(tok)
	cert, caPEM, err := fakeapi.SelfSigned()
	if err != nil {
		return err
	}
	sa := filepath.Join(tmp, "serviceaccount")
	if err := os.MkdirAll(sa, 0o755); err != nil {
		return err
	}
	for name, b := range map[string][]byte{"token": []byte(token), "ca.crt": caPEM, "namespace": []byte("kube-system")} {
		if err := os.WriteFile(filepath.Join(sa, name), b, 0o644); err != nil {
			return err
		}
	}
	if err := mountServiceAccount(sa); err != nil {
		return err
	}
	rep := &report{started: time.Now()}
	for _, cname := range o.clusters {
		for _, b := range o.builds {
			log.Info("running", "cluster", cname, "build", b.name, "rev", b.rev)
			res, err := runOne(ctx, o, cname, b, token, cert, filepath.Join(tmp, cname+"-"+b.name), log)
			if err != nil {
				return fmt.Errorf("cluster %s, build %s: %w", cname, b.name, err)
			}
			rep.runs = append(rep.runs, res)
			// Written after each run: a long run stopped part-way keeps
			// what it measured.
			if err := rep.write(o.out); err != nil {
				return err
			}
		}
	}
	rep.finished = time.Now()
	return rep.write(o.out)
}

// runResult is one build against one cluster.
type runResult struct {
	cluster   string
	spec      clusterSpec
	build     build
	command   string
	took      time.Duration // the whole run: sync, events, stop
	sync      window
	syncCPUMS float64 // utime+stime over the sync, idle included
	rssMiB    float64 // VmRSS after the sync settled
	heapMiB   float64 // live heap after the sync, after a collection; 0: not served
	hwmMiB    float64 // VmHWM at the end
	endRSSMiB float64 // VmRSS at the end
	idleMSs   float64 // idle CPU, ms per second (threads' run time)
	events    []eventResult
	requests  string // the fake API server's request counts
	unknown   string // requests it did not know
	evPosted  int
}

func runOne(ctx context.Context, o *options, cname string, b build, token string, cert tls.Certificate, dir string, log *slog.Logger) (*runResult, error) {
	start := time.Now()
	spec := clusters[cname]
	spec.ClusterPolicies = o.clusterPolicies
	res := &runResult{cluster: cname, spec: spec, build: b}
	stateDir, runDir := filepath.Join(dir, "state"), filepath.Join(dir, "run")
	for _, d := range []string{stateDir, runDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	cmd, err := agentCommand(b.bin)
	if err != nil {
		return nil, err
	}
	res.command = strings.TrimSpace(filepath.Base(cmd[0]) + " " + strings.Join(cmd[1:], " "))
	c, err := newCluster(spec)
	if err != nil {
		return nil, err
	}
	api, err := fakeapi.New(fakeapi.Options{Kinds: servedKinds(spec.ClusterPolicies > 0), Token: token, Cert: &cert, Log: log})
	if err != nil {
		return nil, err
	}
	st := api.Store
	if err := loadCluster(st, c); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := api.Start(); err != nil {
		return nil, err
	}
	defer api.Close()
	addr := strings.TrimPrefix(api.URL(), "https://")
	stacks := &fakeStacks{}
	var locals []localAttachment
	for i, j := range c.local {
		p := c.Pods[j]
		locals = append(locals, localAttachment{containerID: fmt.Sprintf("%064x", i+1), ns: p.Metadata.Namespace, name: p.Metadata.Name, ip: p.Status.PodIP})
	}
	if err := stacks.start(rctx, stateDir, runDir, locals); err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(addr)
	agent, err := startAgent(agentOptions{cmd: cmd, stateDir: stateDir, runDir: filepath.Join(runDir, "agent"),
		apiHost: host, apiPort: port, logPath: filepath.Join(o.out, "logs", fmt.Sprintf("agent-%s-%s.log", cname, b.name))})
	if err != nil {
		return nil, err
	}
	defer agent.stop()
	m := &meter{agent: agent, stacks: stacks, quiet: o.quiet}
	s0 := cpuSample{at: agent.started}
	w, err := m.settle(ctx, s0, 0, spec.Local, 5*o.timeout)
	if err != nil {
		return nil, fmt.Errorf("initial sync: %w", err)
	}
	if !w.settled || w.pushes.pods < spec.Local {
		return nil, fmt.Errorf("initial sync: %d of %d pods pushed after %s (see the agent's log)", w.pushes.pods, spec.Local, w.span.Round(time.Second))
	}
	res.sync = w
	res.syncCPUMS = float64(w.ticks) * float64(clockTick) / float64(time.Millisecond)
	time.Sleep(time.Second)
	if res.rssMiB, _, err = agent.memory(); err != nil {
		return nil, err
	}
	if res.heapMiB, err = agent.heapProfile(filepath.Join(o.out, "logs", fmt.Sprintf("heap-%s-%s.pb.gz", cname, b.name))); err != nil {
		return nil, err
	}
	if err := m.measureIdle(ctx, 3*time.Second); err != nil {
		return nil, err
	}
	res.idleMSs = m.idleNS / 1e6
	log.Info("synced", "cluster", cname, "build", b.name, "took", w.took.Round(time.Millisecond), "pushes", w.pushes.pushes, "rssMiB", int(res.rssMiB))
	for _, kind := range eventKinds {
		if kind == evClusterPolicy && spec.ClusterPolicies == 0 {
			continue
		}
		er, err := m.runEvent(ctx, c, st, kind, o.reps, o.timeout)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", kind, err)
		}
		log.Info("event", "cluster", cname, "build", b.name, "event", kind, "cpuMS", fmt.Sprintf("%.1f", er.cpuMS),
			"schedMS", fmt.Sprintf("%.1f", er.schedMS), "touched", er.touched, "maxPush", er.maxPush)
		res.events = append(res.events, er)
	}
	res.endRSSMiB, res.hwmMiB, _ = agent.memory()
	// The profile at the end, beside the one after the sync: the events'
	// allocations are the difference (go tool pprof -diff_base).
	if _, err := agent.heapProfile(filepath.Join(o.out, "logs", fmt.Sprintf("heap-%s-%s-end.pb.gz", cname, b.name))); err != nil {
		return nil, err
	}
	reqs, unknown := api.Counts()
	res.requests, res.unknown, res.evPosted = sortedCounts(reqs), sortedCounts(unknown), len(api.Events())
	res.took = time.Since(start)
	return res, nil
}

// servedKinds are the collections the cluster fills: any other (a
// DaemonSet the agent looks for, the ClusterNetworkPolicies of a cluster
// without them) is answered 404, and shows in the report as an unknown
// request.
func servedKinds(clusterPolicies bool) []fakeapi.Kind {
	kinds := slices.DeleteFunc(slices.Clone(fakeapi.Kinds), func(k fakeapi.Kind) bool { return k.Resource == "daemonsets" })
	if clusterPolicies {
		kinds = append(kinds, cnpKind)
	}
	return kinds
}

// loadCluster puts the cluster's objects in the store.
func loadCluster(st *fakeapi.Store, c *cluster) error {
	for _, l := range []struct {
		res  string
		objs []any
	}{
		{"nodes", objs(c.Nodes)}, {"namespaces", objs(c.NSes)}, {"pods", objs(c.Pods)},
		{"services", objs(c.Svcs)}, {"endpointslices", objs(c.Slices)}, {"networkpolicies", objs(c.Pols)},
		{"clusternetworkpolicies", objs(c.CNPs)},
	} {
		if len(l.objs) == 0 {
			continue // a kind the server may not serve
		}
		if err := st.Load(l.res, l.objs...); err != nil {
			return err
		}
	}
	return nil
}

func objs[T object](in []T) []any {
	out := make([]any, len(in))
	for i, o := range in {
		out[i] = o
	}
	return out
}

// sortedCounts renders counters as "k=n" in key order, for the report.
func sortedCounts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
