package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/cni-usernet/cni-usernet/hack/bench/cgroup"
	"github.com/cni-usernet/cni-usernet/hack/bench/procfs"
	"github.com/cni-usernet/cni-usernet/hack/bench/report"
	"github.com/cni-usernet/cni-usernet/hack/bench/rig"
	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
	"github.com/cni-usernet/cni-usernet/pkg/node/sockmap"
)

const (
	nodeNS   = "ub-node"
	nsPrefix = rig.NSPrefix // every namespace the benchmark creates
)

// attachment is one pod attached through CNI.
type attachment struct {
	Config   string `json:"config"`
	NS       string `json:"netns"`
	ID       string `json:"containerID"`
	ConfPath string `json:"-"`
	IP       string `json:"ip"`
	HostVeth string `json:"hostVeth"`
	StackPID int    `json:"stackPid,omitempty"`
	// Status is the stack's last `cni-usernet status` entry, kept raw.
	Status json.RawMessage `json:"status,omitempty"`
	cfg    *config
	// runscID is the runsc container serving this pod, apiSock
	// slirp4netns' API socket (peers.go).
	runscID, apiSock string
	tapDev           string // a tap peer's device in the pod namespace
	// Node is the namespace of the pod's node: a cross-node row's own,
	// empty for nodeNS.
	Node string `json:"node,omitempty"`
	// client is the pod the load generators run in when it is not the
	// node: a pod-to-pod row's pod A, on node A across nodes
	// (crossnode.go) or beside pod B on one node (samenode.go).
	client *attachment
	// Dial is the address the client dials when it is not IP: a Service
	// row's cluster IP, which the node translates to IP.
	Dial string `json:"dial,omitempty"`
}

// dialIP is the address a's client connects to.
func (a *attachment) dialIP() string {
	if a.Dial != "" {
		return a.Dial
	}
	return a.IP
}

// nodeNS is the namespace of a's node, where its CNI verbs run.
func (a *attachment) nodeNS() string {
	if a.Node != "" {
		return a.Node
	}
	return nodeNS
}

type bench struct {
	o       options
	self    string // this executable, re-executed for the helper roles
	tmp     string // IPAM data, libcni cache, plugin state, server files
	logs    string // server and plugin logs, kept with the results
	rig     *rig.Rig
	started time.Time

	mu         sync.Mutex // guards the fields below
	samples    []report.Sample
	failures   []report.Failure
	skipped    map[string]string // configuration → why it did not run
	atts       []*attachment
	scaleUp    string     // conflist of the scale section's pods while they are attached
	peerNodeUp bool       // peerVeth exists in the node namespace
	cgfs       *cgroup.FS // the hierarchies, once the limits or sizing section found them
	svcNodeUp  bool       // the Service rows' node namespace exists
	svcRows    int        // Service rows attached: each gets a cluster IP of its own
}

func newBench(o options) (*bench, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(o.Out, "logs"), 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "ub-bench-")
	if err != nil {
		return nil, err
	}
	return &bench{
		o: o, self: self, tmp: tmp, logs: filepath.Join(o.Out, "logs"), rig: rig.New(filepath.Join(o.Out, "logs")),
		skipped: map[string]string{},
	}, nil
}

// selected returns the configurations asked for, in run order: all of
// them (peers only with --peers, the pod-to-pod rows only with
// --crossnode and --pod2pod), or those named in --only.
func (b *bench) selected() []*config {
	var out []*config
	for _, c := range allConfigs {
		if c.Baseline && b.o.BaselineBin == "" {
			continue
		}
		if len(b.o.Only) == 0 && !c.ByName && (c.Peer == "" || b.o.Peers) && (c.CrossNode == "" || b.o.CrossNode) && (!c.SameNode || b.o.SameNode) || slices.Contains(b.o.Only, c.Name) {
			out = append(out, c)
		}
	}
	return out
}

func (b *bench) record(round int, cfg, metric string, v float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.samples = append(b.samples, report.Sample{Round: round, Config: cfg, Metric: metric, Value: v})
}

func (b *bench) fail(round int, cfg, workload string, err error) {
	runlog.Logf("  %s %s: FAILED: %v", cfg, workload, err)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures = append(b.failures, report.Failure{Round: round, Config: cfg, Workload: workload, Error: err.Error()})
}

