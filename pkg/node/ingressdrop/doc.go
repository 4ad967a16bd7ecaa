// Package ingressdrop owns the nftables rule that keeps the kernel from
// processing the frames a pod link receives, so that the userspace stack
// reading the link through AF_PACKET is their only consumer.
//
// For each link it installs, over netlink in the calling thread's network
// namespace, one table of family netdev named TableName(ifName)
// ("cni-usernet-<ifname>") holding one base chain:
//
//	table netdev cni-usernet-eth0 {
//		chain ingress {
//			type filter hook ingress device "eth0" priority 0; policy drop;
//		}
//	}
//
// One table per link, rather than one shared table with a chain per link,
// makes every operation a single atomic transaction on a name this package
// alone owns: Install replaces the table whole (so a second Install, or one
// after someone added rules, leaves exactly the chain above) and Remove
// deletes it whole, without listing first and without touching other links.
//
// Why the userspace stack still sees everything: in
// __netif_receive_skb_core the kernel first hands each frame to the
// ETH_P_ALL packet taps, then runs the tc and netfilter ingress hooks, and
// only then delivers to protocol handlers (IP, ARP) and to packet sockets
// bound to one protocol. So an AF_PACKET socket must bind ETH_P_ALL (to the
// link or to all links) to receive the frames this chain drops; one bound
// to, say, ETH_P_IP sees nothing. Frames the stack sends are not affected
// (the chain is on ingress only).
//
// The chain drops only what arrives on the link: loopback traffic and the
// kernel's own transmissions are untouched. Callers that switch namespaces
// must hold the OS thread while calling into this package (ns.Do does).
package ingressdrop
