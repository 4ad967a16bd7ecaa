package sandbox

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The capset arguments live in package variables: every thread reads them
// from its own signal handler or runtime callback while the caller waits,
// and a variable that never moves is simplest to hand out as an address.
var (
	capsHdr  unix.CapUserHeader
	capsKept [2]unix.CapUserData // version 3 uses two 32-bit words per set
)

// clearCapSets empties the effective, permitted and inheritable sets of
// every thread but for Kept in effective and permitted.
func clearCapSets() error {
	capsHdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	capsKept = [2]unix.CapUserData{}
	for _, c := range Kept {
		capsKept[c/32].Effective |= 1 << (c % 32)
		capsKept[c/32].Permitted |= 1 << (c % 32)
	}
	return allThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&capsHdr)), uintptr(unsafe.Pointer(&capsKept[0])), 0, 0, 0, 0)
}
