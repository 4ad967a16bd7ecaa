// Command bench measures what a pod loses or gains with cni-usernet against
// the plain kernel veth that the standard ptp plugin gives it.
//
// It builds a "node" network namespace and one "pod" namespace per
// configuration (all named ub-*), attaches the pods through the real CNI
// plugins with libcni, runs the workloads with the server in the pod and the
// load generator in the node, interleaving the configurations round by
// round, and writes table.md, samples.json and summary.json. The pod2pod-*
// rows measure pod to pod on one node instead, the client in a second pod
// (samenode.go; --only pod2pod runs them alone), the xnode-* rows pod to
// pod across two nodes of their own (crossnode.go; --only xnode). Nothing
// runs in or touches the root network namespace besides creating those
// namespaces.
//
// hack/bench/run.sh builds the plugins and this program and is the normal
// entry point. The program re-executes itself for a few helper roles:
//
//	bench cni ...        libcni ADD/DEL, run inside the node namespace
//	bench rr-server ...  1-byte ping-pong server (in the pod)
//	bench rr-client ...  1-byte ping-pong client (in the node)
//	bench probe ...      wait until a TCP port accepts (in the node)
//	bench noderoutes ... the agent's node routes and VXLAN, once (in a cross-node row's node)
//	bench report DIR     write DIR's table.md and summary.json again from its samples.json
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/loadgen"
	"github.com/cni-usernet/cni-usernet/hack/bench/rig"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "cni":
			os.Exit(cniMain(os.Args[2:]))
		case "rr-server":
			os.Exit(loadgen.RRServerMain(os.Args[2:]))
		case "rr-client":
			os.Exit(loadgen.RRClientMain(os.Args[2:]))
		case "probe":
			os.Exit(probeMain(os.Args[2:]))
		case "noderoutes":
			os.Exit(rig.NodeRoutesMain(os.Args[2:]))
		}
	}
	os.Exit(benchMain(os.Args[1:]))
}

// options are the knobs of one benchmark run. Zero values are filled in by
// parseOptions; --quick changes the defaults, explicit flags still win.
type options struct {
	Quick       bool
	Rounds      int
	Out         string   // results directory, created if missing
	BinDir      string   // ptp, host-local and (if built) cni-usernet
	BaselineBin string   // the same, cni-usernet from another revision; empty: no baseline row
	Only        []string // configuration names; empty means all
	IperfTime   time.Duration
	RRTime      time.Duration
	RedisN      int
	NginxN      int
	AddPods     int
	AddParallel int
	IPv6        bool // dual stack (ptp then waits for IPv6 DAD in ADD)
	// Peers adds runsc, pasta and slirp4netns rows (default on, off with
	// --quick); naming a peer in --only runs it regardless.
	Peers bool
	// CrossNode adds the pod-to-pod rows across two nodes (xnode-*,
	// crossnode.go; default on, off with --quick); naming one in --only,
	// or "xnode" for all of them, runs it regardless.
	CrossNode bool
	// SameNode adds the pod-to-pod rows on one node (pod2pod-*,
	// samenode.go; default on); naming one in --only, or "pod2pod" for
	// both, runs it regardless.
	SameNode bool
	// Scale runs the scale section after the rounds (default on, off
	// with --quick): ScalePods idle cni-usernet pods, then iperf3 with
	// each of Streams concurrent streams node→pod.
	Scale     bool
	ScalePods int
	Streams   []int
	// CPULimits runs the limits section after the rounds (default none,
	// never with --quick): bulk and redis with the pod's server and
	// stack in a cgroup with each limit's CFS quota (limits.go).
	CPULimits []cpuLimit
	// Sizing measures a stack's memory alone in a memory cgroup, idle and
	// under load (default on, off with --quick; sizing.go).
	Sizing bool
}

