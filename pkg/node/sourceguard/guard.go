package sourceguard

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
)

// ErrNotInstalled is what Dropped returns (with a count of 0) for a link
// that has no guard: a caller exporting the count can treat it as zero, and
// one checking that the guard is in place learns that it is not.
var ErrNotInstalled = errors.New("no source guard installed")

// Guard is what a pod may send on its link.
type Guard struct {
	// Link is the node-side end of the pod's link, in the namespace the
	// caller runs in: the host side of the pod's veth (e.g.
	// "usn1234abcd5678"), or in chain mode the "vethXXXX" a flannel or
	// bridge plugin made. It must exist when Install runs.
	Link string
	// MAC is the pod end's MAC: the stack uses its link's MAC as its NIC
	// address, so it is the only source MAC the pod sends from.
	MAC net.HardwareAddr
	// IPs are the pod's addresses, IPv4 and/or IPv6; at least one. A pod
	// without IPv4 addresses may send no IPv4 or ARP, one without IPv6
	// addresses no IPv6. IPv4-mapped IPv6 addresses count as IPv4 and
	// zones are ignored.
	IPs []netip.Addr
}

// Validate rejects a guard Install could not express or that would let
// the pod send from an address that is never a pod's own.
func (g Guard) Validate() error {
	if err := validName(g.Link); err != nil {
		return err
	}
	switch {
	case len(g.MAC) != 6:
		return fmt.Errorf("MAC %q: want 6 bytes, got %d", g.MAC, len(g.MAC))
	case g.MAC[0]&1 != 0:
		return fmt.Errorf("MAC %s is a multicast address, not a NIC's", g.MAC)
	case slices.Equal(g.MAC, make(net.HardwareAddr, 6)):
		return fmt.Errorf("MAC %s is all zeros", g.MAC)
	}
	if len(g.IPs) == 0 {
		return fmt.Errorf("no pod addresses: a pod may send nothing without one")
	}
	for _, a := range g.IPs {
		a = a.Unmap()
		switch {
		case !a.IsValid():
			return fmt.Errorf("invalid pod address in %v", g.IPs)
		case a.IsUnspecified(), a.IsMulticast(), a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
			return fmt.Errorf("pod address %s cannot be a source address", a)
		}
	}
	return nil
}

// split returns the guard's IPv4 and IPv6 addresses as 4- and 16-byte
// slices, each once.
func (g Guard) split() (v4, v6 [][]byte) {
	seen := make(map[netip.Addr]bool)
	for _, a := range g.IPs {
		a = a.Unmap().WithZone("")
		if seen[a] {
			continue
		}
		seen[a] = true
		if a.Is4() {
			v4 = append(v4, a.AsSlice())
		} else {
			v6 = append(v6, a.AsSlice())
		}
	}
	return v4, v6
}

// validName rejects what cannot be a link's name.
func validName(link string) error {
	const ifNameSize = 16 // IFNAMSIZ, with the terminating NUL
	if link == "" || len(link) >= ifNameSize {
		return fmt.Errorf("invalid link name %q: want 1 to %d bytes", link, ifNameSize-1)
	}
	return nil
}

// TableName returns the name of the netdev table Install creates for
// link, for logs and for `nft list table netdev <name>`.
func TableName(link string) string {
	return tablePrefix + link
}

// tablePrefix starts the name of every table this package owns. It is not
// pkg/node/ingressdrop's "cni-usernet-" alone so that `nft list tables` tells
// the two apart; they never share a namespace anyway (ingressdrop's tables
// live in the pod's, these in the node's).
const tablePrefix = "cni-usernet-guard-"