// run sets the topology up and runs every round. It returns an error only
// when nothing could be measured at all; single cells record failures.
func (b *bench) run(ctx context.Context) error {
	b.started = time.Now()
	if err := b.setupNode(ctx); err != nil {
		return err
	}
	var live []*attachment
	for _, c := range b.selected() {
		if c.usernet() {
			if _, err := os.Stat(filepath.Join(b.o.BinDir, "cni-usernet")); err != nil {
				b.skipped[c.Name] = "cni-usernet not built (see build-cni-usernet.log)"
				runlog.Logf("%s: skipped: %s", c.Name, b.skipped[c.Name])
				continue
			}
		}
		if why := b.peerMissing(c); why != "" {
			b.skipped[c.Name] = why
			runlog.Logf("%s: skipped: %s", c.Name, why)
			continue
		}
		a, err := b.attach(ctx, c)
		if err != nil {
			b.fail(0, c.Name, "setup", err)
			continue
		}
		runlog.Logf("%s: pod %s ip %s host veth %s", c.Name, a.NS, a.IP, a.HostVeth)
		live = append(live, a)
	}
	for _, ac := range addConfigs {
		if !slices.ContainsFunc(live, func(a *attachment) bool { return a.Config == ac.Of }) {
			b.skipped[ac.Name] = fmt.Sprintf("needs configuration %s", ac.Of)
			if why, ok := b.skipped[ac.Of]; ok {
				b.skipped[ac.Name] = why
			}
		}
	}
	for r := 1; r <= b.o.Rounds; r++ {
		for _, a := range roundOrder(live, r) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			runlog.Logf("round %d/%d: %s", r, b.o.Rounds, a.Config)
			b.runWorkloads(ctx, r, a)
		}
		for _, ac := range addConfigs {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			for _, a := range live {
				if a.Config == ac.Of {
					runlog.Logf("round %d/%d: %s (%d pods, %d at a time)", r, b.o.Rounds, ac.Name, b.o.AddPods, b.o.AddParallel)
					if err := b.addLatency(ctx, r, ac.Name, a); err != nil {
						b.fail(r, ac.Name, "add", err)
					}
				}
			}
		}
	}
	if len(b.o.CPULimits) > 0 && ctx.Err() == nil {
		b.limits(ctx, live)
	}
	if b.o.Sizing && ctx.Err() == nil {
		b.sizing(ctx, live)
	}
	if b.o.Scale && ctx.Err() == nil {
		b.scale(ctx, live)
	}
	return ctx.Err()
}

// roundOrder is the order round r (from 1) visits the configurations in:
// as given in odd rounds, reversed in even ones. With one fixed order a
// configuration's place in the round can bias it: in one full run the
// row right after
// kernel-segs2 read lower on nginx in every round than the same build two
// rows later. Alternating gives every row the middle place
// on average, and a two-row A/B both orders.
func roundOrder[T any](rows []T, r int) []T {
	out := slices.Clone(rows)
	if r%2 == 0 {
		slices.Reverse(out)
	}
	return out
}

// setupNode creates the node namespace and the server files.
func (b *bench) setupNode(ctx context.Context) error {
	out, err := rig.Output(ctx, 10*time.Second, "", "ip", "netns", "list")
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], nsPrefix) {
			return fmt.Errorf("namespace %s already exists: another benchmark is running, or a killed one left it; "+
				"remove it with `ip netns pids %s | xargs -r kill; ip netns del %s`", f[0], f[0], f[0])
		}
	}
	if len(b.o.CPULimits) > 0 || b.o.Sizing {
		// No ub-* namespace, so no benchmark runs: a cgroup of ours is
		// a killed run's.
		if fs, err := b.cgroups(); err == nil {
			fs.Sweep()
		}
	}
	if err := b.rig.AddNS(ctx, nodeNS); err != nil {
		return err
	}
	www := filepath.Join(b.tmp, "www")
	if err := os.MkdirAll(www, 0o755); err != nil {
		return err
	}
	blob := make([]byte, 10<<20)
	for i := range blob {
		blob[i] = byte(i*7 + i>>13) // not all zero, not worth compressing anyway
	}
	return os.WriteFile(filepath.Join(www, "10m.bin"), blob, 0o644)
}

// cniArgs is the command line of the libcni helper, run in the node namespace.
func (b *bench) cniArgs(verb, conf string, extra ...string) []string {
	return b.cniArgsFrom(b.o.BinDir, verb, conf, extra...)
}

// cniArgsFor is cniArgs with the plugins of c: the baseline's for the
// baseline row.
func (b *bench) cniArgsFor(c *config, verb, conf string, extra ...string) []string {
	if c != nil && c.Baseline {
		return b.cniArgsFrom(b.o.BaselineBin, verb, conf, extra...)
	}
	return b.cniArgs(verb, conf, extra...)
}

func (b *bench) cniArgsFrom(bin, verb, conf string, extra ...string) []string {
	return append([]string{b.self, "cni", verb, "--bin", bin, "--cache", filepath.Join(b.tmp, "cnicache"), "--conf", conf}, extra...)
}

