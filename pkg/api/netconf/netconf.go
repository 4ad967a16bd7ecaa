// Package netconf parses and validates cni-usernet's network configuration
// (the plugin's entry in a conflist) and its pod annotations.
package netconf

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// Defaults for the paths a conflist may leave out.
const (
	DefaultStateDir     = "/var/lib/cni-usernet"
	DefaultLogDir       = "/var/log/cni-usernet"
	DefaultRunDir       = "/run/cni-usernet"
	DefaultNetnsDir     = "/var/run/netns"
	DefaultMountNS      = "/proc/1/ns/mnt"
	DefaultReadyTimeout = 10 * time.Second
)

// The values of StackCgroup.
const (
	StackCgroupPod  = "pod"
	StackCgroupNode = "node"
)

// AnnotationPrefix is the prefix of every pod annotation cni-usernet reads.
const AnnotationPrefix = "cni-usernet.io/"

// AnnotationGSO chooses the pod's GSO mode: auto, hardware, software, off.
const AnnotationGSO = AnnotationPrefix + "gso"

// AnnotationBusyPoll sets the pod stack's busy-poll window ("200us"; "0s":
// off), overriding the conflist's busyPoll: a latency-sensitive pod can
// have it without every pod of the node spending the CPU.
const AnnotationBusyPoll = AnnotationPrefix + "busy-poll"

// AnnotationSocketRedirect sets the pod's socket redirect: "off", "on",
// "both" or "direct", under the conflist's socketRedirect ("off" there
// wins).
const AnnotationSocketRedirect = AnnotationPrefix + "socket-redirect"

// The socketRedirect values, and the annotation's: what the applications
// send to the stack is redirected (on), and what the stack sends them
// too (both: the pod's applications never read with splice); with
// direct, as both, and a connection with another direct pod of the node
// goes from application socket to application socket, past both stacks;
// or nothing (off).
const (
	SocketRedirectOn     = "on"
	SocketRedirectBoth   = "both"
	SocketRedirectDirect = "direct"
	SocketRedirectOff    = "off"
)

// socketRedirectValues lists the values, for errors.
var socketRedirectValues = strings.Join([]string{SocketRedirectOn, SocketRedirectBoth, SocketRedirectDirect, SocketRedirectOff}, ", ")

// DefaultBPFDir is where the node's BPF programs are pinned.
const DefaultBPFDir = "/sys/fs/bpf/cni-usernet"

// BusyPollAuto is the busyPoll value, and the annotation's, that leaves
// busy polling to the stack's governor: the default.
const BusyPollAuto = "auto"

// PodAnnotationsCapability is the runtime-config key under which containerd
// and CRI-O pass the pod's annotations when the conflist declares it.
const PodAnnotationsCapability = "io.kubernetes.cri.pod-annotations"

