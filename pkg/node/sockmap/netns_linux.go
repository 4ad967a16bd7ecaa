package sockmap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// NetnsCookie is the cookie of the network namespace at path (a pinned
// namespace or /proc/PID/ns/net): the kernel's ID of a namespace, never
// reused while the node runs, which the programs key a pod by.
func NetnsCookie(path string) (uint64, error) {
	var cookie uint64
	err := ns.WithNetNSPath(path, func(ns.NetNS) error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("reading the cookie of network namespace %s: %w", path, err)
	}
	return cookie, nil
}

// Stats are a pod's counters.
type Stats struct {
	// Sockets are the pod's sockets in the socket hashes now; one that
	// went back to TCP and left them is no longer counted.
	Sockets uint32 `json:"sockets"`
	// Redirected counts messages handed to a peer's queue; Fallbacks the
	// sockets that went through TCP after all (no peer in the hash, a
	// reader over Budget, a capture); Refused the sockets left out at
	// MaxSocketsPerPod.
	Redirected uint64 `json:"redirected"`
	Fallbacks  uint64 `json:"fallbacks"`
	Refused    uint64 `json:"refused"`
	// Direct counts the messages of Redirected that went to an
	// application of another pod, past both stacks.
	Direct uint64 `json:"direct,omitempty"`
	// Services are the pod's open connections to a Service whose
	// backend is a direct pod of the node, which can join through the
	// node's translation.
	Services uint32 `json:"services,omitempty"`
	// Capture is on while a capture of the pod runs.
	Capture bool `json:"capture,omitempty"`
}

type counters [countersSize]byte

// Enable puts the pod's namespace in the redirect: its connections
// established from now on redirect what the applications send to the
// stack, and with both what the stack sends them too (the pod says its
// applications never read with splice).
func (n *Node) Enable(cookie uint64, both bool) error {
	flags := uint32(flagEnabled)
	if both {
		flags |= flagBoth
	}
	return n.enable(cookie, flags)
}

// EnableDirect puts the pod's namespace in the redirect as Enable does,
// and joins its connections with the other direct pods of the node: a
// connection between two of them that the node does not translate goes
// from one application's socket to the other's. addrs
// are the pod's own addresses, as IPAM gave them: the programs join a
// socket only from its own pod's address to another direct pod's.
func (n *Node) EnableDirect(cookie uint64, addrs []netip.Addr) error {
	for _, a := range addrs {
		if err := n.owners.Update(ownerKey(a), cookie, ebpf.UpdateAny); err != nil {
			n.forgetOwner(cookie)
			return fmt.Errorf("registering %s as netns cookie %d's: %w", a, cookie, err)
		}
	}
	if err := n.enable(cookie, flagEnabled|flagDirect); err != nil {
		n.forgetOwner(cookie)
		return err
	}
	return nil
}

// ownerKey is an address as the programs see it: IPv6, an IPv4 one
// mapped.
func ownerKey(a netip.Addr) [16]byte { return netip.AddrFrom16(a.As16()).As16() }

func (n *Node) enable(cookie uint64, flags uint32) error {
	// Counters first: the programs count only where both exist. A repeated
	// ADD keeps the counters it finds.
	if err := n.counters.Update(cookie, counters{}, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("enabling netns cookie %d: %w", cookie, err)
	}
	if err := n.netns.Update(cookie, flags, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("enabling netns cookie %d: %w", cookie, err)
	}
	return nil
}

// Disable takes the pod's namespace out: its sockets go through TCP from
// their next message. Absent already is no error (DEL is idempotent).
func (n *Node) Disable(cookie uint64) error {
	if err := n.netns.Delete(cookie); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("disabling netns cookie %d: %w", cookie, err)
	}
	if err := n.counters.Delete(cookie); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("removing the counters of netns cookie %d: %w", cookie, err)
	}
	owned := n.Owned(cookie)
	if err := n.forgetServices(owned); err != nil {
		return err
	}
	return n.forgetAddrs(cookie, owned)
}

// Owned lists the addresses registered as cookie's (status, tests).
func (n *Node) Owned(cookie uint64) []netip.Addr {
	var out []netip.Addr
	var addr [16]byte
	var owner uint64
	it := n.owners.Iterate()
	for it.Next(&addr, &owner) {
		if owner == cookie {
			out = append(out, netip.AddrFrom16(addr).Unmap())
		}
	}
	return out
}

// forgetOwner removes the addresses registered as cookie's. An address
// a newer pod registered since is that pod's, and stays; DEL runs this
// before IPAM releases the lease, so no newer pod has the address while
// it runs.
func (n *Node) forgetOwner(cookie uint64) error { return n.forgetAddrs(cookie, n.Owned(cookie)) }

// forgetAddrs is forgetOwner with cookie's addresses (Owned) read.
func (n *Node) forgetAddrs(cookie uint64, owned []netip.Addr) error {
	for _, a := range owned {
		if err := n.owners.Delete(ownerKey(a)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("removing %s of netns cookie %d: %w", a, cookie, err)
		}
	}
	return nil
}

// SetCapture turns the pod's capture flag on or off: while on, its
// connections go through TCP, where a capture on lo sees them; a
// connection that did stays on TCP afterwards.
func (n *Node) SetCapture(cookie uint64, on bool) error {
	var f uint32
	if err := n.netns.Lookup(cookie, &f); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return errNotEnabled
		}
		return fmt.Errorf("reading netns cookie %d: %w", cookie, err)
	}
	f &^= flagCapture
	if on {
		f |= flagCapture
	}
	if err := n.netns.Update(cookie, f, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("setting the capture flag of netns cookie %d: %w", cookie, err)
	}
	return nil
}

// Stats reads a pod's counters.
func (n *Node) Stats(cookie uint64) (Stats, error) {
	var f uint32
	var c counters
	if err := n.netns.Lookup(cookie, &f); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return Stats{}, errNotEnabled
		}
		return Stats{}, fmt.Errorf("reading netns cookie %d: %w", cookie, err)
	}
	if err := n.counters.Lookup(cookie, &c); err != nil {
		return Stats{}, fmt.Errorf("reading the counters of netns cookie %d: %w", cookie, err)
	}
	return Stats{
		Sockets:    binary.NativeEndian.Uint32(c[nsSocketsOff:]),
		Redirected: binary.NativeEndian.Uint64(c[nsRedirectedOff:]),
		Fallbacks:  binary.NativeEndian.Uint64(c[nsFallbacksOff:]),
		Refused:    binary.NativeEndian.Uint64(c[nsRefusedOff:]),
		Direct:     binary.NativeEndian.Uint64(c[nsDirectOff:]),
		Services:   binary.NativeEndian.Uint32(c[nsServicesOff:]),
		Capture:    f&flagCapture != 0,
	}, nil
}

// Enabled lists the cookies of the pod namespaces in the redirect.
func (n *Node) Enabled() ([]uint64, error) {
	var out []uint64
	var cookie uint64
	var flags uint32
	it := n.netns.Iterate()
	for it.Next(&cookie, &flags) {
		out = append(out, cookie)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("listing the socket redirect's pods: %w", err)
	}
	return out, nil
}

var errNotEnabled = errors.New("the pod's namespace is not enabled")

// IsNotEnabled reports whether err says the pod's namespace is not in
// the redirect.
func IsNotEnabled(err error) bool { return errors.Is(err, errNotEnabled) }
