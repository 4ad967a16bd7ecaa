// Package agent is the node agent, cni-usernet-agent, the
// DaemonSet's process: it installs the plugin and its configuration on the
// node, keeps every pod's stack running through pkg/agent/supervisor's supervisor,
// reconciles, routes between nodes (standalone mode), serves the metrics,
// and on uninstall drains before it restores the node.
package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/cni-usernet/cni-usernet/pkg/agent/metrics"
	"github.com/cni-usernet/cni-usernet/pkg/agent/noderoutes"
	"github.com/cni-usernet/cni-usernet/pkg/agent/policyctl"
	"github.com/cni-usernet/cni-usernet/pkg/agent/supervisor"
	"github.com/cni-usernet/cni-usernet/pkg/api/agentapi"
	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
	"github.com/cni-usernet/cni-usernet/pkg/util/buildinfo"
)

// agentFlags are the node agent's settings (the DaemonSet's arguments).
type agentFlags struct {
	nodeName           string
	install            bool
	cniBinDir          string
	cniConfDir         string
	hostPrefix         string
	mode               string
	subnets            string
	mtu                int
	gso                string
	kubeconfigOut      string
	apiServer          string
	uninstallOnDelete  bool
	daemonSet          string
	stateDir           string
	runDir             string
	cniPath            string
	cgroupRoot         string
	mountNS            string
	reconcile          time.Duration
	backoff            time.Duration
	stableAfter        time.Duration
	crashLoop          int
	probe              bool
	nodeRoutes         string
	nodeRoutesInterval time.Duration
	encapsulation      string
	vxlanPort          int
	vxlanVNI           int
	metricsAddress     string
	metricsInterval    time.Duration
	metricsAllowPods   bool
	pprofAddress       string
	portMap            bool
	bandwidth          bool
	networkPolicy      bool
	// clusterNetworkPolicy: watch ClusterNetworkPolicies too.
	clusterNetworkPolicy bool
	// The node's defaults for its pods' stacks, written into the
	// conflist: empty or zero leaves the key out (the plugin's default).
	stackCgroup    string
	busyPoll       string
	stackThreads   int
	socketRedirect string
	healthAddress  string
}

