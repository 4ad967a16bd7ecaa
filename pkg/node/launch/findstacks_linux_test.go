// SPDX-License-Identifier: Apache-2.0

package launch

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// fakeStackEnv makes the test binary a process that only sleeps, whatever
// its arguments: a command line anyone could give a process.
const fakeStackEnv = "LAUNCH_TEST_FAKE_STACK"

func TestMain(m *testing.M) {
	if os.Getenv(fakeStackEnv) != "" {
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestFindStacksIgnoresOtherMountNamespaces: a process whose command line
// is a stack's is found when it runs where stacks run, and not when it
// runs in a mount namespace of its own, as every container's processes
// do (they show in the node's /proc all the same).
func TestFindStacksIgnoresOtherMountNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a mount namespace)")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	start := func(key string, ownMountNS bool) Process {
		t.Helper()
		cmd := &exec.Cmd{
			Path: self,
			Args: append([]string{"cni-usernet-stack"}, StackArgs(filepath.Join(dir, key, "config.json"))...),
			Env:  []string{fakeStackEnv + "=1"},
		}
		if ownMountNS {
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		st, err := StartTime(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		return Process{PID: cmd.Process.Pid, StartTime: st}
	}
	node := start("node", false)
	pod := start("pod", true)

	found := map[int]bool{}
	for _, s := range FindStacks(dir) {
		found[s.PID] = true
	}
	if !found[node.PID] {
		t.Errorf("FindStacks: the stack-like process in the node's mount namespace (%d) not found, want it", node.PID)
	}
	if found[pod.PID] {
		t.Errorf("FindStacks: found the stack-like process in a mount namespace of its own (%d), want it ignored", pod.PID)
	}
	if got := Find(StackArgs(filepath.Join(dir, "pod", "config.json"))...); len(got) != 0 {
		t.Errorf("Find of the pod's imitation: got %v, want none", got)
	}
	if got := Find(StackArgs(filepath.Join(dir, "node", "config.json"))...); len(got) != 1 || got[0].PID != node.PID {
		t.Errorf("Find in the node's mount namespace: got %v, want [%d]", got, node.PID)
	}
}
