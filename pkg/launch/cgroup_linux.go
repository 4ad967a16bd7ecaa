package launch

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// joinCgroup moves pid into cgroupPath. On a unified (v2) hierarchy that is
// one write; on v1 the path is joined in each controller that has it.
// Finding none is an error: the caller asked for the stack to be charged
// to the pod.
func joinCgroup(pid int, cgroupPath string) error {
	cgroupPath = strings.TrimPrefix(filepath.Clean("/"+cgroupPath), "/")
	pidStr := []byte(strconv.Itoa(pid))
	if err := os.WriteFile(filepath.Join("/sys/fs/cgroup", cgroupPath, "cgroup.procs"), pidStr, 0); err == nil {
		return nil
	}
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	joined := 0
	for _, root := range roots {
		p := filepath.Join(root, cgroupPath, "cgroup.procs")
		if err := os.WriteFile(p, pidStr, 0); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return fmt.Errorf("joining cgroup %s: %w", p, err)
		}
		joined++
	}
	if joined == 0 {
		return fmt.Errorf("cgroup %s not found under /sys/fs/cgroup", cgroupPath)
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
