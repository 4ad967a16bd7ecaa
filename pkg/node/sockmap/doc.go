// Package sockmap takes the loopback TCP out of the applications' leg.
//
// Every TCP connection in a pod's network namespace has both ends there:
// the relay's connections between the stack and an application over
// loopback (transparent sockets), and the pod's own loopback connections.
// Sent through the pod's kernel, each message pays TCP twice over: the
// sender's segmentation and loopback transmit, the receiver's softirq and
// TCP receive. With a socket map the kernel hands a message from one
// socket straight to its peer's receive queue (an sk_msg verdict with
// bpf_msg_redirect_hash and BPF_F_INGRESS), and neither end runs TCP for
// it; Cilium's socket-level acceleration does the same for local
// connections.
//
// Two programs and two socket hashes do it, loaded once per node and
// pinned under bpffs:
//
//   - a sock_ops program on the cgroup v2 root puts each TCP socket of an
//     enabled pod namespace (a netns cookie in the namespaces map, which
//     the plugin fills at ADD) in the hashes when it is established,
//     keyed by the namespace and its four-tuple, and removes its
//     bookkeeping when it closes. An application's socket goes in socks,
//     the hash with the verdict. A stack's socket goes in targets, a hash
//     with no programs, where the applications' verdict finds it; it goes
//     in socks as well only when the pod redirects the stack's writes too
//     (both). A socket in a hash with an sk_msg verdict sends through the
//     sockmap's own sendmsg (a copy, then a push into TCP) for as long as
//     it is in one, even when the verdict sends it through TCP; in
//     targets alone it keeps TCP's own.
//   - an sk_msg verdict on socks decides, for each message a member
//     socket sends, whether it goes to the peer's receive queue (an
//     application's to the stack's socket in targets, the stack's to the
//     application's in socks) or through TCP.
//
// The verdict keeps three rules that a redirect needs and TCP gave for
// free:
//
//   - Order. Data a socket received through TCP and data redirected to it
//     sit in two queues, and the kernel reads the redirected one first, so
//     a direction that has once gone through TCP never goes back to the
//     redirect: each socket's choice is kept in its socket storage, and
//     it only ever moves from redirect to TCP (older redirected data is
//     then read first, as it should be).
//   - Back-pressure. A redirect has no TCP window: a writer would fill a
//     reader that does not read without bound. So each socket's unread
//     redirected bytes are bounded (Budget): every sender adds what it
//     redirects to its peer's count, every socket sets its own count to
//     what its queue really holds (the socket psock's msg_tot_len, read
//     through BTF) whenever it sends through the verdict and on each RTT
//     callback (an ACK of what it sent through TCP: a stack's socket
//     without a verdict has only those), and a sender whose peer is over
//     the budget goes through TCP, whose window then holds it. Request
//     and response keep the redirect; a one-way bulk transfer goes
//     through TCP once the budget is spent.
//   - Observation. While a capture of the pod runs, its connections go
//     through TCP, where the capture sees them on lo.
//
// A socket that went back to TCP leaves both hashes, so that its sends
// (and reads) go back to TCP's own code, but only when nothing can be
// lost; the sock_ops program checks on the socket's RTT callbacks. Its
// own sends must go through TCP (no verdict, or a verdict that chose
// TCP, kept in the info map too, where its peer's program reads it by
// key); its own redirect queue must be empty, since leaving the last
// hash drops the socket's psock and that purges the queue; and its peer
// must no longer be able to redirect into it: a peer without a verdict,
// or of the same kind, never does, and one whose verdict chose TCP
// starts no new redirect, but one it chose just before may still land,
// so the socket then waits leaveGrace first. It then stops its RTT
// callbacks and leaves the pod's count.
//
// Between two pods of the node that both say direct (flagDirect), a
// connection the node does not translate goes from one application's
// socket to the other's, past both stacks: the verdict of an
// application's socket looks up the pod that owns the remote address
// (the owners map, filled at ADD from IPAM's addresses) and, in that
// pod's namespace, the socket with the mirrored four-tuple, and
// redirects to it (BPF_F_INGRESS) under the same budget. It does so only
// from an address its own pod owns, only to an application's socket of
// a direct pod not being captured, and only once the other end has read
// everything this one sent through the stacks: that data sits in the
// other end's TCP queue, which its reads take after the redirect's, so
// each such socket counts what it redirected to its own stack
// (infoSent) and publishes, whenever it sends, what it has read of its
// TCP stream (infoRead, from tcp_sock through BTF, under its lock). A
// direct pod's stack writes to its applications through TCP, so that
// the count is whole. An application's socket of a direct pod stays in
// the hashes while open, since its other end may join it at any
// message.
//
// A connection through a Service's cluster IP reaches the other pod
// translated by the node, so its ends are not each other's mirror. A
// tc program on the node's end of each direct pod's link (the service
// program, which only reads) takes the node's translation of each SYN
// into the pod from the packet's conntrack entry and records it in the
// services map for both ends, under each end's four-tuple the other
// end's; the verdict looks there first and joins only when the other
// end's entry names it back. The client's pod is charged for it (at
// most MaxSocketsPerPod), and its socket's close takes both entries
// away.
//
// What the kernel must have (Check): BTF, sockmap and socket storage,
// bpf_get_netns_cookie in sock_ops and sk_msg, bpf_skc_to_tcp_sock and the
// bpf_rdonly_cast kfunc in sk_msg and sock_ops, deleting from a socket
// hash in sock_ops, the psock's msg_tot_len, and tcp_sock's
// bytes_received, rcv_nxt and copied_seq. Where any is missing the
// loader says so and the pod keeps the loopback TCP. The service
// program also needs sk_buff._nfct and struct nf_conn in the kernel's
// BTF and the bpf_cast_to_kern_ctx kfunc; without them only joins
// through a Service are off.
package sockmap
