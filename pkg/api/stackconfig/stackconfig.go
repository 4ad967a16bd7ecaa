// Package stackconfig is the pod stack's configuration: the file the
// plugin (or the agent, restarting a stack) writes and the stack process
// reads, with its defaults in one place. It is a leaf: the conflist's
// parser and the stack both import it, neither imports the other.
package stackconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
)

// Config is what a launcher hands the stack process (as a JSON file): where
// to find and keep things, and the knobs from the conflist and annotations.
// The network facts themselves live in the spec.
type Config struct {
	// Version is the format the file was written in (Version); absent in
	// files written before it was versioned, which read as version 1.
	// Read refuses a newer one.
	Version int `json:"version,omitempty"`
	// IfName is the pod interface to take over. Required.
	IfName string `json:"ifName"`
	// SpecPath is where the spec is kept: read if present (a restart),
	// otherwise collected from the kernel and written. Required.
	SpecPath string `json:"specPath"`
	// ControlSocket is the unix socket path for health and status. Required.
	ControlSocket string `json:"controlSocket"`
	// WireNetns is the pinned network namespace (pkg/node/wirens) that holds
	// the pod's link IfName: the stack opens its packet sockets there and
	// serves the pod's namespace, where it runs, with a TUN named IfName.
	// Empty: the link is in the pod's namespace beside a TUN named
	// TUNName, as attachments made by earlier releases have it; the
	// pod's processes can then reach the wire (docs/security.md).
	WireNetns string `json:"wireNetns,omitempty"`
	// TUNName names the TUN device that carries the pod IPs and routes in
	// the pod's kernel when WireNetns is empty. Zero: "usernet0". With a
	// WireNetns the TUN is the pod's interface and takes IfName.
	TUNName string `json:"tunName,omitempty"`
	// TUNMTU is the TUN's MTU. Zero: DefaultTUNMTU.
	TUNMTU uint32 `json:"tunMTU,omitempty"`
	// LegacyTUNOffload and LegacyAppQueueLen have no effect since the
	// applications' TCP and UDP stopped crossing the TUN (podkernel.Divert);
	// kept so that configurations written by earlier versions still load.
	LegacyTUNOffload  bool `json:"tunOffload,omitempty"`
	LegacyAppQueueLen int  `json:"appQueueLen,omitempty"`
	// GSO is the requested mode. Zero: auto.
	GSO offload.Mode `json:"gso,omitempty"`
	// GSOMaxSize and GSOMaxSegs, when set, lower the limits detected on the
	// link (never raise them).
	GSOMaxSize uint32 `json:"gsoMaxSize,omitempty"`
	GSOMaxSegs uint32 `json:"gsoMaxSegs,omitempty"`
	// GRO enables netstack GRO on the wire leg.
	GRO bool `json:"gro,omitempty"`
	// VerifyRXChecksums makes the wire leg verify the checksum of every
	// frame from the pod's link. Zero: trusted, as runsc does (both ends
	// of a veth are the same kernel, which may hand over partial
	// checksums).
	VerifyRXChecksums bool `json:"verifyRxChecksums,omitempty"`
	// LegacyNoRXChecksumOffload is VerifyRXChecksums as configurations
	// written before it were named; Validate folds it in.
	LegacyNoRXChecksumOffload bool `json:"noRxChecksumOffload,omitempty"`
	// WireQueueLen sizes the queue in front of the wire link
	// (Options.WireQueueLen). Zero: DefaultQueueLen; -1: none. GSO mode
	// off never queues the wire leg: it is defined as one packet per
	// system call, the baseline the other modes are measured against.
	WireQueueLen int `json:"wireQueueLen,omitempty"`
	// Threads is the stack process's GOMAXPROCS. Zero: DefaultThreads,
	// and up to AdaptiveMaxThreads while bulk traffic saturates them
	// (pkg/stack/threads).
	Threads int `json:"threads,omitempty"`
	// BusyPoll keeps the stack's thread polling for that long after
	// traffic instead of sleeping (pkg/stack/busypoll), up to MaxBusyPoll,
	// always, whatever the node's load: the conflist's window, which the
	// cluster's admin chose for every pod of the network. Zero: the
	// stack's governor polls for BusyPollGoverned, or DefaultBusyPoll,
	// while requests flow and the node has idle CPU (pkg/stack/governor),
	// where it also decides the thread count; BusyPollOff: never.
	BusyPoll Duration `json:"busyPoll,omitempty"`
	// BusyPollGoverned is the window of a pod that asked for one with its
	// annotation, up to MaxBusyPoll: the pod is not trusted to spend the
	// node's CPU, so its window is the governor's to switch by the same
	// rule as the default's, never always on. Its own key, not BusyPoll's:
	// a stack of an earlier release ignores it and governs
	// DefaultBusyPoll instead of polling always.
	BusyPollGoverned Duration `json:"busyPollGoverned,omitempty"`
	// BusyPollOff turns busy polling off. A stack of an earlier release
	// ignores it, and has busy polling off without it.
	BusyPollOff bool `json:"busyPollOff,omitempty"`
	// MaxTCP, MaxUDP and UDPIdle bound the relay (see relay.Options).
	MaxTCP  int      `json:"maxTCP,omitempty"`
	MaxUDP  int      `json:"maxUDP,omitempty"`
	UDPIdle Duration `json:"udpIdle,omitempty"`
	// PodLinkOffloadsOff turns TSO, GSO and scatter-gather off on the pod's
	// link before detection: a link without offload, for tests, benchmarks
	// and links known to misbehave.
	PodLinkOffloadsOff bool `json:"podLinkOffloadsOff,omitempty"`
	// Policy makes the stack enforce the pod's network policy
	// (docs/policy.md). False: everything is allowed and a pushed policy
	// is refused.
	Policy bool `json:"policy,omitempty"`
	// PolicyPath is the policy file the node agent keeps for the pod,
	// read at start (a restart comes back with the policy it had). When
	// Policy is on and the file is absent, the stack starts closed but to
	// the node (policy.Closed) until the agent's first push. Required
	// when Policy is on.
	PolicyPath string `json:"policyPath,omitempty"`
}

