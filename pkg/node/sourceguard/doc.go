// Package sourceguard owns the node-side nftables rules that drop every
// frame a pod sends on its link unless it carries the pod's own MAC and
// addresses.
//
// The pod's stack parses whatever the network sends it. Should a hostile
// peer ever subvert it, these rules keep it from impersonating other pods
// or the node, and from poisoning the neighbour tables of the node (and,
// when the link is a bridge port, of the other pods on the bridge). This
// is the check Calico makes with its RPF and source rules and Cilium with
// per-endpoint source validation; here it is enforced by the node's
// kernel, outside anything the pod controls.
//
// # What a pod may send
//
// Install binds, in the calling thread's network namespace, one table of
// family netdev per host-side link, named TableName(link), to the ingress
// hook of that link: it sees each frame as the node receives it from the
// pod, before the bridge (chain mode), routing or ARP/NDP. For a pod with
// MAC 02:00:00:00:00:05 and addresses 10.1.0.5 and fd00::5 it holds
// the following ("@nh,320,8" is the ICMPv6 type of an IPv6 packet without
// extension headers, "@nh,384,128" the target of a neighbour solicitation
// or advertisement, "@nh,512,16" the type and length of its first option,
// "@nh,528,48" that option's link-layer address). `nft list` shows the
// named matches as raw payloads too ("ether type ip" as "@ll,96,16
// 0x800").
//
//	table netdev cni-usernet-guard-<link> {
//		counter dropped { }
//		set pod4 { type ipv4_addr; elements = { 10.1.0.5 } }
//		set pod6 { type ipv6_addr; elements = { fd00::5 } }
//		chain ingress {
//			type filter hook ingress device "<link>" priority -500; policy drop;
//			ether saddr != 02:00:00:00:00:05 counter name "dropped" drop
//			ether type ip goto ipv4
//			ether type arp goto arp
//			ether type ip6 goto ipv6
//			counter name "dropped" drop
//		}
//		chain ipv4 {
//			ip saddr @pod4 accept
//			counter name "dropped" drop
//		}
//		chain arp {
//			arp htype 1 arp ptype ip arp hlen 6 arp plen 4 arp operation 1-2
//				arp saddr ether 02:00:00:00:00:05 arp saddr ip @pod4 accept
//			counter name "dropped" drop
//		}
//		chain ipv6 {
//			ip6 saddr :: goto ipv6-unspecified
//			ip6 saddr @pod6 goto ipv6-icmp
//			ip6 saddr fe80::/10 goto ipv6-icmp
//			counter name "dropped" drop
//		}
//		chain ipv6-unspecified {
//			ip6 nexthdr ipv6-icmp @nh,320,8 135 @nh,384,128 @pod6 accept
//			ip6 nexthdr ipv6-icmp @nh,320,8 135 @nh,384,128 fe80::/10 accept
//			counter name "dropped" drop
//		}
//		chain ipv6-icmp {
//			ip6 nexthdr ipv6-icmp @nh,320,8 134 counter name "dropped" drop
//			ip6 nexthdr ipv6-icmp @nh,320,8 137 counter name "dropped" drop
//			ip6 nexthdr ipv6-icmp @nh,320,8 135 goto ipv6-ns
//			ip6 nexthdr ipv6-icmp @nh,320,8 136 goto ipv6-na
//			ip6 nexthdr != ipv6-icmp meta l4proto ipv6-icmp @th,0,8 134-137 counter name "dropped" drop
//			accept
//		}
//		chain ipv6-ns {
//			ip6 length 24 accept
//			ip6 length 32 @nh,512,16 0x0101 @nh,528,48 0x020000000005 accept
//			counter name "dropped" drop
//		}
//		chain ipv6-na {
//			@nh,384,128 @pod6 ip6 length 24 accept
//			@nh,384,128 @pod6 ip6 length 32 @nh,512,16 0x0201 @nh,528,48 0x020000000005 accept
//			@nh,384,128 fe80::/10 ip6 length 24 accept
//			@nh,384,128 fe80::/10 ip6 length 32 @nh,512,16 0x0201 @nh,528,48 0x020000000005 accept
//			counter name "dropped" drop
//		}
//	}
//
// Rule by rule, and why:
//
//   - Every frame must come from the pod's MAC. The stack uses its link's
//     MAC as its NIC address, so nothing else is legitimate; a foreign MAC
//     would teach a bridge's forwarding table (chain mode) to send another
//     pod's traffic here.
//   - The ether type must be IPv4, ARP or IPv6, and only of a family the pod
//     has addresses of. 802.1Q/802.1ad VLAN tags, MPLS, PPPoE, LLDP, raw
//     802.3 and anything else are dropped: a pod has no business sending
//     them, and each is a parser or a forwarding decision on the node that
//     a pod should not reach. The rule reads the ether type from the frame,
//     not the kernel's skb->protocol: for a VLAN-tagged frame the kernel
//     has already moved the tag out of the frame and set skb->protocol to
//     the inner type by the time the hook runs, while nftables rebuilds the
//     tagged header for "ether type" and so sees 0x8100.
//   - IPv4: the source must be one of the pod's IPv4 addresses. 0.0.0.0 is
//     not allowed: pods get their addresses from IPAM through CNI, never by
//     DHCP, so nothing legitimate is sent from it.
//   - ARP: Ethernet/IPv4 ARP requests and replies only, with the pod's MAC
//     as sender hardware address and one of its IPv4 addresses as sender
//     protocol address, so a pod can resolve and be resolved but never
//     claim another address or point one at another MAC. ARP probes
//     (sender 0.0.0.0, RFC 5227) are dropped: the stack does no IPv4
//     duplicate address detection.
//   - IPv6: the source must be one of the pod's IPv6 addresses or
//     link-local (fe80::/10): the stack keeps the link-local address the
//     kernel gave the link, and netstack may send NDP and MLD from it. The
//     unspecified address :: is allowed only for a neighbour solicitation
//     whose target is the pod's own (or a link-local) address: duplicate
//     address detection, which the stack does not do but the pod's kernel
//     does before the stack takes the link over. MLD reports a kernel
//     sends from :: before its link-local address is usable are dropped;
//     Linux sends them again once the address is ready.
//   - Router advertisements (134) and redirects (137) are dropped: a pod is
//     never the node's router. Router solicitations (133) pass; they ask
//     for nothing a pod may not know.
//   - Neighbour advertisements must name as target one of the pod's IPv6
//     addresses or a link-local address, so a pod cannot claim another
//     pod's or the node's address.
//   - Neighbour solicitations and advertisements carry no option, or exactly
//     one: the source (135) or target (136) link-layer address option with
//     the pod's MAC. Linux and netstack read the first such option, so this
//     closes the other way to point an address at a foreign MAC. The exact
//     lengths (24 or 32 ICMPv6 bytes) are what Linux and netstack send;
//     nftables cannot walk a list of options, so longer messages are
//     dropped rather than half-checked. The nonce option of a duplicate
//     address detection probe only ever comes with source ::, which the
//     length rule does not apply to (a kernel ignores a probe that carries
//     a link-layer address option).
//   - NDP behind extension headers is dropped. The types are read at a
//     fixed offset only when the IPv6 header's next header is ICMPv6; when
//     it is not, nftables' own parse of the extension headers ("meta
//     l4proto", "@th") finds the ICMPv6 header and types 134 to 137 are
//     dropped. Nothing legitimate sends NDP with extension headers, and
//     RFC 6980 has receivers drop fragmented NDP.
//
// A pod with only IPv4 addresses may send no IPv6 at all, not even
// link-local: it needs none (its stack runs without IPv6), and link-local
// IPv6 would give it a path to every node service bound to [::]. Likewise
// a pod with only IPv6 addresses may send no IPv4 and no ARP. Frames a
// pod's kernel sends on the link before its stack disables IPv6 there
// (router solicitations, MLD) are dropped and counted.
//
// Every drop goes through one named counter, "dropped", which Dropped
// reads. The base chain's policy is drop as well, so a rule this package
// forgot to write fails closed, but its last rule drops everything with
// the counter first, so the policy never decides a frame.
//
// What passes is unchanged: GSO and GRO super-frames carry the same
// headers as one frame, and the rules read nothing else. Frames the node
// sends to the pod are not looked at (the hook is ingress only).
//
// # Limits
//
//   - The hook runs after the link's packet taps (tcpdump sees what is
//     dropped) and after tc ingress and XDP: a BPF program there that
//     redirects a frame (Cilium's bpf_lxc on the same link) takes it past
//     this check, and a setup that uses one needs the check in BPF.
//   - Link-local sources and targets are allowed as a whole (fe80::/10),
//     not just the pod's own link-local address, which the caller does not
//     know: the pod could use a link-local address another pod also uses.
//     Link-local addresses are meaningful only on the one link, and on a
//     ptp veth the node is the pod's only neighbour, so this can only
//     confuse traffic to the pod itself; on a bridge it could confuse the
//     other pods' link-local traffic (not their global addresses).
//   - Destinations are not checked: that is routing's and policy's job.
//   - A table outlives its link. Kernels from 6.16 keep a netdev hook by
//     name, so a later link of the same name would be guarded with the
//     old pod's MAC and addresses: DEL must call Remove (ADD's Install
//     replaces whatever is there anyway).
//
// # Replacing and removing
//
// One table per link, rather than a shared table with a chain per link,
// makes Install and Remove single transactions on a name only this package
// uses, with no state to keep: Install replaces the table whole (carrying
// the counter over), Remove deletes it whole, and neither touches another
// link's table. The priority (-500) puts the chain ahead of the standard
// netdev priorities (filter is 0, raw -300), so that another table's
// ingress chain which forwards or duplicates frames (fwd, dup) sees only
// frames this one accepted.
//
// Dropped reads the counter without state of its own either; for a link
// without a guard it returns 0 with ErrNotInstalled, so that a missing
// guard is not mistaken for a quiet pod.
//
// Callers that switch namespaces must hold the OS thread while calling
// into this package (ns.Do does). Calls for one link must not overlap
// (CNI runs one command per container at a time): two Installs racing
// could both find the table absent and leave their rules side by side.
package sourceguard
