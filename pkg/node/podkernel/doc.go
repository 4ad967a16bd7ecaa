// Package podkernel is the netlink and nftables work in a pod's network
// namespace: collecting what the kernel had configured on the pod's
// interface into a podnet.Spec and stripping it, the TUN device that
// carries the pod's addresses for the applications, and the divert rules
// that hand the applications' TCP and UDP to the stack's transparent
// listeners.
package podkernel
