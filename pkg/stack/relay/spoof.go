package relay

import (
	"net/netip"
	"slices"
)

// The applications are untrusted: a process that is root in its pod (with
// CAP_NET_RAW) can write any IP packet into the TUN (a raw socket with
// IP_HDRINCL routed there, or a packet socket on the TUN itself) and bind
// a transparent socket to any address, whose traffic the divert rules
// hand the relay's listeners. What the relay then sends on the wire leg
// carries the source the application chose, and netstack does not stop
// every such source: a dial bound on the wire NIC takes any IPv4 address
// (netstack, like Linux, checks only the interface), and the limited and
// the subnet's broadcast addresses find a route. So the relay takes from
// the applications' leg only what comes from one of the pod's own
// addresses (Options.PodAddrs), and drops and counts the rest
// (Stats.PodSpoofed): another pod's address, a broadcast, the node's, and
// IPv6 link-local ones. The pod's kernel may give the TUN a link-local
// address, but nothing was ever relayed from one: the wire leg does not
// hold it, and the one it holds (the pod interface's, taken from the
// kernel) is on no interface of the pod's kernel any more.

// fromPod reports whether src, the source of something the applications'
// leg handed the relay, is one of the pod's addresses, and counts it as
// spoofed when it is not.
func (e *env) fromPod(src netip.Addr) bool {
	if slices.Contains(e.opts.PodAddrs, src) {
		return true
	}
	e.stats.PodSpoofed.Add(1)
	return false
}

// fromPodSocket is fromPod for what reached the relay's listeners. A
// connection or datagram from loopback is a process of the pod talking to
// the listener itself, not through the divert rules: not relayable,
// dropped, but no one passing as someone else either (PodDropped).
func (e *env) fromPodSocket(src netip.Addr) bool {
	if src.IsLoopback() {
		e.stats.PodDropped.Add(1)
		return false
	}
	return e.fromPod(src)
}

// kernelLinkTraffic reports whether a packet from src to dst is what the
// pod's kernel itself sends on any IPv6 link: router solicitations,
// multicast listener reports and duplicate address detection, from the
// TUN's link-local or the unspecified address to a multicast group. The
// relay never carries them, and they are no one's attempt to pass as
// someone else: they count with the other packets it drops (PodDropped),
// not as spoofed.
func kernelLinkTraffic(src, dst netip.Addr) bool {
	return dst.Is6() && dst.IsMulticast() && (src.IsLinkLocalUnicast() || src.IsUnspecified())
}

// ipAddrs returns the addresses of an IPv4 or IPv6 packet; the bytes come
// from the applications.
func ipAddrs(p []byte) (src, dst netip.Addr, ok bool) {
	if len(p) < 1 {
		return src, dst, false
	}
	switch p[0] >> 4 {
	case 4:
		if len(p) >= 20 {
			return netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20])), true
		}
	case 6:
		if len(p) >= 40 {
			return netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40])), true
		}
	}
	return src, dst, false
}