// attach creates the pod namespace of c, runs CNI ADD and shapes the link;
// a peer's pod is set up by peers.go.
func (b *bench) attach(ctx context.Context, c *config) (*attachment, error) {
	a := &attachment{Config: c.Name, NS: nsPrefix + "pod-" + c.Name, ID: "ub-" + c.Name, cfg: c}
	switch {
	case c.Peer == "pasta", c.Peer == "slirp4netns":
		return a, b.attachTap(ctx, a)
	case c.CrossNode != "":
		return b.attachCrossNode(ctx, c)
	case c.SameNode:
		return b.attachSameNode(ctx, c)
	}
	conf, err := c.conflist(filepath.Join(b.tmp, "ipam"), filepath.Join(b.tmp, "state"), filepath.Join(b.logs, "cni-usernet"), filepath.Join(b.tmp, "run"), b.o.IPv6)
	if err != nil {
		return nil, err
	}
	if err := b.register(ctx, a, conf, c.Name+".conflist"); err != nil {
		return nil, err
	}

	addArgs := []string{"--id", a.ID, "--netns", "/run/netns/" + a.NS}
	if c.PolicyRules > 0 {
		if err := b.standInAgent(c); err != nil {
			return nil, err
		}
		addArgs = append(addArgs, "--pod", "bench/"+a.ID)
	}
	res, err := b.cniAdd(ctx, a, addArgs...)
	if err != nil {
		return nil, err
	}

	for _, e := range []struct{ ns, dev string }{{nodeNS, a.HostVeth}, {a.NS, "eth0"}} {
		if c.NoOffload {
			if _, err := rig.Output(ctx, 10*time.Second, e.ns, "ethtool", "-K", e.dev, "tso", "off", "gso", "off", "sg", "off"); err != nil {
				return nil, err
			}
		}
		if c.GSOMaxSegs > 0 {
			if _, err := rig.Output(ctx, 10*time.Second, "", "ip", "-n", e.ns, "link", "set", "dev", e.dev, "gso_max_segs", strconv.Itoa(c.GSOMaxSegs)); err != nil {
				return nil, err
			}
		}
	}
	if c.Peer == "runsc" {
		return a, b.startRunsc(ctx, a)
	}
	if c.usernet() {
		st, err := b.stackStatus(ctx, a)
		if err != nil {
			return nil, err
		}
		a.StackPID, a.Status = st.PID, st.raw
		if err := checkGSO(c, st); err != nil {
			b.fail(0, c.Name, "gso-check", err) // measured anyway; the exit status says it
		}
		if c.PolicyRules > 0 {
			if err := b.pushPolicy(c, a, res); err != nil {
				return nil, fmt.Errorf("pushing the policy: %w", err)
			}
		}
	}
	return a, nil
}

// register writes pod a's conflist into the run's directory under name
// and makes its namespace; from then on the cleanup runs DEL for it.
func (b *bench) register(ctx context.Context, a *attachment, conf []byte, name string) error {
	a.ConfPath = filepath.Join(b.tmp, name)
	if err := os.WriteFile(a.ConfPath, conf, 0o644); err != nil {
		return err
	}
	if err := b.rig.AddNS(ctx, a.NS); err != nil {
		return err
	}
	b.mu.Lock()
	b.atts = append(b.atts, a)
	b.mu.Unlock()
	return nil
}

// cniAdd runs ADD for a and reads its address and host veth from the result.
func (b *bench) cniAdd(ctx context.Context, a *attachment, args ...string) (*current.Result, error) {
	out, err := rig.Output(ctx, 2*time.Minute, a.nodeNS(), b.cniArgsFor(a.cfg, "add", a.ConfPath, args...)...)
	if err != nil {
		return nil, err
	}
	var res current.Result
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("parsing the ADD result %q: %w", out, err)
	}
	for _, ip := range res.IPs {
		if ip.Address.IP.To4() != nil {
			a.IP = ip.Address.IP.String()
			break
		}
	}
	for _, i := range res.Interfaces {
		if i.Sandbox == "" {
			a.HostVeth = i.Name
		}
	}
	if a.IP == "" || a.HostVeth == "" {
		return nil, fmt.Errorf("the ADD result has no IPv4 address or no host-side interface: %s", out)
	}
	return &res, nil
}

// detach runs DEL for an attachment made after the rounds and removes its
// namespace, so that cleanup no longer holds it.
func (b *bench) detach(a *attachment) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := rig.Output(ctx, time.Minute, a.nodeNS(), b.cniArgsFor(a.cfg, "del", a.ConfPath, "--id", a.ID, "--netns", "/run/netns/"+a.NS)...)
	if err != nil {
		return fmt.Errorf("DEL %s: %w", a.ID, err)
	}
	b.rig.RemoveNS(ctx, a.NS)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.atts = slices.DeleteFunc(b.atts, func(x *attachment) bool { return x == a })
	return nil
}

