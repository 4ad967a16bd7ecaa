// Package cgroup makes the benchmark's own cgroups, kubelet's way: finds the
// hierarchies, creates and limits cgroups, moves processes in and back, reads
// their CPU and memory, and removes every one it made.
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/procfs"
	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

// The limits and sizing sections put a pod's processes into cgroups the
// benchmark makes directly under each hierarchy's root, named Prefix…,
// as kubelet makes a pod's: the root is the one place where a v2 cgroup
// may both hold processes and enable controllers for its children, and a
// prefix lets cleanup find what a killed run left.

const (
	Prefix = "ub-bench-"
	// CFSPeriodUs is kubelet's CFS period (its --cpu-cfs-quota-period
	// default): a limit of 100m is 10 ms of CPU in every 100 ms.
	CFSPeriodUs = 100000
)

// FS is where this machine mounts the controllers the benchmark uses.
type FS struct {
	// V2 is the unified hierarchy's mount when it holds the cpu
	// controller; empty when cpu is on a v1 hierarchy (v1, or a hybrid
	// whose unified mount holds no controllers, as on this project's VMs).
	V2 string
	// CPU, CPUAcct and Memory are the v1 mounts (one directory when the
	// controllers are mounted together, "cpu,cpuacct"); Memory is empty
	// when there is no v1 memory hierarchy.
	CPU, CPUAcct, Memory string
	// enabled are the controllers this run turned on in the v2 root's
	// cgroup.subtree_control, turned off again by Sweep.
	enabled []string
}

// mountEntry is the part of a /proc/self/mountinfo line findCgroupFS reads.
type mountEntry struct{ point, fstype, superOpts string }

func parseMountinfo(raw []byte) []mountEntry {
	var out []mountEntry
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		// The kernel escapes space, tab, newline and backslash as octal.
		point := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(f[4])
		out = append(out, mountEntry{point: point, fstype: g[0], superOpts: g[2]})
	}
	return out
}

// findCgroupFS picks the hierarchies from mounts. controllers reads a
// unified mount's cgroup.controllers: a hybrid node mounts one that holds
// none, and its cpu is on v1. A controller mounted twice (a bind mount)
// is taken where it is first mounted.
func findCgroupFS(mounts []mountEntry, controllers func(dir string) string) (FS, error) {
	var fs FS
	var unified []string
	for _, m := range mounts {
		switch m.fstype {
		case "cgroup":
			for _, o := range strings.Split(m.superOpts, ",") {
				for name, dst := range map[string]*string{"cpu": &fs.CPU, "cpuacct": &fs.CPUAcct, "memory": &fs.Memory} {
					if o == name && *dst == "" {
						*dst = m.point
					}
				}
			}
		case "cgroup2":
			unified = append(unified, m.point)
		}
	}
	if fs.CPU != "" {
		if fs.CPUAcct == "" {
			return FS{}, fmt.Errorf("cgroup v1 cpu hierarchy at %s but no cpuacct hierarchy to read a cgroup's CPU time from", fs.CPU)
		}
		return fs, nil
	}
	for _, u := range unified {
		if slices.Contains(strings.Fields(controllers(u)), "cpu") {
			return FS{V2: u}, nil
		}
	}
	return FS{}, errors.New("no cgroup v1 cpu hierarchy and no cgroup v2 mount with the cpu controller")
}

// Detect fills f from this machine's mounts.
func (f *FS) Detect() error {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	*f, err = findCgroupFS(parseMountinfo(raw), func(dir string) string {
		raw, _ := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		return string(raw)
	})
	return err
}

func (f *FS) String() string {
	if f.V2 != "" {
		return "cgroup v2 at " + f.V2
	}
	return fmt.Sprintf("cgroup v1: cpu at %s, cpuacct at %s, memory at %s", f.CPU, f.CPUAcct, f.Memory)
}

// Group is one cgroup the benchmark made. On v2 its three directories
// are one.
type Group struct {
	Rel          string // path below the hierarchies' roots
	cpu, cpuacct string // "" where it was not made
	Memory       string // "" where it was not made
	V2           bool
}

