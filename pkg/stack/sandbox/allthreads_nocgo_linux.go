//go:build !cgo

package sandbox

import "syscall"

// allThreads runs one system call on every thread of the process. Without
// cgo the Go runtime knows every thread, and stops them all to run it.
func allThreads(trap, a1, a2, a3, a4, a5, a6 uintptr) error {
	_, _, errno := syscall.AllThreadsSyscall6(trap, a1, a2, a3, a4, a5, a6)
	if errno != 0 {
		return errno
	}
	return nil
}

// allThreadsMechanism names how allThreads reaches every thread, for the
// startup log.
const allThreadsMechanism = "syscall.AllThreadsSyscall6"
