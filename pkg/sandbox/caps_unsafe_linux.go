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
	capsNone [2]unix.CapUserData // version 3 uses two 32-bit words per set
)

// clearCapSets empties the effective, permitted and inheritable sets of
// every thread.
func clearCapSets() error {
	capsHdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	capsNone = [2]unix.CapUserData{}
	return allThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&capsHdr)), uintptr(unsafe.Pointer(&capsNone[0])), 0, 0, 0, 0)
}
