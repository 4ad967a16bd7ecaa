// Package podnet is the pod's network facts (Spec): the addresses, routes
// and neighbours the kernel had configured on the pod's interface, written
// by the plugin and read by the stack, which moves them to its TUN. It is
// a package of its own because it is the file the plugin and the stack
// share, and a contract links no kernel code: the netlink work on these
// facts is pkg/node/podkernel's.
package podnet

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
)

// SpecVersion is bumped whenever a field changes meaning or the pod's
// namespace takes a shape an older stack would not undo, so that a stack
// refuses a spec written for a newer one instead of running the pod
// wrong. Stacks stamp the spec with their version when they start
// (Stamp), before they shape the namespace.
//
//	1  the applications reached the stack through a TUN
//	2  their TCP and UDP reach it through the divert (InstallDivert: an
//	   nftables table and a policy rule in the pod's namespace). A stack
//	   of version 1 leaves both in place: its pod would look healthy and
//	   pass nothing after a rollback. Version-1 stacks check
//	   Version != 1, so they refuse this version.
const SpecVersion = 2

// StackSocketMark is the SO_MARK of the stack's relay sockets in the
// pod's namespace (they talk to the applications over loopback): the
// node's socket redirect (pkg/node/sockmap) hands an application's
// messages to such a socket without TCP, and never the other way. It
// spells "uso", beside the divert's mark ("usn"), and no policy rule
// matches it, so the stack's packets route as without it.
const StackSocketMark = 0x75736f

// The MTUs a pod's link may have: IPv4's minimum datagram every host must
// accept (RFC 791), IPv6's minimum link MTU when the pod has IPv6 (RFC
// 8200), and the largest an IP packet's length field allows. The
// conflist's check, the agent's choice of the pods' MTU and the stack's
// spec all take them from here.
const (
	MinMTU   = 576
	MinMTUv6 = 1280
	MaxMTU   = 65535
)

// ErrNewer marks a spec written for a newer stack than this one.
var ErrNewer = errors.New("written by a newer cni-usernet")

// Spec is what the stack took over from the kernel: enough to rebuild the
// stack after a restart, when the kernel no longer has any of it.
type Spec struct {
	Version   int            `json:"version"`
	IfName    string         `json:"ifName"`
	MAC       string         `json:"mac"`
	MTU       uint32         `json:"mtu"`
	Addrs     []netip.Prefix `json:"addrs"`
	Routes    []Route        `json:"routes"`
	Neighbors []Neighbor     `json:"neighbors,omitempty"`
}

// Route is a unicast route of the pod's interface. A zero Gw means on-link.
type Route struct {
	Dst netip.Prefix `json:"dst"`
	Gw  netip.Addr   `json:"gw,omitzero"`
}

// Neighbor is a permanent neighbour entry found on the interface.
type Neighbor struct {
	IP  netip.Addr `json:"ip"`
	MAC string     `json:"mac"`
}

// PodIPs returns the interface's global addresses (not link-local), the ones
// the applications must see on the TUN device.
func (s *Spec) PodIPs() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s.Addrs {
		if p.Addr().IsLinkLocalUnicast() {
			continue
		}
		out = append(out, p)
	}
	return out
}

// Validate rejects a spec the stack cannot serve.
func (s *Spec) Validate() error {
	switch {
	case s.Version > SpecVersion:
		return fmt.Errorf("spec version %d, this stack understands up to %d: %w; refusing to run the pod with it", s.Version, SpecVersion, ErrNewer)
	case s.Version < 1:
		return fmt.Errorf("spec version %d, want 1 to %d", s.Version, SpecVersion)
	}
	if s.IfName == "" {
		return fmt.Errorf("spec has no interface name")
	}
	if s.MTU < MinMTU {
		return fmt.Errorf("spec MTU %d is below %d", s.MTU, MinMTU)
	}
	if len(s.PodIPs()) == 0 {
		return fmt.Errorf("spec of %s has no pod address", s.IfName)
	}
	return nil
}

// ReadSpec loads a spec written by WriteSpec.
func ReadSpec(path string) (*Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parsing spec %s: %w", path, err)
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("spec %s: %w", path, err)
	}
	return &s, nil
}

// WriteSpec writes the spec atomically: a reader sees the old file or the
// whole new one, never a torn write.
func WriteSpec(path string, s *Spec) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(path, b, 0o600)
}
