package sandbox

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Kept are the capabilities the serving stack keeps, in the permitted,
// effective and bounding sets. The relay's pod side opens a socket per
// connection or flow to the applications, bound to the remote peer's
// address and port:
//   - CAP_NET_RAW: the kernel checks it (or CAP_NET_ADMIN) when such a
//     socket is made transparent (IP_TRANSPARENT);
//   - CAP_NET_BIND_SERVICE: the remote's port may be below 1024 (an
//     application's DNS query to port 53 is answered from a socket bound
//     to the server's address and port 53).
//
// What CAP_NET_RAW would otherwise open, raw and packet sockets, the
// seccomp filter refuses: socket(2) is allowed for TCP and UDP over IPv4
// and IPv6 only. Both are checked against the pod network namespace's
// user namespace, and the stack cannot leave its namespace (no setns).
var Kept = []int{unix.CAP_NET_RAW, unix.CAP_NET_BIND_SERVICE}

// keptMask is Kept as a /proc status bit mask.
var keptMask = func() uint64 {
	var m uint64
	for _, c := range Kept {
		m |= 1 << c
	}
	return m
}()

// dropCaps empties every capability set of every thread but for Kept. The
// bounding set goes first because dropping from it needs CAP_SETPCAP,
// which the last step takes away; ambient is cleared explicitly although
// emptying permitted would clear it too, so that no step relies on a side
// effect.
func dropCaps() error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := 0; c <= last; c++ {
		if keptMask&(1<<c) != 0 {
			continue
		}
		if err := allThreads(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0, 0); err != nil {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	if err := allThreads(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	if err := clearCapSets(); err != nil {
		return fmt.Errorf("clearing effective, permitted and inheritable capabilities: %w", err)
	}
	return nil
}

// lastCap is the highest capability number the kernel knows.
func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("reading the highest capability number: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("parsing /proc/sys/kernel/cap_last_cap %q: %w", b, err)
	}
	return n, nil
}

// ThreadState is what /proc says about one thread's privileges.
type ThreadState struct {
	TID                               int
	CapInh, CapPrm, CapEff, CapBnd    uint64
	CapAmb                            uint64
	NoNewPrivs, Seccomp, SeccompCount int
}

// Unprivileged reports whether the thread holds no capability in any set
// but Kept, and Kept in no inheritable or ambient set (so nothing it
// started could inherit it).
func (s ThreadState) Unprivileged() bool {
	return (s.CapPrm|s.CapEff|s.CapBnd)&^keptMask == 0 && s.CapInh|s.CapAmb == 0
}

// ReadThreads reads the privilege lines of every thread of pid (0: this
// process) from /proc. The root tests use it on the stack process.
func ReadThreads(pid int) ([]ThreadState, error) {
	dir := "/proc/self/task"
	if pid != 0 {
		dir = fmt.Sprintf("/proc/%d/task", pid)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing threads: %w", err)
	}
	var out []ThreadState
	for _, e := range entries {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			// Exited since the listing.
			continue
		}
		s, err := parseStatus(b)
		if err != nil {
			return nil, fmt.Errorf("thread %d: %w", tid, err)
		}
		s.TID = tid
		out = append(out, s)
	}
	return out, nil
}

// parseStatus takes the privilege lines out of a /proc/.../status file.
func parseStatus(b []byte) (ThreadState, error) {
	var s ThreadState
	hex := map[string]*uint64{"CapInh": &s.CapInh, "CapPrm": &s.CapPrm, "CapEff": &s.CapEff, "CapBnd": &s.CapBnd, "CapAmb": &s.CapAmb}
	dec := map[string]*int{"NoNewPrivs": &s.NoNewPrivs, "Seccomp": &s.Seccomp, "Seccomp_filters": &s.SeccompCount}
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		var err error
		if p, ok := hex[k]; ok {
			*p, err = strconv.ParseUint(v, 16, 64)
			seen++
		} else if p, ok := dec[k]; ok {
			*p, err = strconv.Atoi(v)
			seen++
		}
		if err != nil {
			return s, fmt.Errorf("parsing %s %q: %w", k, v, err)
		}
	}
	if want := len(hex) + len(dec); seen != want {
		return s, fmt.Errorf("status has %d of the %d privilege lines", seen, want)
	}
	return s, nil
}