// Version is the configuration format this code writes and understands
// up to. Bump it when a field changes meaning, so that an older stack or
// agent refuses the file instead of misreading it.
const Version = 1

// ErrNewer marks a configuration written by a newer cni-usernet.
var ErrNewer = errors.New("written by a newer cni-usernet")

// Duration is a time.Duration written as a Go duration string ("30s").
type Duration time.Duration

// MarshalJSON writes "30s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads "30s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("duration %s is negative", s)
	}
	*d = Duration(v)
	return nil
}

// DefaultQueueLen is the default depth of the wire leg's FIFO queue. The
// queue raises one-stream TCP in hardware and software mode
// (docs/architecture.md, "Queues"); 1024 packets hold a 4 MiB window of
// full-size frames without drops.
const DefaultQueueLen = 1024

// DefaultThreads is the stack's GOMAXPROCS: one. With every reader of the
// stack on Go's netpoller, the goroutines a frame wakes (netstack's TCP
// processor, the relay, the wire queue) run one after the other on the
// thread that read it; a second P only adds an idle thread that the
// runtime wakes to spin for work at every hand-off, which costs the stack
// CPU under request/response and takes a core from the applications and
// the peer on a 2-CPU node (docs/architecture.md, "Threads").
const DefaultThreads = 1

// AdaptiveMaxThreads is the most threads a stack whose configuration
// leaves Threads at zero is given on a node of cpus CPUs, while bulk
// traffic over many connections saturates those it has (pkg/stack/governor
// explains and measures it): one per CPU, up to MaxAdaptiveThreads. The
// governor adds a thread only while each one it has is saturated, so a
// pod's CPU limit (its stack is charged to it) caps it too.
func AdaptiveMaxThreads(cpus int) int { return max(1, min(cpus, MaxAdaptiveThreads)) }

// MaxAdaptiveThreads caps AdaptiveMaxThreads on large nodes: beyond four,
// one pod's network would take more cores than the applications that use
// it, for gains the benchmark does not show (it runs on two CPUs:
// docs/architecture.md, "Threads").
const MaxAdaptiveThreads = 4

