package podstack

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/offload"
	"github.com/cni-usernet/cni-usernet/pkg/relay"
)

// Config is what a launcher hands the stack process (as a JSON file): where
// to find and keep things, and the knobs from the conflist and annotations.
// The network facts themselves live in the spec.
type Config struct {
	// IfName is the pod interface to take over. Required.
	IfName string `json:"ifName"`
	// SpecPath is where the spec is kept: read if present (a restart),
	// otherwise collected from the kernel and written. Required.
	SpecPath string `json:"specPath"`
	// ControlSocket is the unix socket path for health and status. Required.
	ControlSocket string `json:"controlSocket"`
	// TUNName names the TUN device that carries the pod IPs and routes in
	// the pod's kernel. Zero: "usernet0".
	TUNName string `json:"tunName,omitempty"`
	// TUNMTU is the TUN's MTU. Zero: DefaultTUNMTU.
	TUNMTU uint32 `json:"tunMTU,omitempty"`
	// TUNOffload has no effect since the applications' TCP and UDP stopped
	// crossing the TUN (podnet.Divert); kept so that configurations written
	// for earlier versions still load.
	TUNOffload bool `json:"tunOffload,omitempty"`
	// GSO is the requested mode. Zero: auto.
	GSO offload.Mode `json:"gso,omitempty"`
	// GSOMaxSize and GSOMaxSegs, when set, lower the limits detected on the
	// link (never raise them).
	GSOMaxSize uint32 `json:"gsoMaxSize,omitempty"`
	GSOMaxSegs uint32 `json:"gsoMaxSegs,omitempty"`
	// GRO enables netstack GRO on the wire leg.
	GRO bool `json:"gro,omitempty"`
	// NoRXChecksumOffload makes the wire leg verify every checksum.
	NoRXChecksumOffload bool `json:"noRxChecksumOffload,omitempty"`
	// WireQueueLen sizes the queue in front of the wire link
	// (Options.WireQueueLen). Zero: DefaultQueueLen; -1: none. GSO mode
	// off never queues the wire leg: it is defined as one packet per
	// system call, the baseline the other modes are measured against.
	// AppQueueLen has no effect any more (see TUNOffload).
	WireQueueLen int `json:"wireQueueLen,omitempty"`
	AppQueueLen  int `json:"appQueueLen,omitempty"`
	// MaxTCP, MaxUDP and UDPIdle bound the relay (see relay.Options).
	MaxTCP  int      `json:"maxTCP,omitempty"`
	MaxUDP  int      `json:"maxUDP,omitempty"`
	UDPIdle Duration `json:"udpIdle,omitempty"`
	// PodLinkOffloadsOff turns TSO, GSO and scatter-gather off on the pod's
	// link before detection: a link without offload, for tests, benchmarks
	// and links known to misbehave.
	PodLinkOffloadsOff bool `json:"podLinkOffloadsOff,omitempty"`
}

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

// DefaultQueueLen is the default depth of the legs' FIFO queues. Measured
// (README "Queues"): queues on both legs raised one-stream TCP by 10-20 %
// in hardware and software mode; 1024 packets hold a 4 MiB window of
// full-size frames without drops.
const DefaultQueueLen = 1024

// DefaultTUNName is the app leg's device in the pod.
const DefaultTUNName = "usernet0"

// Validate reports the first problem with c and fills in defaults.
func (c *Config) Validate() error {
	if c.IfName == "" || c.SpecPath == "" || c.ControlSocket == "" {
		return fmt.Errorf("stack config needs ifName, specPath and controlSocket")
	}
	if c.TUNName == "" {
		c.TUNName = DefaultTUNName
	}
	if len(c.TUNName) > 15 {
		return fmt.Errorf("TUN name %q is longer than 15 bytes", c.TUNName)
	}
	if c.TUNName == c.IfName {
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
	for _, q := range []*int{&c.WireQueueLen, &c.AppQueueLen} {
		switch {
		case *q == 0:
			*q = DefaultQueueLen
		case *q == -1:
			*q = 0
		case *q < -1:
			return fmt.Errorf("queue length %d: want a positive length, 0 for the default or -1 for none", *q)
		}
	}
	if _, err := offload.ParseMode(string(c.GSO)); err != nil {
		return err
	}
	return nil
}

// ReadConfig loads and validates a config file.
func ReadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("parsing stack config %s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("stack config %s: %w", path, err)
	}
	return &c, nil
}

// MemoryLoad is the legitimate load a memory bound allows for; whatever the
// network sends on top of it is bounded by the configuration alone.
type MemoryLoad struct {
	// BulkTCP counts relayed TCP connections moving data as fast as they
	// can (each may fill its buffers on both legs).
	BulkTCP int
	// AnsweredUDP counts UDP flows the pod answers (each may fill its
	// receive queues on both legs).
	AnsweredUDP int
}

// Per-item costs behind MemoryBound, from docs/reliability/hostile.md,
// rounded up from measurements.
const (
	// memBase is an idle stack (15-20 MiB measured: binary, runtime,
	// netstack's buffer pools) with room for what grows with the packet
	// rate rather than with state: the buffer pools (the UDP relay's 64 KiB
	// datagram buffers, netstack's chunks) and the garbage collector's
	// headroom (GOGC 100: up to twice the live heap).
	memBase = 64 << 20
	// memPerPending is one inbound connection not yet established: a
	// forwarder goroutine, a netstack endpoint in SYN-RCVD, for a few an
	// app-leg endpoint too.
	memPerPending = 32 << 10
	// memPerUDPFlow is one UDP flow without queued data: two endpoints,
	// two goroutines, a timer.
	memPerUDPFlow = 32 << 10
	// memUDPQueues is what one flow's receive queues may hold: netstack's
	// 32 KiB default on each leg.
	memUDPQueues = 2 * 32 << 10
	// memFragments is IPv4 and IPv6 reassembly: netstack starts dropping
	// at 4 MiB each (fragmentation.HighFragThreshold, not configurable),
	// counted in payload bytes; small fragments occupy up to twice that.
	memFragments = 2 * 2 * 4 << 20
)

// MemoryBound is the documented bound on the stack process's RSS under
// load l plus anything the network sends (docs/reliability/hostile.md):
//
//	base + BulkTCP × 4 × TCP buffer
//	     + MaxPendingInbound × per-pending
//	     + (MaxUDPUnreplied + AnsweredUDP) × (per-flow + its queues)
//	     + reassembly
//
// The kernel drops what the stack cannot read in time at the AF_PACKET
// socket and the TUN, outside the process, and the links' FIFO queues hold
// references to data already counted in the TCP buffers.
func (c *Config) MemoryBound(l MemoryLoad) int64 {
	tcpBuf := int64(defaultTCPBufferBytes)
	udpFlows := int64(relay.DefaultMaxUDPUnreplied + l.AnsweredUDP)
	return memBase +
		int64(l.BulkTCP)*4*tcpBuf +
		relay.DefaultMaxPendingInbound*memPerPending +
		udpFlows*(memPerUDPFlow+memUDPQueues) +
		memFragments
}