// dirs are the cgroup's directories, each once.
func (g *Group) dirs() []string {
	var out []string
	for _, d := range []string{g.cpu, g.cpuacct, g.Memory} {
		if d != "" && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// Create makes cgroup rel, whose parent exists, in the hierarchies of the
// controllers asked for ("cpu", which brings cpuacct on v1, and
// "memory"). On v2 they are enabled in the parent's cgroup.subtree_control
// first: a cgroup has a controller's files (cpu.max, memory.current) only
// when its parent hands the controller down.
func (f *FS) Create(rel string, controllers ...string) (*Group, error) {
	g := &Group{Rel: rel, V2: f.V2 != ""}
	if g.V2 {
		if err := f.enable(filepath.Dir(rel), controllers); err != nil {
			return nil, err
		}
		d := filepath.Join(f.V2, rel)
		g.cpu, g.cpuacct, g.Memory = d, d, d
		if !slices.Contains(controllers, "cpu") {
			g.cpu = ""
		}
		if !slices.Contains(controllers, "memory") {
			g.Memory = ""
		}
	} else {
		for _, c := range controllers {
			switch c {
			case "cpu":
				g.cpu, g.cpuacct = filepath.Join(f.CPU, rel), filepath.Join(f.CPUAcct, rel)
			case "memory":
				if f.Memory == "" {
					return nil, errors.New("no cgroup v1 memory hierarchy")
				}
				g.Memory = filepath.Join(f.Memory, rel)
			}
		}
	}
	for _, d := range g.dirs() {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, fmt.Errorf("creating cgroup %s: %w", d, err)
		}
	}
	return g, nil
}

// enable turns controllers on in the cgroup.subtree_control of v2 cgroup
// parent ("." for the root), remembering those it turned on in the root:
// the benchmark's own cgroups go with their controllers.
func (f *FS) enable(parent string, controllers []string) error {
	p := filepath.Join(f.V2, parent, "cgroup.subtree_control")
	raw, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	have := strings.Fields(string(raw))
	for _, c := range controllers {
		if slices.Contains(have, c) {
			continue
		}
		if err := os.WriteFile(p, []byte("+"+c), 0); err != nil {
			return fmt.Errorf("enabling the %s controller in %s: %w", c, p, err)
		}
		if parent == "." && !slices.Contains(f.enabled, c) {
			f.enabled = append(f.enabled, c)
		}
	}
	return nil
}

// SetCPULimit gives the cgroup a CFS quota of cores per period, the way
// kubelet turns a pod's CPU limit into one; cores 0 removes the quota.
func (g *Group) SetCPULimit(cores float64) error {
	quota := "-1"
	if cores > 0 {
		quota = strconv.FormatInt(cfsQuotaUs(cores), 10)
	}
	if g.V2 {
		if quota == "-1" {
			quota = "max"
		}
		return writeCgroupFile(filepath.Join(g.cpu, "cpu.max"), fmt.Sprintf("%s %d", quota, CFSPeriodUs))
	}
	if err := writeCgroupFile(filepath.Join(g.cpu, "cpu.cfs_period_us"), strconv.Itoa(CFSPeriodUs)); err != nil {
		return err
	}
	return writeCgroupFile(filepath.Join(g.cpu, "cpu.cfs_quota_us"), quota)
}

// cfsQuotaUs is kubelet's milliCPUToQuota: the limit in millicores times
// the period, at least the kernel's minimum of 1 ms.
func cfsQuotaUs(cores float64) int64 {
	q := int64(cores*1000+0.5) * CFSPeriodUs / 1000
	return max(q, 1000)
}

func writeCgroupFile(p, v string) error {
	if err := os.WriteFile(p, []byte(v), 0); err != nil {
		return fmt.Errorf("writing %q to %s: %w", v, p, err)
	}
	return nil
}

// Join moves process pid, all its threads, into the cgroup.
func (g *Group) Join(pid int) error {
	for _, d := range g.dirs() {
		if err := writeCgroupFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// procsFiles are the cgroup.procs files to write to for joining.
func (g *Group) procsFiles() []string {
	var out []string
	for _, d := range g.dirs() {
		out = append(out, filepath.Join(d, "cgroup.procs"))
	}
	return out
}

// CPUSeconds is the CPU time the cgroup and its descendants have used.
func (g *Group) CPUSeconds() (float64, error) {
	if g.V2 {
		v, err := readKeyed(filepath.Join(g.cpuacct, "cpu.stat"), "usage_usec")
		return v / 1e6, err
	}
	raw, err := os.ReadFile(filepath.Join(g.cpuacct, "cpuacct.usage"))
	if err != nil {
		return 0, err
	}
	ns, err := strconv.ParseFloat(strings.TrimSpace(string(raw)), 64)
	return ns / 1e9, err
}

// Throttling returns the CFS periods in which the cgroup ran and those in
// which it used up its quota; the same keys on v1 and v2.
func (g *Group) Throttling() (periods, throttled float64, err error) {
	p := filepath.Join(g.cpu, "cpu.stat")
	if periods, err = readKeyed(p, "nr_periods"); err != nil {
		return 0, 0, err
	}
	throttled, err = readKeyed(p, "nr_throttled")
	return periods, throttled, err
}

// MemUsage is what the memory cgroup is charged, in bytes, and its
// split: anonymous memory, page cache, and the kernel's own (v1: the kmem
// counter, which holds no socket buffers unless a TCP limit is set; v2:
// memory.stat's kernel and sock).
type MemUsage struct{ Charge, Anon, File, Kernel float64 }

func (g *Group) MemUsage() (MemUsage, error) {
	var u MemUsage
	var err error
	stat := filepath.Join(g.Memory, "memory.stat")
	if g.V2 {
		if u.Charge, err = readNumber(filepath.Join(g.Memory, "memory.current")); err != nil {
			return u, err
		}
		kv, err := readKeyedAll(stat)
		if err != nil {
			return u, err
		}
		u.Anon, u.File, u.Kernel = kv["anon"], kv["file"], kv["kernel"]+kv["sock"]
		return u, nil
	}
	if u.Charge, err = readNumber(filepath.Join(g.Memory, "memory.usage_in_bytes")); err != nil {
		return u, err
	}
	kv, err := readKeyedAll(stat)
	if err != nil {
		return u, err
	}
	u.Anon, u.File = kv["rss"], kv["cache"]
	u.Kernel, err = readNumber(filepath.Join(g.Memory, "memory.kmem.usage_in_bytes"))
	return u, err
}

func readNumber(p string) (float64, error) {
	raw, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(strings.TrimSpace(string(raw)), 64)
}

func readKeyedAll(p string) (map[string]float64, error) {
	raw, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	return parseKeyed(raw), nil
}

// parseKeyed reads "key value" lines (cpu.stat, memory.stat).
func parseKeyed(raw []byte) map[string]float64 {
	kv := map[string]float64{}
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				kv[f[0]] = v
			}
		}
	}
	return kv
}

