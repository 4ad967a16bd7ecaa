package sandbox

import (
	"fmt"
	"os"
)

// EnvVar switches the sandbox for debugging: "off" or "log" (see Mode).
// Unset or empty means on.
const EnvVar = "CNI_USERNET_SANDBOX"

// Mode says how much of the sandbox applies.
type Mode string

const (
	// On drops every capability and denies every system call outside the
	// allowlist with EPERM. The default.
	On Mode = "on"
	// Log drops every capability and installs the filter, but a system
	// call outside the allowlist runs and is logged by the kernel
	// (SECCOMP_RET_LOG: "type=1326 ... syscall=N" in the kernel log), to
	// find what a new code path needs without breaking it.
	Log Mode = "log"
	// Off changes nothing: the stack keeps the privileges it was started
	// with.
	Off Mode = "off"
)

// ParseMode reads a mode; "" is On.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", On:
		return On, nil
	case Log, Off:
		return Mode(s), nil
	}
	return "", fmt.Errorf("%s=%q: want %q, %q or %q", EnvVar, s, On, Log, Off)
}

// ModeFromEnv reads the mode from EnvVar.
func ModeFromEnv() (Mode, error) {
	return ParseMode(os.Getenv(EnvVar))
}
