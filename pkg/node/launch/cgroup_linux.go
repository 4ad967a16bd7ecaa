package launch

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// joinCgroup moves pid into cgroupPath under root. On a unified (v2)
// hierarchy that is one write; on v1 the path is joined in each hierarchy
// that has it. Finding none is an error: the caller asked for the stack to
// be charged there.
func joinCgroup(pid int, root, cgroupPath string) error {
	cgroupPath = strings.TrimPrefix(filepath.Clean("/"+cgroupPath), "/")
	if exists(filepath.Join(root, "cgroup.controllers")) {
		p := filepath.Join(root, cgroupPath, "cgroup.procs")
		err := writeProcs(p, pid)
		if errors.Is(err, unix.EBUSY) {
			// v2 puts no process in a cgroup that enables controllers
			// for its children (a pod's cgroup does, for its containers).
			return fmt.Errorf("joining cgroup %s: %w: it has controllers enabled for child cgroups, join a leaf below it", p, err)
		}
		if err != nil {
			return fmt.Errorf("joining cgroup %s: %w", p, err)
		}
		return nil
	}
	hierarchies, _ := filepath.Glob(filepath.Join(root, "*"))
	joined := 0
	for _, h := range hierarchies {
		p := filepath.Join(h, cgroupPath, "cgroup.procs")
		if err := writeProcs(p, pid); err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
				continue
			}
			return fmt.Errorf("joining cgroup %s: %w", p, err)
		}
		joined++
	}
	if joined == 0 {
		return fmt.Errorf("cgroup %s not found under %s", cgroupPath, root)
	}
	return nil
}

// writeProcs moves pid into the cgroup whose cgroup.procs is p. It never
// creates p: a cgroup file system makes it, and a missing one means
// there is no such cgroup.
func writeProcs(p string, pid int) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.Itoa(pid))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// StackOOMScoreAdj is a stack's oom_score_adj: kubelet's for a pod's
// pause container, one below the -997 of a Guaranteed pod's containers.
// In a pod's memory cgroup, whatever the pod's QoS class (Burstable
// containers get 2..999, BestEffort 1000), the kernel's OOM killer then
// takes an application process before the pod's network. Not -1000,
// which would exempt the stack: one that leaked would have the killer
// take every application process of its pod and still not free the
// memory.
const StackOOMScoreAdj = -998

// setOOMScoreAdj sets the OOM killer's adjustment of pid. The stack would
// otherwise inherit its launcher's: the runtime's at ADD (containerd's
// unit file sets -999), the node agent's container's on a restart.
func setOOMScoreAdj(pid, adj int) error {
	p := "/proc/" + strconv.Itoa(pid) + "/oom_score_adj"
	if err := os.WriteFile(p, []byte(strconv.Itoa(adj)), 0); err != nil {
		return fmt.Errorf("setting the stack's oom_score_adj to %d: %w", adj, err)
	}
	return nil
}

// Cgroups reads the cgroup membership of pid as /proc/PID/cgroup lines
// ("hierarchy-ID:controllers:path").
func Cgroups(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return nil, fmt.Errorf("reading cgroups of %d: %w", pid, err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n"), nil
}

// joinRecorded puts pid back into the cgroups a Cgroups call recorded, in
// every hierarchy mounted under root. A supervisor in a container passes
// the host's cgroup mount, so that a restarted stack leaves the
// supervisor's own cgroup: the runtime kills that cgroup's processes when
// the supervisor's container stops, and the stack must outlive it.
func joinRecorded(pid int, root string, lines []string) error {
	pidStr := []byte(strconv.Itoa(pid))
	var errs []error
	for _, line := range lines {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		controllers, path := parts[1], parts[2]
		var dirs []string
		switch {
		case controllers == "":
			dirs = []string{root, filepath.Join(root, "unified")}
		case strings.HasPrefix(controllers, "name="):
			dirs = []string{filepath.Join(root, strings.TrimPrefix(controllers, "name="))}
		default:
			dirs = []string{filepath.Join(root, controllers)}
			for _, c := range strings.Split(controllers, ",") {
				dirs = append(dirs, filepath.Join(root, c))
			}
		}
		joined := false
		for _, d := range dirs {
			if controllers == "" && !exists(filepath.Join(d, "cgroup.controllers")) {
				continue // not the unified hierarchy
			}
			p := filepath.Join(d, path, "cgroup.procs")
			if err := os.WriteFile(p, pidStr, 0); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				errs = append(errs, fmt.Errorf("joining cgroup %s: %w", p, err))
			}
			joined = true
			break
		}
		if !joined && controllers != "" {
			errs = append(errs, fmt.Errorf("cgroup %s:%s not found under %s", controllers, path, root))
		}
	}
	return errors.Join(errs...)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