// BusyPollWindow is the busy poller's window, zero for none, and whether
// the governor switches it (governed: the default window, or a pod's,
// BusyPollGoverned), which it does where it decides the thread count:
// the entry point turns busy polling off (BusyPollOff) where it does not.
// Only BusyPoll, the conflist's, polls always.
func (c *Config) BusyPollWindow() (window time.Duration, governed bool) {
	switch {
	case c.BusyPoll > 0:
		return time.Duration(c.BusyPoll), false
	case c.BusyPollOff:
		return 0, false
	case c.BusyPollGoverned > 0:
		return time.Duration(c.BusyPollGoverned), true
	}
	return DefaultBusyPoll, true
}

// DefaultBusyPoll is the window the governor polls for: on this project's
// VMs a request/response round trip through a stack takes longer than 50
// µs of its idle, and 200 µs kept its thread awake between requests
// (docs/performance.md, "Busy polling").
const DefaultBusyPoll = 200 * time.Microsecond

// MaxBusyPoll bounds BusyPoll: a longer window is a core spent, not a
// wake-up saved.
const MaxBusyPoll = 10 * time.Millisecond

// DefaultTUNName is the app leg's device in the pod when the pod's link
// shares its namespace (Config.WireNetns empty).
const DefaultTUNName = "usernet0"

// DefaultTUNMTU is the TUN's MTU. The applications' TCP and UDP do not
// cross the TUN (podkernel.Divert), but the kernel derives the MSS an
// application's SYN announces from the route's MTU, and that SYN reaches
// the stack's listener over loopback: 65520, like pasta and slirp4netns,
// lets the loopback connection use large segments.
const DefaultTUNMTU = 65520

// Validate reports the first problem with c and fills in defaults.
func (c *Config) Validate() error {
	if c.IfName == "" || c.SpecPath == "" || c.ControlSocket == "" {
		return fmt.Errorf("stack config needs ifName, specPath and controlSocket")
	}
	switch {
	case c.WireNetns != "":
		c.TUNName = c.IfName
	case c.TUNName == "":
		c.TUNName = DefaultTUNName
	}
	if len(c.TUNName) > 15 {
		return fmt.Errorf("TUN name %q is longer than 15 bytes", c.TUNName)
	}
	if c.TUNName == c.IfName && c.WireNetns == "" {
		return fmt.Errorf("TUN name %q is the pod interface's name", c.TUNName)
	}
	if c.TUNMTU == 0 {
		c.TUNMTU = DefaultTUNMTU
	}
	if c.TUNMTU < 1280 || c.TUNMTU > 65535 {
		return fmt.Errorf("TUN MTU %d outside 1280..65535", c.TUNMTU)
	}
	if c.GSO == "" {
		c.GSO = offload.ModeAuto
	}
	if c.LegacyNoRXChecksumOffload {
		c.VerifyRXChecksums, c.LegacyNoRXChecksumOffload = true, false
	}
	switch {
	case c.WireQueueLen == 0:
		c.WireQueueLen = DefaultQueueLen
	case c.WireQueueLen == -1:
		c.WireQueueLen = 0
	case c.WireQueueLen < -1:
		return fmt.Errorf("queue length %d: want a positive length, 0 for the default or -1 for none", c.WireQueueLen)
	}
	if c.Threads < 0 {
		return fmt.Errorf("threads %d: want a positive count, 0 for the default", c.Threads)
	}
	for _, d := range []Duration{c.BusyPoll, c.BusyPollGoverned} {
		if d < 0 || time.Duration(d) > MaxBusyPoll {
			return fmt.Errorf("busy-poll window %s outside 0..%s", time.Duration(d), MaxBusyPoll)
		}
	}
	if c.BusyPoll > 0 && c.BusyPollGoverned > 0 {
		return fmt.Errorf("busy-poll window set both always (busyPoll %s) and governed (busyPollGoverned %s)", time.Duration(c.BusyPoll), time.Duration(c.BusyPollGoverned))
	}
	if c.Policy && c.PolicyPath == "" {
		return fmt.Errorf("stack config enforces network policy but names no policyPath")
	}
	if _, err := offload.ParseMode(string(c.GSO)); err != nil {
		return err
	}
	return nil
}

// Read loads and validates a config file.
func Read(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("parsing stack config %s: %w", path, err)
	}
	if c.Version > Version {
		return nil, fmt.Errorf("stack config %s has version %d, this cni-usernet understands up to %d: %w", path, c.Version, Version, ErrNewer)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("stack config %s: %w", path, err)
	}
	return &c, nil
}
