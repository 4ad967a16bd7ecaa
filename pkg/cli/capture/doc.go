// Package capture is `cni-usernet capture`: it records a pod's traffic on
// both legs of its stack and writes it as pcap: a tap on the wire leg's
// link endpoint inside the stack, streamed over the control socket, and
// packet sockets on the app leg in the pod's kernel, merged into one
// pcapng (Record); Run is the command around it.
package capture