func parseOptions(args []string) (options, error) {
	var o options
	var only string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.BoolVar(&o.Quick, "quick", false, "one round, short durations (CI smoke); fails if any configuration produced no numbers")
	fs.IntVar(&o.Rounds, "rounds", 0, "interleaved rounds (default 3, 1 with --quick)")
	fs.StringVar(&o.Out, "out", "", "results directory (default results/<UTC timestamp>)")
	fs.StringVar(&o.BinDir, "bin", "", "directory with the CNI plugin binaries (required)")
	fs.StringVar(&o.BaselineBin, "baseline-bin", "", "directory with the plugins and a cni-usernet of another revision: adds the baseline-hardware and baseline-software rows (run.sh --baseline REV)")
	fs.StringVar(&only, "only", "", "comma-separated configuration names to run (default all; see -list); xnode: every pod-to-pod row across two nodes; pod2pod: every pod-to-pod row on one node")
	fs.BoolVar(&o.IPv6, "ipv6", true, "give pods an IPv6 address too (ptp's ADD then waits ~1-2 s for DAD)")
	list := fs.Bool("list", false, "list the configurations and exit")
	peers := fs.String("peers", "", "true/false: runsc, pasta and slirp4netns rows (default true, false with --quick)")
	crossNode := fs.String("crossnode", "", "true/false: the pod-to-pod rows across two nodes, xnode-* (default true, false with --quick)")
	sameNode := fs.String("pod2pod", "", "true/false: the pod-to-pod rows on one node, pod2pod-* (default true)")
	scale := fs.String("scale", "", "true/false: the scale section (default true, false with --quick)")
	fs.IntVar(&o.ScalePods, "scale-pods", 100, "idle cni-usernet pods in the scale section")
	streams := fs.String("streams", "1,16,256", "concurrent iperf3 streams node→pod in the scale section")
	cpuLimits := fs.String("cpu-limits", "", "comma-separated pod CPU limits (100m, 0.5, 2, max for none): kernel and usernet-hardware (and usernet-hardware-redirectboth when --only names it) with the pod's server and stack in a cgroup of that CFS quota, after the rounds (not with --quick)")
	sizing := fs.String("sizing", "", "true/false: a stack's memory alone in a memory cgroup, idle and under load (default true, false with --quick)")
	fs.DurationVar(&o.IperfTime, "iperf-time", 0, "iperf3 duration per direction (default 15s, 3s with --quick)")
	fs.DurationVar(&o.RRTime, "rr-time", 0, "TCP_RR duration (default 10s, 2s with --quick)")
	fs.IntVar(&o.RedisN, "redis-n", 0, "redis-benchmark -n (default 100000, 10000 with --quick)")
	fs.IntVar(&o.NginxN, "nginx-n", 0, "ab -n for the 10 MiB file (default 100, 20 with --quick)")
	fs.IntVar(&o.AddPods, "add-pods", 0, "pods in the ADD latency run (default 50, 20 with --quick)")
	fs.IntVar(&o.AddParallel, "add-parallel", 0, "concurrent ADDs (default 20, 10 with --quick)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if *list {
		for _, c := range allConfigs {
			fmt.Printf("%-24s %s\n", c.Name, c.Desc)
		}
		os.Exit(0)
	}
	pick := func(v *int, full, quick int) {
		if *v == 0 {
			*v = full
			if o.Quick {
				*v = quick
			}
		}
	}
	pickD := func(v *time.Duration, full, quick time.Duration) {
		if *v == 0 {
			*v = full
			if o.Quick {
				*v = quick
			}
		}
	}
	pick(&o.Rounds, 3, 1)
	pick(&o.RedisN, 100000, 10000)
	pick(&o.NginxN, 100, 20)
	pick(&o.AddPods, 50, 20)
	pick(&o.AddParallel, 20, 10)
	pickD(&o.IperfTime, 15*time.Second, 3*time.Second)
	pickD(&o.RRTime, 10*time.Second, 2*time.Second)
	if o.BinDir == "" {
		return o, fmt.Errorf("-bin is required (run hack/bench/run.sh)")
	}
	var err error
	if o.Peers, err = boolFlag("peers", *peers, !o.Quick); err != nil {
		return o, err
	}
	if o.CrossNode, err = boolFlag("crossnode", *crossNode, !o.Quick); err != nil {
		return o, err
	}
	if o.SameNode, err = boolFlag("pod2pod", *sameNode, true); err != nil {
		return o, err
	}
	if o.Scale, err = boolFlag("scale", *scale, !o.Quick); err != nil {
		return o, err
	}
	if o.Sizing, err = boolFlag("sizing", *sizing, !o.Quick); err != nil {
		return o, err
	}
	if o.CPULimits, err = parseCPULimits(*cpuLimits); err != nil {
		return o, err
	}
	if o.Quick && len(o.CPULimits) > 0 {
		// The CI smoke stays short and needs no cgroups; a short limits
		// run is --rounds 1 --iperf-time 3s --redis-n 10000.
		return o, fmt.Errorf("-cpu-limits is not part of --quick")
	}
	for _, f := range strings.Split(*streams, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1024 {
			return o, fmt.Errorf("-streams: %q is not a stream count 1..1024", f)
		}
		o.Streams = append(o.Streams, n)
	}
	if o.ScalePods < 20 || o.ScalePods > 200 {
		return o, fmt.Errorf("-scale-pods must be 20..200")
	}
	if o.Out == "" {
		o.Out = filepath.Join("results", time.Now().UTC().Format("20060102T150405Z"))
	}
	if only != "" {
		for _, n := range strings.Split(only, ",") {
			if n == crossNodeRows || n == sameNodeRows {
				for _, c := range allConfigs {
					// A row run only by its name (a variant for one
					// question) stays out of the group; the baseline
					// rows come with it and run when there is a baseline.
					if c.ByName && !c.Baseline {
						continue
					}
					if n == crossNodeRows && c.CrossNode != "" || n == sameNodeRows && c.SameNode {
						o.Only = append(o.Only, c.Name)
					}
				}
				continue
			}
			if configByName(n) == nil {
				return o, fmt.Errorf("unknown configuration %q (see -list)", n)
			}
			o.Only = append(o.Only, n)
		}
	}
	if o.Rounds < 1 || o.Rounds > 50 || o.AddPods < 1 || o.AddPods > 200 || o.AddParallel < 1 {
		return o, fmt.Errorf("rounds must be 1..50, add-pods 1..200, add-parallel ≥ 1")
	}
	return o, nil
}

// boolFlag parses an optional true/false flag; empty means def.
func boolFlag(name, v string, def bool) (bool, error) {
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("-%s: %q is not true or false", name, v)
	}
	return b, nil
}

func benchMain(args []string) int {
	if len(args) == 2 && args[0] == "report" {
		if err := rerender(args[1]); err != nil {
			fmt.Fprintln(os.Stderr, "bench report:", err)
			return 1
		}
		return 0
	}
	o, err := parseOptions(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench: must run as root (it creates network namespaces)")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }() // a second Ctrl-C kills us outright
	b, err := newBench(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	runErr := b.run(ctx)
	b.cleanup()
	if err := b.writeReport(); err != nil {
		fmt.Fprintln(os.Stderr, "bench: writing the report:", err)
		return 1
	}
	fmt.Printf("results in %s\n", o.Out)
	if runErr != nil {
		fmt.Fprintln(os.Stderr, "bench:", runErr)
		return 1
	}
	if problems := b.problems(); len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "bench: %d problem(s):\n  %s\n", len(problems), strings.Join(problems, "\n  "))
		return 1
	}
	return 0
}
