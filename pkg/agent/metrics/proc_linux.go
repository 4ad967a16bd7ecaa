package metrics

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// userHZ is the unit of /proc/PID/stat's CPU times. Linux fixes USER_HZ
// at 100 on every architecture it exports it to user space on (the
// procfs library Prometheus' own process collector uses assumes the same).
const userHZ = 100

// procUsage is what a stack process costs the node.
type procUsage struct {
	cpuSeconds float64
	rssBytes   float64
}

// readProc reads pid's CPU time and resident memory, provided it is still
// the process started at startTime (field 22): a PID reused by another
// process is reported as gone.
func readProc(pid int, startTime uint64) (procUsage, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procUsage{}, fmt.Errorf("reading the stack's /proc stat: %w", err)
	}
	s := string(b)
	// The command name (field 2) may hold spaces and parentheses; fields
	// after the last ')' are plain, fields[0] being field 3.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procUsage{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 22 {
		return procUsage{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	st, err1 := strconv.ParseUint(f[19], 10, 64)
	utime, err2 := strconv.ParseUint(f[11], 10, 64)
	stime, err3 := strconv.ParseUint(f[12], 10, 64)
	rss, err4 := strconv.ParseInt(f[21], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return procUsage{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	if st != startTime || f[0] == "Z" {
		return procUsage{}, fmt.Errorf("stack process %d is gone", pid)
	}
	return procUsage{
		cpuSeconds: float64(utime+stime) / userHZ,
		rssBytes:   float64(rss * int64(os.Getpagesize())),
	}, nil
}
