// Package procfs reads what the benchmark measures of processes and the
// machine from /proc: CPU times, resident memory, wakeups, process groups.
package procfs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Cmdline is pid's command line, its arguments joined by spaces.
func Cmdline(pid int) string {
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return string(bytes.ReplaceAll(raw, []byte{0}, []byte{' '}))
}

// Running reports whether pid is a live process; a zombie (exited, not yet
// reaped) is not, though kill(pid, 0) succeeds on it.
func Running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z'
}

// USER_HZ: the unit of /proc CPU times, 100 on every Linux ABI Go supports.
const userHZ = 100

// SystemCPU returns the CPU seconds all CPUs spent not idle since boot.
func SystemCPU() float64 {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var busy float64
	for i, v := range f[1:] {
		n, _ := strconv.ParseFloat(v, 64)
		if i != 3 && i != 4 && i < 8 { // skip idle and iowait; guest is already in user
			busy += n
		}
	}
	return busy / userHZ
}

// ProcessCPU returns utime+stime of pid in seconds, 0 if pid ≤ 0 or gone.
func ProcessCPU(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(raw), ')')
	f := strings.Fields(string(raw[i+1:])) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / userHZ
}

// VMRSS is pid's VmRSS in MiB.
func VMRSS(pid int) (float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// ProcessWakeups returns how often pid's threads have blocked and been woken
// (the sum of their voluntary_ctxt_switches), 0 if pid ≤ 0 or gone. A
// thread that waits in epoll, a futex or a blocking system call counts one
// each time; preemption does not, so a loaded machine does not inflate it.
func ProcessWakeups(pid int) uint64 {
	if pid <= 0 {
		return 0
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0
	}
	var n uint64
	for _, task := range tasks {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				c, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				n += c
			}
		}
	}
	return n
}

// Smaps is the part of /proc/PID/smaps_rollup the scale section reads, in bytes.
type Smaps struct{ Rss, Pss, PssAnon, PssFile float64 }

// Add sums o into s.
func (s *Smaps) Add(o Smaps) {
	s.Rss += o.Rss
	s.Pss += o.Pss
	s.PssAnon += o.PssAnon
	s.PssFile += o.PssFile
}

// ReadSmapsRollup reads pid's /proc/PID/smaps_rollup.
func ReadSmapsRollup(pid int) (Smaps, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return Smaps{}, err
	}
	return parseSmapsRollup(raw)
}

func parseSmapsRollup(raw []byte) (Smaps, error) {
	var s Smaps
	seen := 0
	for _, l := range strings.Split(string(raw), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		kb, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return s, fmt.Errorf("smaps_rollup line %q: %w", l, err)
		}
		switch f[0] {
		case "Rss:":
			s.Rss, seen = kb*1024, seen+1
		case "Pss:":
			s.Pss, seen = kb*1024, seen+1
		case "Pss_Anon:":
			s.PssAnon = kb * 1024
		case "Pss_File:":
			s.PssFile = kb * 1024
		}
	}
	if seen < 2 {
		return s, fmt.Errorf("smaps_rollup has no Rss or Pss")
	}
	return s, nil
}

// ProcessesCPU is the CPU seconds (user and system) pids have used, from
// /proc/<pid>/stat's utime and stime; a process gone counts nothing.
func ProcessesCPU(pids []int) float64 {
	var ticks float64
	for _, pid := range pids {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(raw), ')')
		f := strings.Fields(string(raw[i+1:])) // f[0] is field 3, state
		if len(f) > 12 {
			u, _ := strconv.ParseFloat(f[11], 64)
			s, _ := strconv.ParseFloat(f[12], 64)
			ticks += u + s
		}
	}
	return ticks / 100 // USER_HZ
}

// RSS is a process's resident memory in bytes, from /proc/PID/status:
// anonymous, and file-backed (the binary's text, shared with every stack
// of the node and charged to whichever cgroup first read it).
type RSS struct{ Total, Anon, File float64 }

// ReadRSS reads pid's resident memory from /proc/PID/status.
func ReadRSS(pid int) (RSS, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return RSS{}, err
	}
	return parseStatusRSS(raw)
}

func parseStatusRSS(raw []byte) (RSS, error) {
	var r RSS
	seen := 0
	for _, l := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		var dst *float64
		switch k {
		case "VmRSS":
			dst = &r.Total
		case "RssAnon":
			dst = &r.Anon
		case "RssFile":
			dst = &r.File
		default:
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err != nil {
			return RSS{}, fmt.Errorf("/proc/PID/status %s: %w", k, err)
		}
		*dst, seen = kb*1024, seen+1
	}
	if seen != 3 {
		return RSS{}, fmt.Errorf("/proc/PID/status lacks VmRSS, RssAnon or RssFile")
	}
	return r, nil
}

// ProcessGroup lists the live processes of process group pgid: `ip netns
// exec` execs the server in place, but a server that forks keeps its
// children there.
func ProcessGroup(pgid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(raw), ')')
		f := strings.Fields(string(raw[i+1:])) // f[0] state, f[1] ppid, f[2] pgrp
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			out = append(out, pid)
		}
	}
	return out
}