// NetConf is the plugin's configuration.
type NetConf struct {
	types.PluginConf

	// MTU of the pod's link. Zero: 1500.
	MTU int `json:"mtu,omitempty"`
	// GSO is the default GSO mode, overridden per pod by AnnotationGSO.
	// Zero: auto.
	GSO string `json:"gso,omitempty"`
	// GSOMaxSize and GSOMaxSegs lower the limits detected on the link.
	GSOMaxSize uint32 `json:"gsoMaxSize,omitempty"`
	GSOMaxSegs uint32 `json:"gsoMaxSegs,omitempty"`
	// GRO: nil or true merges the wire leg's consecutive segments of a
	// flow before netstack's TCP sees them (netstack GRO); false turns it
	// off. On by default since it costs nothing measurable where the node
	// sends large frames and lifts node→pod where it does not.
	GRO *bool `json:"gro,omitempty"`
	// RXChecksumOffload: nil or true trusts the checksums of frames from
	// the pod's veth (the host kernel); false verifies them all.
	RXChecksumOffload *bool `json:"rxChecksumOffload,omitempty"`
	// TUNName and TUNMTU configure the applications' device.
	TUNName string `json:"tunName,omitempty"`
	// TUNOffload is accepted and ignored: the applications' TCP and UDP no
	// longer cross the TUN (conflists written for earlier versions load).
	TUNOffload *bool  `json:"tunOffload,omitempty"`
	TUNMTU     uint32 `json:"tunMTU,omitempty"`
	// WireQueueLen: packets queued in front of the pod's link, drained by
	// a goroutine of its own. Zero: 1024; -1: none. AppQueueLen is
	// accepted and ignored (see TUNOffload).
	WireQueueLen int `json:"wireQueueLen,omitempty"`
	AppQueueLen  int `json:"appQueueLen,omitempty"`
	// StackThreads is how many threads run the pod stack's Go code at
	// once (its GOMAXPROCS). Zero: stackconfig.DefaultThreads, and a
	// second while bulk traffic saturates it (pkg/stack/governor).
	StackThreads int `json:"stackThreads,omitempty"`
	// BusyPoll keeps each pod stack's thread polling for that long after
	// traffic ("50us"), so that a request arriving within it does not have
	// to wake it: lower request latency for the CPU it spins. Absent or
	// "auto": the stack's governor turns it on while requests flow and
	// the node has idle CPU (pkg/stack/governor); "0s": off.
	BusyPoll string `json:"busyPoll,omitempty"`
	// SocketRedirect: "on" hands what a pod's applications send to its
	// stack over loopback from socket to socket in the kernel instead of
	// through TCP (pkg/node/sockmap), where the kernel can; "both" what
	// the stack sends them too; "direct" as "both", and a connection
	// between two direct pods of the node goes from one application's
	// socket to the other's, past both stacks; "off": loopback TCP on
	// this node, whatever a pod asks. Absent: off, and the annotation AnnotationSocketRedirect
	// chooses per pod.
	SocketRedirect string `json:"socketRedirect,omitempty"`
	// BPFDir is where the node's BPF programs and maps are pinned (a
	// bpffs directory). Zero: DefaultBPFDir.
	BPFDir string `json:"bpfDir,omitempty"`
	// MaxTCP, MaxUDP and UDPIdle bound the relay.
	MaxTCP  int    `json:"maxTCP,omitempty"`
	MaxUDP  int    `json:"maxUDP,omitempty"`
	UDPIdle string `json:"udpIdle,omitempty"`
	// PodLinkOffloadsOff turns TSO/GSO/SG off on the pod's link (tests,
	// benchmarks, links known to misbehave).
	PodLinkOffloadsOff bool `json:"podLinkOffloadsOff,omitempty"`
	// NetworkPolicy makes each pod's stack enforce the pod's
	// NetworkPolicy, as the node agent compiles and pushes it
	// (docs/policy.md); until the agent's first push the pod is closed
	// but to the node. False: the stack allows everything (the primary
	// CNI enforces policy, or none does).
	NetworkPolicy bool `json:"networkPolicy,omitempty"`
	// StateDir, LogDir and RunDir hold attachment state, stack logs and
	// control sockets.
	StateDir string `json:"stateDir,omitempty"`
	LogDir   string `json:"logDir,omitempty"`
	RunDir   string `json:"runDir,omitempty"`
	// NetnsDir is where each stack's own network namespace, which holds
	// the pod's link, is pinned (pkg/node/wirens): beside the runtime's pods'
	// namespaces, where the node agent's DaemonSet mounts them, so that a
	// restart in the agent finds them. Zero: DefaultNetnsDir.
	NetnsDir string `json:"netnsDir,omitempty"`
	// MountNS is the node's mount namespace, where the plugin does its
	// work when its caller runs it in another one (a meta-plugin in a
	// container, such as Multus thick, or `ip netns exec`): a wire
	// namespace pinned there is seen by every later CHECK, DEL and stack
	// restart, where a pin made in a private mount namespace would be
	// seen by none. Zero: DefaultMountNS; one that cannot be opened
	// leaves the plugin in its caller's.
	MountNS string `json:"mountNS,omitempty"`
	// ReadyTimeout bounds the wait for the stack to come up. Zero: 10s.
	ReadyTimeout string `json:"readyTimeout,omitempty"`
	// Kubeconfig, when set, lets the plugin read a pod's annotations from
	// the API server (when the runtime does not pass them) and post the
	// GSO decision as an Event on the pod. The node agent writes it.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// NodeName names the node in Events. Zero: the host name.
	NodeName string `json:"nodeName,omitempty"`
	// StackCgroup says where a pod's stack is charged (docs/accounting.md):
	// StackCgroupPod, the pod's own cgroup, so that network work counts
	// against the pod's limits; StackCgroupNode, one node-level cgroup of
	// cni-usernet's under the kubepods tree. Zero: StackCgroupPod.
	StackCgroup string `json:"stackCgroup,omitempty"`

	RuntimeConfig struct {
		PodAnnotations map[string]string `json:"io.kubernetes.cri.pod-annotations,omitempty"`
		CgroupPath     string            `json:"cgroupPath,omitempty"`
		// Bandwidth is the pod's bandwidth annotations, passed to a
		// plugin that declares the "bandwidth" capability: cni-usernet
		// shapes its pods itself (pkg/node/shaping).
		Bandwidth *Limits `json:"bandwidth,omitempty"`
	} `json:"runtimeConfig,omitzero"`

	// Filled by Parse.
	udpIdle      time.Duration
	readyTimeout time.Duration
	busyPoll     time.Duration
	busyPollAuto bool
}

