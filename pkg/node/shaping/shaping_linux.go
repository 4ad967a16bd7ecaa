// Package shaping limits a pod's bandwidth as the CNI bandwidth plugin
// does (the runtime's "bandwidth" capability argument, from the
// kubernetes.io/ingress-bandwidth and egress-bandwidth annotations), on
// the two ends of the pod's veth: what reaches the pod leaves through the
// node end, what the pod sends leaves through the pod end, which lives in
// the stack's own namespace. A token bucket filter as the root qdisc of
// each does the work, with the bandwidth plugin's parameters, so a pod is
// shaped alike under either. The bandwidth plugin itself cannot serve a
// pod of ours: it finds the node end as the veth peer of the pod's
// CNI_IFNAME, which here is the stack's TUN; shaping the pod end directly
// also spares the ifb it redirects the pod's traffic through.
//
// It is a package of its own, not part of the plugin, so that its root
// tests run in namespaces of their own; the limits themselves are part of
// the network configuration (netconf.Limits).
package shaping

import (
	"errors"
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// latency is how long a packet may wait in the bucket's queue before it
// is dropped: the bandwidth plugin's 25 ms, from which the queue's byte
// limit follows.
const latency = 25_000 // µs

// Apply makes a token bucket filter of rate and burst the root qdisc of
// link, in the calling thread's namespace; rate zero removes ours.
// Repeating it replaces the filter.
func Apply(link string, rateBits, burstBits uint64) error {
	l, err := netlinksafe.LinkByName(link)
	if err != nil {
		return fmt.Errorf("shaping %s: %w", link, err)
	}
	if rateBits == 0 {
		return remove(l)
	}
	rate, burst := rateBits/8, burstBits/8
	buffer := tick(float64(burst) * float64(netlink.TIME_UNITS_PER_SEC) / float64(rate))
	limit := uint32(float64(rate)*latency/float64(netlink.TIME_UNITS_PER_SEC)) + uint32(burst)
	q := &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate:       rate,
		Limit:      limit,
		Buffer:     buffer,
	}
	if err := netlink.QdiscReplace(q); err != nil {
		return fmt.Errorf("shaping %s to %d bit/s: %w", link, rateBits, err)
	}
	return nil
}

// Remove takes our filter off link; none there, or no link, is success.
func Remove(link string) error {
	l, err := netlinksafe.LinkByName(link)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("unshaping %s: %w", link, err)
	}
	return remove(l)
}

func remove(l netlink.Link) error {
	qs, err := netlinksafe.QdiscList(l)
	if err != nil {
		return fmt.Errorf("listing the qdiscs of %s: %w", l.Attrs().Name, err)
	}
	for _, q := range qs {
		if _, ok := q.(*netlink.Tbf); !ok || q.Attrs().Parent != netlink.HANDLE_ROOT {
			continue
		}
		if err := netlink.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unshaping %s: %w", l.Attrs().Name, err)
		}
	}
	return nil
}

// Rate reads the root token bucket filter's rate of link in bits per
// second; 0 when it has none.
func Rate(link string) (uint64, error) {
	l, err := netlinksafe.LinkByName(link)
	if err != nil {
		return 0, fmt.Errorf("reading the shaping of %s: %w", link, err)
	}
	qs, err := netlinksafe.QdiscList(l)
	if err != nil {
		return 0, fmt.Errorf("listing the qdiscs of %s: %w", link, err)
	}
	for _, q := range qs {
		if t, ok := q.(*netlink.Tbf); ok && q.Attrs().Parent == netlink.HANDLE_ROOT {
			return t.Rate * 8, nil
		}
	}
	return 0, nil
}

// tick converts microseconds to the kernel's packet scheduler ticks.
func tick(us float64) uint32 { return uint32(us * float64(netlink.TickInUsec())) }