func parseAgentFlags(args []string) (*agentFlags, error) {
	f := &agentFlags{}
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (for its pod CIDR and Events)")
	fs.BoolVar(&f.install, "install", true, "install the plugin binary and the CNI configuration (false: supervise only)")
	fs.StringVar(&f.cniBinDir, "cni-bin-dir", "/host/opt/cni/bin", "the node's CNI binary directory, as the agent sees it")
	fs.StringVar(&f.cniConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "the node's CNI configuration directory, as the agent sees it")
	fs.StringVar(&f.hostPrefix, "host-prefix", "/host", "where the node's root is mounted in the agent: stripped from paths written into the configuration")
	fs.StringVar(&f.mode, "mode", "standalone", "standalone (own conflist, sorted first) or chain (insert into the node's first conflist)")
	fs.StringVar(&f.subnets, "subnet", "", "pod subnets for host-local, comma separated (default: the node's spec.podCIDRs)")
	fs.IntVar(&f.mtu, "mtu", 0, "MTU of the pods' links (standalone); 0: automatic, the smallest MTU of the links up, not loopback, that hold the node's InternalIP or carry its default routes, less VXLAN's 50 bytes (70 over IPv6) unless --encapsulation=never")
	fs.StringVar(&f.gso, "gso", "auto", "the pods' default GSO mode in the conflist: auto, hardware, software, off (a pod's annotation overrides it)")
	fs.StringVar(&f.kubeconfigOut, "kubeconfig-out", "", "write a kubeconfig for the plugin here (its token kept fresh); empty: none")
	fs.StringVar(&f.apiServer, "api-server", "", "API server URL written into the plugin's kubeconfig (default: the in-cluster service address)")
	fs.BoolVar(&f.uninstallOnDelete, "uninstall-on-delete", true, "when stopped because its DaemonSet was deleted, restore the node's CNI files")
	fs.StringVar(&f.daemonSet, "daemonset", "cni-usernet", "this agent's DaemonSet (in the pod's namespace), to tell deletion from a restart")
	fs.StringVar(&f.stateDir, "state-dir", netconf.DefaultStateDir, "attachment state directory")
	fs.StringVar(&f.runDir, "run-dir", netconf.DefaultRunDir, "runtime directory (the agent's ready file)")
	fs.StringVar(&f.cniPath, "cni-path", "", "where IPAM plugins are found when an attachment is reclaimed (default: --cni-bin-dir)")
	fs.StringVar(&f.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "the node's cgroup mount, as the agent sees it")
	fs.StringVar(&f.mountNS, "mount-ns", "/proc/1/ns/mnt", "mount namespace restarted stacks run in (the node's)")
	fs.DurationVar(&f.reconcile, "reconcile-interval", supervisor.DefaultReconcileInterval, "how often the node is reconciled with the state directory")
	fs.DurationVar(&f.backoff, "restart-backoff", supervisor.DefaultBackoff,
		fmt.Sprintf("delay before the second quick restart of a stack, doubling up to %ds", int(supervisor.DefaultMaxBackoff/time.Second)))
	fs.DurationVar(&f.stableAfter, "stable-after", supervisor.DefaultStableAfter, "how long a stack must run for its crashes to be forgotten")
	fs.IntVar(&f.crashLoop, "crash-loop-after", supervisor.DefaultCrashLoop, "consecutive quick exits after which a stack is reported unhealthy")
	fs.StringVar(&f.nodeRoutes, "node-routes", "auto", "route other nodes' pod CIDRs, directly via their InternalIP or through VXLAN (--encapsulation): auto (standalone mode, installing), true, false")
	fs.DurationVar(&f.nodeRoutesInterval, "node-routes-interval", 10*time.Second, "how often the node list is read for --node-routes")
	fs.StringVar(&f.encapsulation, "encapsulation", "auto", "how --node-routes reaches another node's pods: auto (direct when the node's InternalIP is on a subnet of this node, VXLAN otherwise), vxlan (always VXLAN), never (direct only: a node behind a router is a problem)")
	fs.IntVar(&f.vxlanPort, "vxlan-port", noderoutes.DefaultVXLANPort, "UDP port of the VXLAN between nodes (--encapsulation)")
	fs.IntVar(&f.vxlanVNI, "vxlan-vni", noderoutes.DefaultVXLANVNI, "VXLAN network identifier between nodes (--encapsulation); not flannel's 1, so that a chained flannel never shares it")
	fs.StringVar(&f.metricsAddress, "metrics-address", defaultMetricsAddress, "serve Prometheus metrics on this address at /metrics; empty: none")
	fs.DurationVar(&f.metricsInterval, "metrics-interval", metrics.DefaultInterval, "how often the agent collects its metrics (every stack's status among them); a scrape is served the last collection")
	fs.BoolVar(&f.metricsAllowPods, "metrics-allow-pod-network", false, "serve metrics to scrapes from the pod network (a Prometheus that runs as an ordinary pod); false: such connections are closed unanswered")
	fs.StringVar(&f.pprofAddress, "pprof-address", "", "serve Go's runtime profiles at /debug/pprof/ on this loopback address (e.g. 127.0.0.1:6060); empty: none")
	fs.BoolVar(&f.portMap, "port-map", true, "chain the portmap plugin after cni-usernet (pods' hostPort); in chain mode only when the node's conflist has none")
	fs.BoolVar(&f.bandwidth, "bandwidth", true, "chain the bandwidth plugin after cni-usernet (kubernetes.io/ingress-bandwidth, egress-bandwidth); in chain mode only when the node's conflist has none")
	fs.BoolVar(&f.clusterNetworkPolicy, "cluster-network-policy", true, "with --network-policy, enforce policy.networking.k8s.io ClusterNetworkPolicy (Admin and Baseline tiers) too; where its CRD is not installed the agent says so once and enforces NetworkPolicy alone (needs get/list/watch on clusternetworkpolicies)")
	fs.BoolVar(&f.networkPolicy, "network-policy", true, "enforce NetworkPolicy in each pod's stack: watch the API server, compile and push each local pod's policy, and mark the conflist so that ADD waits for it (false: the primary CNI enforces policy, e.g. Calico or Cilium)")
	fs.StringVar(&f.stackCgroup, "stack-cgroup", "", "where the node's pods' stacks are charged, the conflist's stackCgroup: pod (the pod's cgroup) or node (cni-usernet's cgroup under the kubepods tree); empty: the plugin's default, pod")
	fs.StringVar(&f.busyPoll, "busy-poll", "", `the node's default busy polling, the conflist's busyPoll: auto (the stack's governor), a window up to 10ms ("200us", polled always) or 0s (off); empty: the plugin's default, auto`)
	fs.IntVar(&f.stackThreads, "stack-threads", 0, "threads that run each pod stack's Go code, the conflist's stackThreads; 0: the plugin's default")
	fs.StringVar(&f.socketRedirect, "socket-redirect", "", "the node's socket redirect, the conflist's socketRedirect: on, both, direct or off; empty: off, and a pod's annotation may turn it on")
	fs.StringVar(&f.healthAddress, "health-address", defaultHealthAddress, "serve /healthz (the liveness probe's) on this address; empty: none")
	fs.BoolVar(&f.probe, "probe", false, "exit 0 when the running agent is ready (readiness probe), 1 otherwise")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if f.cniPath == "" {
		f.cniPath = f.cniBinDir
	}
	if f.mode != "standalone" && f.mode != "chain" {
		return nil, fmt.Errorf("--mode %q: want standalone or chain", f.mode)
	}
	if f.mtu != 0 && (f.mtu < podnet.MinMTU || f.mtu > podnet.MaxMTU) {
		// The plugin's bounds (pkg/api/netconf): a conflist outside them
		// fails every pod's ADD.
		return nil, fmt.Errorf("--mtu %d: want %d..%d, or 0 (automatic)", f.mtu, podnet.MinMTU, podnet.MaxMTU)
	}
	if _, err := offload.ParseMode(f.gso); err != nil {
		return nil, fmt.Errorf("--gso: %w", err)
	}
	if _, err := f.wantNodeRoutes(); err != nil {
		return nil, err
	}
	if f.metricsInterval <= 0 {
		return nil, fmt.Errorf("--metrics-interval %s: want a positive duration", f.metricsInterval)
	}
	if _, err := newPodNetwork(f.subnets); err != nil {
		return nil, err
	}
	if f.nodeRoutesInterval <= 0 {
		return nil, fmt.Errorf("--node-routes-interval %s: want a positive duration", f.nodeRoutesInterval)
	}
	if _, err := f.routeOptions(); err != nil {
		return nil, err
	}
	if err := f.validateStackDefaults(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *agentFlags) readyFile() string { return filepath.Join(f.runDir, "agent.ready") }

// claimFile names the agent that serves the node now: each agent writes
// its process there first thing, before it installs anything, so that an
// older agent still waiting to uninstall (drain) sees a newer one as soon
// as it starts, without asking the API server (whose answer needs the
// older agent's token, which a re-created ServiceAccount invalidated).
func (f *agentFlags) claimFile() string { return filepath.Join(f.runDir, "agent.pid") }

func (f *agentFlags) agentSocket() string { return agentapi.Path(f.runDir) }

// Run is the node agent with its command-line arguments: it installs the
// plugin, keeps every pod's stack running and the node reconciled, and
// writes the CNI configuration last, once all that works — until then the
// node stays NotReady, which is the truth.
func Run(args []string) error {
	f, err := parseAgentFlags(args)
	if err != nil {
		return err
	}
	if f.probe {
		return probeAgent(f.readyFile())
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("component", "agent")
	// What client-go logs on its own (the watches log their failures
	// themselves) goes out as the agent's JSON lines, not klog's text.
	klog.SetSlogLogger(log.With("component", "client-go"))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Remove(f.readyFile())
	if err := markReady(f.claimFile()); err != nil {
		log.Warn("cannot claim the node for this agent: an older agent waiting to uninstall will not see it", "path", f.claimFile(), "err", err)
	}

	var setup *nodeSetup
	if f.install {
		if setup, err = newNodeSetup(ctx, f, log); err != nil {
			return err
		}
	}
	mountNS, stackBinary := restartNamespace(f.mountNS, log)
	var api *apiClient
	if setup != nil {
		api = setup.api
	}
	sup := supervisor.New(supervisor.Config{
		Store:             state.Store{Dir: f.stateDir},
		CNIPath:           f.cniPath,
		MountNS:           mountNS,
		StackBinary:       stackBinary,
		Backoff:           f.backoff,
		StableAfter:       f.stableAfter,
		CrashLoop:         f.crashLoop,
		CgroupRoot:        f.cgroupRoot,
		ReconcileInterval: f.reconcile,
		Refused:           refusedEvent(api, f.nodeName, log),
		Log:               log,
	})
	var polMetrics *policyctl.Metrics
	if f.networkPolicy {
		polMetrics = policyctl.NewMetrics()
	}
	// The pod network, as far as the agent knows it: scrapes from there
	// are refused (--metrics-allow-pod-network).
	pods, _ := newPodNetwork(f.subnets) // checked with the flags
	if f.metricsAddress != "" {
		// Metrics are for watching the node, never a reason not to serve it.
		if err := serveMetrics(ctx, metricsServing{addr: f.metricsAddress, interval: f.metricsInterval, allowPods: f.metricsAllowPods,
			store: state.Store{Dir: f.stateDir}, stats: sup.Stats(), pol: polMetrics, pods: pods, log: log}); err != nil {
			log.Error("no metrics", "err", err)
		}
	}
	if f.healthAddress != "" {
		if err := serveHealth(f.healthAddress, health{stats: sup.Stats(), interval: f.reconcile, now: time.Now}, log); err != nil {
			return err
		}
	}
	if f.pprofAddress != "" {
		if err := servePprof(ctx, f.pprofAddress, log); err != nil {
			return err
		}
	}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		return err
	}
	// Before the configuration: with networkPolicy in it, every ADD asks
	// the agent's socket for the pod's policy.
	if f.networkPolicy {
		if err := startPolicy(ctx, f, setup, polMetrics, log); err != nil {
			stop()
			<-done
			return err
		}
	}
	if setup != nil {
		if err := setup.writeConfig(ctx); err != nil {
			stop()
			<-done
			return err
		}
		go setup.keep(ctx)
		if want, _ := f.wantNodeRoutes(); want && (setup.api != nil || f.nodeRoutes != "auto") {
			if setup.routes, err = newNodeRoutes(f, setup.api, setup.mtu, log); err != nil {
				log.Error("no routes to other nodes", "err", err)
			} else {
				setup.routes.onNodes = pods.setNodes
				go setup.routes.run(ctx)
			}
		}
	}
	if err := markReady(f.readyFile()); err != nil {
		log.Error("writing ready file", "err", err)
	}
	log.Info("agent ready", "version", buildinfo.Version, "node", f.nodeName, "stateDir", f.stateDir)
	err = <-done
	os.Remove(f.readyFile())
	if setup != nil {
		setup.shutdown(log)
	}
	log.Info("agent stopped; stacks keep running")
	return err
}

// markReady records this agent process as ready (or, in the claim file,
// as the node's agent). The probe checks the process too, so a file left
// by a killed agent does not count.
func markReady(path string) error {
	pid := os.Getpid()
	st, err := launch.StartTime(pid)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, []byte(fmt.Sprintf("%d %d\n", pid, st)), 0o600)
}

