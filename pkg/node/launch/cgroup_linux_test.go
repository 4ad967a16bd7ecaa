package launch

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"
	"golang.org/x/sys/unix"
)

// fakeCgroups makes each rel a cgroup (a directory with an empty
// cgroup.procs) under root.
func fakeCgroups(t *testing.T, root string, rels ...string) {
	t.Helper()
	for _, rel := range rels {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "cgroup.procs"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func procsOf(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestJoinCgroupV2: on a unified hierarchy the path is one write, under
// the root given; a cgroup that is not there is an error naming it.
func TestJoinCgroupV2(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fakeCgroups(t, root, "kubepods/burstable/podu/cni-usernet")
	if err := joinCgroup(4242, root, "/kubepods/burstable/podu/cni-usernet"); err != nil {
		t.Fatal(err)
	}
	if got := procsOf(t, filepath.Join(root, "kubepods/burstable/podu/cni-usernet")); got != "4242" {
		t.Errorf("cgroup.procs: got %q, want 4242", got)
	}
	err := joinCgroup(4242, root, "kubepods/besteffort/podu")
	if err == nil || !strings.Contains(err.Error(), filepath.Join(root, "kubepods/besteffort/podu/cgroup.procs")) {
		t.Errorf("joining a missing cgroup: got %v, want an error naming it", err)
	}
}

// TestJoinCgroupV1: on v1 every hierarchy that has the path is joined,
// the others are skipped, and none at all is an error.
func TestJoinCgroupV1(t *testing.T) {
	root := t.TempDir()
	fakeCgroups(t, root, "cpu,cpuacct/kubepods/podu", "memory/kubepods/podu", "pids/kubepods")
	if err := os.Symlink("cpu,cpuacct", filepath.Join(root, "cpu")); err != nil {
		t.Fatal(err)
	}
	// Not a hierarchy: a file at the mount's top level.
	if err := os.WriteFile(filepath.Join(root, "README"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := joinCgroup(4242, root, "kubepods/podu"); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"cpu,cpuacct", "memory"} {
		if got := procsOf(t, filepath.Join(root, h, "kubepods/podu")); got != "4242" {
			t.Errorf("%s: cgroup.procs: got %q, want 4242", h, got)
		}
	}
	if got := procsOf(t, filepath.Join(root, "pids/kubepods")); got != "" {
		t.Errorf("pids/kubepods: cgroup.procs: got %q, want it untouched", got)
	}
	if err := joinCgroup(4242, root, "kubepods/podv"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("joining a cgroup no hierarchy has: got %v, want not found", err)
	}
}

// startSleeper starts a process through Start that reports ready and
// sleeps, and stops and reaps it at cleanup.
func startSleeper(t *testing.T, o Options) Process {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespace, lowering oom_score_adj)")
	}
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		netns.Close()
		testutils.UnmountNS(netns)
	})
	o.Binary = "/bin/sh"
	o.Args = []string{"-c", "echo ok >&3; exec sleep 60"}
	o.Netns = netns.Path()
	o.LogPath = filepath.Join(t.TempDir(), "stack.log")
	o.ReadyTimeout = 5 * time.Second
	p, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Stop(p, time.Second); err != nil {
			t.Error(err)
		}
		// Start released it, but it is still this process's child.
		syscall.Wait4(p.PID, nil, 0, nil)
	})
	return p
}

func oomScoreAdj(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/oom_score_adj")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// hasCap reports whether this process has capability c in effect.
func hasCap(t *testing.T, c uint) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			eff, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return eff&(1<<c) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}

// TestStartOOMScoreAdj: a started stack has StackOOMScoreAdj unless
// Options says otherwise, whatever its launcher has. Lowering it takes
// CAP_SYS_RESOURCE (which a runtime and the privileged node agent have);
// without it the stack still starts, with a Warning that says so.
func TestStartOOMScoreAdj(t *testing.T) {
	own := oomScoreAdj(t, os.Getpid())
	canLower := hasCap(t, unix.CAP_SYS_RESOURCE)
	for _, c := range []struct {
		set, want int
	}{{0, StackOOMScoreAdj}, {500, 500}, {-1000, -1000}} {
		p := startSleeper(t, Options{OOMScoreAdj: c.set})
		got := oomScoreAdj(t, p.PID)
		if c.want < own && !canLower {
			t.Logf("OOMScoreAdj %d: no CAP_SYS_RESOURCE here to lower it from %d", c.set, own)
			if p.Warning == nil || !strings.Contains(p.Warning.Error(), "oom_score_adj") || got != own {
				t.Errorf("OOMScoreAdj %d without CAP_SYS_RESOURCE: got adj %d, warning %v, want %d and a warning", c.set, got, p.Warning, own)
			}
			continue
		}
		if p.Warning != nil {
			t.Errorf("OOMScoreAdj %d: warning %v", c.set, p.Warning)
		}
		if got != c.want {
			t.Errorf("OOMScoreAdj %d: /proc/%d/oom_score_adj is %d, want %d", c.set, p.PID, got, c.want)
		}
	}
	// Below what the launcher has, down to its floor, needs no
	// capability: the write is checked where every machine can.
	setOwn := func(adj int) {
		if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(adj)), 0); err != nil {
			t.Fatal(err)
		}
	}
	if own > 1000-200 {
		return
	}
	setOwn(own + 200)
	t.Cleanup(func() { setOwn(own) })
	p := startSleeper(t, Options{OOMScoreAdj: own + 100})
	if got := oomScoreAdj(t, p.PID); got != own+100 || p.Warning != nil {
		t.Errorf("launcher at %d, OOMScoreAdj %d: got %d, warning %v", own+200, own+100, got, p.Warning)
	}
}
