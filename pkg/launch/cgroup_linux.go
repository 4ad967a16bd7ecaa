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
