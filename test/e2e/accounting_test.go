package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// cgroupRoot is where the node's cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// stackCgroupOf reads the cgroup of pid in the hierarchy that accounts
// CPU: "cpu,cpuacct" (or "cpu") on cgroup v1, the unified one on v2. It
// returns the directory under cgroupRoot and whether it is v2.
func stackCgroupOf(pid int) (dir string, v2 bool, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", false, err
	}
	var unified string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "cpuacct" {
				return filepath.Join(cgroupRoot, parts[1], parts[2]), false, nil
			}
		}
		if parts[1] == "" {
			unified = parts[2]
		}
	}
	if unified == "" {
		return "", false, fmt.Errorf("/proc/%d/cgroup names no CPU hierarchy:\n%s", pid, b)
	}
	return filepath.Join(cgroupRoot, unified), true, nil
}

// podCgroupDir walks up from dir to the pod-level cgroup of the pod with
// uid (cgroupfs "pod<uid>", systemd "...-pod<uid_with_underscores>.slice").
func podCgroupDir(dir, uid string) (string, error) {
	for d := dir; d != cgroupRoot && d != "/" && d != "."; d = filepath.Dir(d) {
		b := filepath.Base(d)
		if b == "pod"+uid || strings.HasSuffix(b, "-pod"+strings.ReplaceAll(uid, "-", "_")+".slice") {
			return d, nil
		}
	}
	return "", fmt.Errorf("%s is not under the cgroup of pod %s", dir, uid)
}

// checkStacksInPodCgroups: the stack of every pod named is in that pod's
// cgroup, in every hierarchy that accounts CPU and memory.
func checkStacksInPodCgroups(t *testing.T, ns string, names []string) {
	t.Helper()
	st := nodeStatus(t)
	for _, name := range names {
		pid := st[ns+"/"+name].PID
		uid := getPod(t, ns, name).Metadata.UID
		dir, _, err := stackCgroupOf(pid)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if _, err := podCgroupDir(dir, uid); err != nil {
			t.Errorf("%s: stack %d: %v", name, pid, err)
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); err == nil {
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				if strings.Contains(line, ":memory:") && !strings.Contains(line, uid) && !strings.Contains(line, strings.ReplaceAll(uid, "-", "_")) {
					t.Errorf("%s: stack %d's memory cgroup is not its pod's: %s", name, pid, line)
				}
			}
		}
	}
}

// cgroupCPU is the CPU time a cgroup has used.
func cgroupCPU(dir string, v2 bool) (time.Duration, error) {
	if v2 {
		b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				us, err := strconv.ParseInt(v, 10, 64)
				return time.Duration(us) * time.Microsecond, err
			}
		}
		return 0, fmt.Errorf("%s/cpu.stat has no usage_usec", dir)
	}
	b, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage"))
	if err != nil {
		return 0, err
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return time.Duration(ns), err
}

// checkStackCharged: a pod limited to 100m of CPU serves HTTP under ab
// from the node for 15 s. Its stack's CPU is counted in the pod's cgroup
// (the pod's usage covers the stack's), and the pod with its stack stays
// within the limit.
func checkStackCharged(t *testing.T, ns string) {
	if _, err := exec.LookPath("ab"); err != nil {
		t.Skip("needs ab (apache2-utils)")
	}
	m := podManifest(ns, "lim", "")
	m = strings.Replace(m, "    args: [serve]\n", "    args: [serve]\n    resources: {limits: {cpu: 100m, memory: 64Mi}}\n", 1)
	apply(t, m)
	deletePodsAfter(t, ns, "lim")
	mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/lim", "--timeout=3m")
	p := getPod(t, ns, "lim")
	pid := nodeStatus(t)[ns+"/lim"].PID
	dir, v2, err := stackCgroupOf(pid)
	if err != nil {
		t.Fatal(err)
	}
	podDir, err := podCgroupDir(dir, p.Metadata.UID)
	if err != nil {
		t.Fatalf("lim's stack %d: %v", pid, err)
	}
	podBefore, err := cgroupCPU(podDir, v2)
	if err != nil {
		t.Fatal(err)
	}
	stackBefore := nettest.StackCPU(pid)
	start := time.Now()
	const seconds = 15
	out, err := exec.Command("ab", "-q", "-t", strconv.Itoa(seconds), "-n", "10000000", "-c", "8", "-s", "10",
		"http://"+net.JoinHostPort(p.Status.PodIP, "8080")+"/").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "Complete requests") {
		t.Fatalf("ab: %v\n%s", err, out)
	}
	elapsed := time.Since(start)
	podAfter, err := cgroupCPU(podDir, v2)
	if err != nil {
		t.Fatal(err)
	}
	stack, pod := nettest.StackCPU(pid)-stackBefore, podAfter-podBefore
	t.Logf("%s over %s: the pod's cgroup used %s of CPU (%.1f %% of a core), its stack %s of it; ab: %s",
		podDir, elapsed.Round(time.Millisecond), pod, 100*pod.Seconds()/elapsed.Seconds(), stack, abSummary(string(out)))
	if stack <= 0 {
		t.Errorf("the stack used no CPU under load: nothing measured")
	}
	// USER_HZ ticks against nanoseconds: a tick of slack.
	if pod+10*time.Millisecond < stack {
		t.Errorf("the pod's cgroup used %s, less than its stack's %s: the stack is not charged to the pod", pod, stack)
	}
	if limit := 0.1 * elapsed.Seconds() * 1.25; pod.Seconds() > limit {
		t.Errorf("the pod used %s of CPU in %s, over its 100m limit (+25 %%: %.2f s)", pod, elapsed.Round(time.Millisecond), limit)
	}
}

func abSummary(out string) string {
	var keep []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "Complete requests") || strings.HasPrefix(line, "Requests per second") || strings.HasPrefix(line, "Failed requests") {
			keep = append(keep, strings.Join(strings.Fields(line), " "))
		}
	}
	return strings.Join(keep, "; ")
}
