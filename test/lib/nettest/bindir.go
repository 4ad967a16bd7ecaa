package nettest

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// binDirPrefix names the directories BinDir builds into: the prefix, the
// building process's PID, a dash. No test binary can remove its own at
// exit without a TestMain in every package, so each new one removes
// those of processes that are gone: what stays on the machine is the
// directories of the test binaries still running.
const binDirPrefix = "cni-usernet-bin-"

// newBinDir makes this process's directory in parent, after removing
// those of dead processes.
func newBinDir(parent string) (string, error) {
	sweepBinDirs(parent)
	return os.MkdirTemp(parent, binDirPrefix+strconv.Itoa(os.Getpid())+"-")
}

// sweepBinDirs removes parent's BinDir directories whose process is no
// longer running. A directory without a PID in its name (an older
// layout's) is left alone: its owner cannot be told.
func sweepBinDirs(parent string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), binDirPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		os.RemoveAll(filepath.Join(parent, e.Name()))
	}
}

// processAlive says whether pid names a process (of any user: EPERM is
// a live process too).
func processAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