// Parse decodes and validates a configuration from stdin bytes. Every
// error names the key, the value it got and what the key accepts.
func Parse(data []byte) (*NetConf, error) {
	var c NetConf
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("parsing network configuration: %w", decodeError(data, err))
	}
	if err := c.validate(data); err != nil {
		return nil, fmt.Errorf("network configuration: %w", err)
	}
	if err := version.ParsePrevResult(&c.PluginConf); err != nil {
		return nil, fmt.Errorf("parsing prevResult: %w", err)
	}
	if err := c.validateIPv6MTU(data); err != nil {
		return nil, fmt.Errorf("network configuration: %w", err)
	}
	return &c, nil
}

// GROEnabled is GRO resolved: on unless the conflist says false.
func (c *NetConf) GROEnabled() bool { return c.GRO == nil || *c.GRO }

// UDPIdleDuration is UDPIdle parsed (zero: the relay's default).
func (c *NetConf) UDPIdleDuration() time.Duration { return c.udpIdle }

// BusyPollWindow resolves the pod's busy polling: the annotation, else
// the conflist's busyPoll. governed: the stack's governor switches it,
// for its default window (window zero: "auto") or for the annotation's:
// the annotation is the pod's, and a pod must not make its stack spin on
// a node whose CPU others need, so its window is held to the governor's
// rule. Otherwise window is the conflist's, polled always (the admin's
// choice), or zero for off.
func (c *NetConf) BusyPollWindow() (window time.Duration, governed bool, err error) {
	if v, ok := c.RuntimeConfig.PodAnnotations[AnnotationBusyPoll]; ok {
		d, auto, ok := parseBusyPoll(v)
		if !ok {
			return 0, false, fmt.Errorf("pod annotation %q: got %q, want %s", AnnotationBusyPoll, v, accepted["busyPoll"])
		}
		return d, auto || d > 0, nil
	}
	return c.busyPoll, c.busyPollAuto, nil
}

// ReadyTimeoutDuration is ReadyTimeout parsed.
func (c *NetConf) ReadyTimeoutDuration() time.Duration { return c.readyTimeout }

// Chained reports whether an earlier plugin produced a result to take over.
// It reads PrevResult: Parse hands RawPrevResult to version.ParsePrevResult,
// which decodes it into PrevResult and clears it.
func (c *NetConf) Chained() bool { return c.PrevResult != nil }

// SocketRedirectMode resolves the pod's socket redirect: the conflist's
// "off", else the annotation, else the conflist's socketRedirect (absent:
// off); source says which decided.
func (c *NetConf) SocketRedirectMode() (mode, source string, err error) {
	v, ok := c.RuntimeConfig.PodAnnotations[AnnotationSocketRedirect]
	if ok && !validSocketRedirect(v) {
		return "", "", fmt.Errorf("pod annotation %q: got %q, want one of %s", AnnotationSocketRedirect, v, socketRedirectValues)
	}
	switch {
	case c.SocketRedirect == SocketRedirectOff:
		return SocketRedirectOff, "conflist socketRedirect", nil
	case ok:
		return v, "annotation " + AnnotationSocketRedirect, nil
	case c.SocketRedirect == "":
		return SocketRedirectOff, "default", nil
	}
	return c.SocketRedirect, "conflist socketRedirect", nil
}

func validSocketRedirect(v string) bool {
	switch v {
	case SocketRedirectOn, SocketRedirectBoth, SocketRedirectDirect, SocketRedirectOff:
		return true
	}
	return false
}

// GSOMode resolves the pod's GSO mode: the annotation, else the conflist's
// default. It also says where the mode came from.
func (c *NetConf) GSOMode() (offload.Mode, string, error) {
	if v, ok := c.RuntimeConfig.PodAnnotations[AnnotationGSO]; ok {
		m, err := offload.ParseMode(v)
		if err != nil {
			return "", "", fmt.Errorf("pod annotation %q: %w", AnnotationGSO, err)
		}
		return m, "annotation " + AnnotationGSO, nil
	}
	return offload.Mode(c.GSO), "conflist default", nil
}