// releaseClaim removes the claim file at path if it is this process's: the
// uninstall leaves the node as it was before the install. A claim another
// agent has written since stays (a drain that met one does not uninstall).
func releaseClaim(path string) {
	p, err := agentIn(path)
	if err == nil && p.PID == os.Getpid() {
		os.Remove(path)
	}
}

func probeAgent(path string) error {
	p, err := agentIn(path)
	if err != nil {
		return fmt.Errorf("agent not ready: %w", err)
	}
	if !launch.Alive(p) {
		return fmt.Errorf("agent not ready: process %d is gone", p.PID)
	}
	return nil
}

// agentIn reads the process a ready or claim file names.
func agentIn(path string) (launch.Process, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return launch.Process{}, err
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return launch.Process{}, fmt.Errorf("malformed %s: %q", path, b)
	}
	pid, err1 := strconv.Atoi(fields[0])
	st, err2 := strconv.ParseUint(fields[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return launch.Process{}, fmt.Errorf("malformed %s: %w", path, err)
	}
	return launch.Process{PID: pid, StartTime: st}, nil
}

// newerAgent reports the live agent process, not this one, that claimed
// the node since this one did (claimFile); ok false if none.
func newerAgent(path string) (launch.Process, bool) {
	p, err := agentIn(path)
	if err != nil || p.PID == os.Getpid() || !launch.Alive(p) {
		return launch.Process{}, false
	}
	return p, true
}