func readKeyed(p, key string) (float64, error) {
	kv, err := readKeyedAll(p)
	if err != nil {
		return 0, err
	}
	v, ok := kv[key]
	if !ok {
		return 0, fmt.Errorf("%s has no %s", p, key)
	}
	return v, nil
}

// Placement is where a process sits: its /proc/PID/cgroup paths by the
// controllers the benchmark moves it in ("" for v2).
type Placement map[string]string

// PlacementOf reads pid's placement from /proc/PID/cgroup.
func PlacementOf(pid int) (Placement, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil, err
	}
	return parseProcCgroup(raw), nil
}

func parseProcCgroup(raw []byte) Placement {
	pl := Placement{}
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			pl[""] = f[2]
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			pl[c] = f[2]
		}
	}
	return pl
}

// Restore moves pid back to where it was: in each hierarchy g moved it
// in, to the cgroup pl names.
func (f *FS) Restore(pid int, pl Placement, g *Group) error {
	var errs []error
	move := func(mount, ctrl string) {
		if p, ok := pl[ctrl]; ok {
			errs = append(errs, writeCgroupFile(filepath.Join(mount, p, "cgroup.procs"), strconv.Itoa(pid)))
		}
	}
	switch {
	case g.V2:
		move(f.V2, "")
	default:
		if g.cpu != "" {
			move(f.CPU, "cpu")
			if f.CPUAcct != f.CPU {
				move(f.CPUAcct, "cpuacct")
			}
		}
		if g.Memory != "" {
			move(f.Memory, "memory")
		}
	}
	return errors.Join(errs...)
}

// Mounts are the hierarchies the benchmark makes cgroups in, each once.
func (f *FS) Mounts() []string {
	var out []string
	for _, m := range []string{f.V2, f.CPU, f.CPUAcct, f.Memory} {
		if m != "" && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// Sweep removes every Prefix cgroup, this run's or a killed run's, and
// turns off the v2 controllers this run turned on. A process still in one
// goes to the hierarchy's root first: the benchmark's servers and stacks
// have ended or been moved back by then, and anything else is not ours to
// kill.
func (f *FS) Sweep() {
	for _, m := range f.Mounts() {
		dirs, _ := filepath.Glob(filepath.Join(m, Prefix+"*"))
		for _, d := range dirs {
			if err := RemoveTree(m, d); err != nil {
				runlog.Logf("cleanup: %v", err)
			}
		}
	}
	for _, c := range f.enabled {
		p := filepath.Join(f.V2, "cgroup.subtree_control")
		if err := os.WriteFile(p, []byte("-"+c), 0); err != nil {
			runlog.Logf("cleanup: turning the %s controller off again in %s: %v", c, p, err)
		}
	}
	f.enabled = nil
}

// RemoveTree removes cgroup dir of the hierarchy mounted at mount,
// children first.
func RemoveTree(mount, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := RemoveTree(mount, filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	for _, pid := range strings.Fields(string(raw)) {
		runlog.Logf("cleanup: process %s (%s) still in %s; moving it to the root cgroup", pid, runlog.Tail(procfs.Cmdline(atoi(pid)), 80), dir)
		_ = os.WriteFile(filepath.Join(mount, "cgroup.procs"), []byte(pid), 0)
	}
	// A process that just exited leaves its cgroup a moment later.
	for i := 0; ; i++ {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if i == 20 {
			return fmt.Errorf("removing cgroup %s: %w", dir, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