// stackStatus is the part of `cni-usernet status --json` the benchmark reads.
type stackStatus struct {
	ContainerID string `json:"containerID"`
	PID         int    `json:"pid"`
	Healthy     bool   `json:"healthy"`
	GSO         struct {
		Mode    string `json:"mode"`
		MaxSize int    `json:"maxSize"`
		MaxSegs int    `json:"maxSegs"`
	} `json:"gso"`
	Stats struct {
		Wire struct {
			TxPackets uint64 `json:"txPackets"`
		} `json:"wire"`
	} `json:"stats"`
	raw json.RawMessage
}

// checkGSO says whether the stack took the segmentation asked for: the
// mode (auto resolves to software on a link without offloads, else to
// hardware) and the segment cap.
func checkGSO(c *config, st stackStatus) error {
	want := c.GSO
	if want == "auto" {
		want = "hardware"
		if c.NoOffload {
			want = "software"
		}
	}
	if st.GSO.Mode != want {
		return fmt.Errorf("stack reports gso mode %q, want %q", st.GSO.Mode, want)
	}
	if c.GSOMaxSegs > 0 && (st.GSO.MaxSegs <= 0 || st.GSO.MaxSegs > c.GSOMaxSegs) {
		return fmt.Errorf("stack reports gso maxSegs %d, want 1..%d", st.GSO.MaxSegs, c.GSOMaxSegs)
	}
	return nil
}

func (b *bench) stackStatus(ctx context.Context, a *attachment) (stackStatus, error) {
	out, err := rig.Output(ctx, 20*time.Second, a.nodeNS(), filepath.Join(b.o.BinDir, "cni-usernet"), "status", "--json", "--state-dir", b.stateDir(a))
	if err != nil {
		return stackStatus{}, err
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(out, &raws); err != nil {
		return stackStatus{}, fmt.Errorf("parsing cni-usernet status %q: %w", out, err)
	}
	for _, raw := range raws {
		var s stackStatus
		if err := json.Unmarshal(raw, &s); err != nil {
			return stackStatus{}, fmt.Errorf("parsing cni-usernet status entry %s: %w", raw, err)
		}
		if s.ContainerID == a.ID {
			s.raw = raw
			if !s.Healthy || s.PID <= 0 {
				return s, fmt.Errorf("stack of %s is not healthy (pid %d)", a.ID, s.PID)
			}
			return s, nil
		}
	}
	return stackStatus{}, fmt.Errorf("cni-usernet status does not list %s", a.ID)
}

// cleanup undoes everything: servers, attachments, namespaces, temp files.
func (b *bench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b.mu.Lock()
	atts, scaleConf := b.atts, b.scaleUp
	b.mu.Unlock()
	if scaleConf != "" {
		b.scaleDown(ctx, scaleConf)
	}
	for _, a := range atts {
		b.stopPeer(ctx, a)
	}
	b.rig.StopAll()
	for i := len(atts) - 1; i >= 0; i-- {
		a := atts[i]
		if a.ConfPath == "" { // a tap peer: no CNI attachment
			continue
		}
		if _, err := rig.Output(ctx, time.Minute, a.nodeNS(), b.cniArgsFor(a.cfg, "del", a.ConfPath, "--id", a.ID, "--netns", "/run/netns/"+a.NS)...); err != nil {
			runlog.Logf("cleanup: DEL %s: %v", a.ID, err)
		}
		if a.cfg.usernet() && a.StackPID > 0 && procfs.Running(a.StackPID) && strings.Contains(procfs.Cmdline(a.StackPID), "cni-usernet") {
			runlog.Logf("cleanup: stack %d of %s survived DEL; ending it", a.StackPID, a.ID)
			_ = syscall.Kill(a.StackPID, syscall.SIGKILL)
		}
	}
	b.rig.RemoveAllNS(ctx)
	if err := sockmap.Unload(benchBPFDir); err != nil {
		runlog.Logf("cleanup: unloading the socket redirect: %v", err)
	}
	if b.cgfs != nil {
		b.cgfs.Sweep()
	}
	// runsc bind-mounts an empty network namespace for its gofers at
	// <root>/null-netns and leaves it; unmount every stacked copy, as runsc
	// itself does before removing a root (specutils.UnmountNullNetNS).
	for syscall.Unmount(filepath.Join(b.runscRoot(), "null-netns"), syscall.MNT_DETACH) == nil {
	}
	// The plugin made the directory of its pins a mount point.
	for syscall.Unmount(filepath.Join(b.tmp, "run", "netns"), syscall.MNT_DETACH) == nil {
	}
	if err := os.RemoveAll(b.tmp); err != nil {
		runlog.Logf("cleanup: %v", err)
	}
}