// restartNamespace decides where restarted stacks run. The node's mount
// namespace when the agent can enter it (a privileged DaemonSet with
// hostPID): recorded paths then mean what they meant to the plugin. When
// /proc/1 is out of reach, the agent's own namespace, with the stack
// binary of its own image (the recorded one is a node path).
func restartNamespace(path string, log *slog.Logger) (mountNS, stackBinary string) {
	if path == "" {
		return "", ""
	}
	self, err1 := os.Stat("/proc/self/ns/mnt")
	target, err2 := os.Stat(path)
	if err1 == nil && err2 == nil {
		if os.SameFile(self, target) {
			return "", ""
		}
		return path, ""
	}
	// The image carries cni-usernet-stack beside the plugin's binary,
	// which is beside the agent's.
	exe, err := os.Executable()
	if err != nil {
		exe = ""
	} else if exe, err = attachment.StackBinary(filepath.Join(filepath.Dir(exe), "cni-usernet")); err != nil {
		exe = ""
	}
	log.Warn("cannot enter the node's mount namespace; restarted stacks run in the agent's, from its image's binary",
		"mountNS", path, "err", errors.Join(err1, err2), "binary", exe)
	return "", exe
}

// startPolicy starts the policy controller and the agent's socket. Outside
// a cluster (no service account) there is nothing to watch: policy stays
// off, and a conflist asking for it makes ADD try again later.
func startPolicy(ctx context.Context, f *agentFlags, setup *nodeSetup, m *policyctl.Metrics, log *slog.Logger) error {
	var api *apiClient
	if setup != nil && setup.api != nil {
		api = setup.api
	} else if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		var err error
		if api, err = inCluster(); err != nil {
			return fmt.Errorf("the policy watches: %w", err)
		}
	} else {
		log.Warn("not in a cluster: NetworkPolicy is not enforced (--network-policy needs the API server)")
		return nil
	}
	c, err := policyctl.New(policyctl.Options{
		Config:  api.rest,
		Event:   api.event,
		Store:   state.Store{Dir: f.stateDir},
		Node:    f.nodeName,
		Metrics: m,
		Log:     log.With("component", "policy"),

		ClusterNetworkPolicy: f.clusterNetworkPolicy,
	})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(f.runDir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", f.runDir, err)
	}
	if err := policyctl.ServeSocket(ctx, f.agentSocket(), c); err != nil {
		return err
	}
	go c.Run(ctx)
	log.Info("enforcing NetworkPolicy in the pods' stacks", "socket", f.agentSocket())
	// The conflist comes next: give the watches a moment to list, so that
	// the first ADDs do not fail for nothing. An API server that does not
	// answer in time only delays the pods (code 11), not the agent.
	if err := c.WaitSynced(ctx, policySyncWait); err != nil {
		log.Warn("writing the CNI configuration before the policy caches synced: ADD tries again later until they do", "err", err)
	}
	return nil
}

// policySyncWait bounds the wait for the policy caches before the conflist.
const policySyncWait = 30 * time.Second
