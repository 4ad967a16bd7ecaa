package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gvisor.dev/gvisor/pkg/seccomp"
)

// Report says what Apply did, for the stack's log.
type Report struct {
	Mode Mode `json:"mode"`
	// Mechanism is how the capability changes reached every thread.
	Mechanism string `json:"mechanism,omitempty"`
	// Threads is how many threads were checked to hold no capability.
	Threads int `json:"threads,omitempty"`
	// FilterLen is the seccomp program's length in instructions.
	FilterLen int `json:"filterLen,omitempty"`
	// FDs are the descriptors the process keeps, as /proc/self/fd shows
	// them: after Apply it can use these and open no others.
	FDs []string `json:"fds,omitempty"`
	// Took is how long each step took.
	Took map[string]time.Duration `json:"took,omitempty"`
}

// Apply sandboxes the whole process, all threads, for good: call it once
// setup is over, with every descriptor the process will use open, and
// every signal handler it will need installed. In mode On it drops every
// capability of every thread and installs a seccomp filter (TSYNC, which
// also sets no_new_privs on every thread) that fails every system call
// outside the allowlist with EPERM. An error leaves the process in an
// unknown state between the two: the caller must not serve.
func Apply(mode Mode) (Report, error) {
	rep := Report{Mode: mode}
	switch mode {
	case Off:
		return rep, nil
	case On, Log:
	default:
		return rep, fmt.Errorf("unknown sandbox mode %q", mode)
	}
	rep.Took = map[string]time.Duration{}
	last := time.Now()
	step := func(name string) {
		now := time.Now()
		rep.Took[name] = now.Sub(last).Round(100 * time.Microsecond)
		last = now
	}
	// Everything that reads files happens before the filter forbids it.
	fds, err := openFDs()
	if err != nil {
		return rep, err
	}
	rep.FDs = fds
	instrs, err := program(mode, os.Getpid())
	if err != nil {
		return rep, err
	}
	rep.FilterLen = len(instrs)
	step("program")
	if err := dropCaps(); err != nil {
		return rep, err
	}
	step("dropCaps")
	rep.Mechanism = allThreadsMechanism
	threads, err := ReadThreads(0)
	if err != nil {
		return rep, fmt.Errorf("checking capabilities were dropped: %w", err)
	}
	for _, th := range threads {
		if !th.Unprivileged() {
			return rep, fmt.Errorf("thread %d still holds capabilities after dropping them: %+v", th.TID, th)
		}
	}
	rep.Threads = len(threads)
	step("checkThreads")
	if err := seccomp.SetFilter(instrs); err != nil {
		return rep, fmt.Errorf("installing the seccomp filter: %w", err)
	}
	step("filter")
	return rep, nil
}

// openFDs lists this process's descriptors with what they point at.
func openFDs() ([]string, error) {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, fmt.Errorf("listing open descriptors: %w", err)
	}
	var out []string
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			// The descriptor ReadDir itself used, closed by now.
			continue
		}
		out = append(out, e.Name()+"="+target)
	}
	slices.SortFunc(out, func(a, b string) int { return fdNum(a) - fdNum(b) })
	return out, nil
}

func fdNum(s string) int {
	n, _, _ := strings.Cut(s, "=")
	i, _ := strconv.Atoi(n)
	return i
}
