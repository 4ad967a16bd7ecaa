// SPDX-License-Identifier: Apache-2.0

package reliability

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/node/wirens"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// inPrivateMountNS sets cmd to start in a mount namespace of its own
// whose mounts are all private (Go's os/exec makes / rprivate after the
// unshare): what the process mounts stays there, and what is mounted
// elsewhere after it started never reaches it. A meta-plugin in a
// container (Multus thick), or `ip netns exec`, runs its delegates so.
func inPrivateMountNS(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
}

// execPrivate runs the plugin for command in the env's node namespace,
// in a new private mount namespace, as a meta-plugin runs a delegate.
func execPrivate(t *testing.T, env *nettest.Env, command string, conf []byte, pod *nettest.Pod) error {
	t.Helper()
	args := &invoke.Args{
		Command:       command,
		ContainerID:   pod.ID,
		NetNS:         pod.NS.Path(),
		IfName:        "eth0",
		Path:          env.BinDir,
		PluginArgsStr: "IgnoreUnknown=1;K8S_POD_NAMESPACE=test;K8S_POD_NAME=" + pod.ID,
	}
	cmd := exec.Command(filepath.Join(env.BinDir, "cni-usernet"))
	cmd.Env = args.AsEnv()
	cmd.Stdin = bytes.NewReader(conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	inPrivateMountNS(cmd)
	if err := nettest.In(env.Node, cmd.Run); err != nil {
		var cniErr types.Error
		if json.Unmarshal(stdout.Bytes(), &cniErr) == nil && cniErr.Msg != "" {
			return fmt.Errorf("%s: %w (stderr: %s)", command, &cniErr, stderr.Bytes())
		}
		return fmt.Errorf("%s: %w (stdout: %s, stderr: %s)", command, err, stdout.Bytes(), stderr.Bytes())
	}
	if command == "ADD" {
		r, err := nettest.ParseResult(conf, stdout.Bytes())
		if err != nil {
			return fmt.Errorf("ADD: %w", err)
		}
		pod.Result = r
	}
	return nil
}

// startPrivateAgent starts a node agent in a private mount namespace of
// its own, made after ADD (as a container's), which restarts stacks there
// (--mount-ns ""); it is stopped at cleanup.
func startPrivateAgent(t *testing.T, env *nettest.Env) {
	t.Helper()
	cmd := exec.Command(filepath.Join(env.BinDir, "cni-usernet-agent"),
		"--install=false",
		"--state-dir", filepath.Join(env.Dir, "state"),
		"--run-dir", filepath.Join(env.Dir, "agent"),
		"--cni-path", env.BinDir,
		"--mount-ns", "",
		"--reconcile-interval", "1s")
	var log nettest.LockedBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GORACE=" + os.Getenv("GORACE")}
	inPrivateMountNS(cmd)
	if err := nettest.In(env.Node, cmd.Start); err != nil {
		t.Fatalf("starting agent: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", log.String())
		}
	})
	ready := filepath.Join(env.Dir, "agent", "agent.ready")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			return
		}
		select {
		case <-done:
			t.Fatalf("agent exited before it was ready:\n%s", log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not ready after 20s:\n%s", log.String())
		}
	}
}

// TestPluginFromPrivateMountNamespaces calls the plugin as a meta-plugin
// calls its delegates: ADD, CHECK, a stack restart by an agent, CHECK
// again and DEL, each from a different private mount namespace. The wire
// namespace's pin must be where every later caller sees it: CHECK finds
// it, the agent restarts the stack in it, and DEL takes it away on the
// node (in the test's mount namespace, which stands for the node's: this
// machine's PID 1 may not let its namespaces be opened, so the conflist
// names the node's mount namespace).
func TestPluginFromPrivateMountNamespaces(t *testing.T) {
	env := nettest.NewEnv(t)
	t.Cleanup(func() { env.AssertNoLeaks(t) })
	conf := env.Conf("1.0.0", map[string]any{"mountNS": fmt.Sprintf("/proc/%d/ns/mnt", os.Getpid())})

	// The harness first: a process started so is in another mount
	// namespace, with no shared mount.
	probe := exec.Command("cat", "/proc/self/mountinfo")
	var mountinfo bytes.Buffer
	probe.Stdout = &mountinfo
	inPrivateMountNS(probe)
	if err := probe.Run(); err != nil {
		t.Fatalf("starting a process in a private mount namespace: %v", err)
	}
	if strings.Contains(mountinfo.String(), " shared:") {
		t.Fatalf("a private mount namespace has shared mounts:\n%s", mountinfo.String())
	}

	pod := &nettest.Pod{ID: fmt.Sprintf("mntns-%d", time.Now().UnixNano()%100000), NS: nettest.NewNS(t), Conf: conf}
	if err := execPrivate(t, env, "ADD", conf, pod); err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			if err := env.Del(conf, pod.ID, pod.NS); err != nil {
				t.Errorf("cleanup DEL: %v", err)
			}
		}
	})
	pin := wirens.Path(env.NetnsDir(), state.Key(pod.ID, "eth0"))
	if !wirens.Exists(pin) {
		t.Errorf("after ADD from a private mount namespace the node sees no wire namespace pinned at %s", pin)
	}
	// The stack too lives in the node's mount namespace, not in a view
	// of the node that goes with its caller.
	own, _ := os.Stat("/proc/self/ns/mnt")
	first := stackOf(t, env, pod)
	if st, err := os.Stat(fmt.Sprintf("/proc/%d/ns/mnt", first.PID)); err != nil || !os.SameFile(own, st) {
		t.Errorf("the stack started by ADD is not in the node's mount namespace (%v)", err)
	}
	checkConf := nettest.WithPrevResult(t, conf, pod.Result)
	if err := execPrivate(t, env, "CHECK", checkConf, pod); err != nil {
		t.Fatalf("CHECK from another private mount namespace: %v", err)
	}
	echoServer(t, env.Node, 7000)
	node := nettest.HostPort(pod.Gateway(4), 7000)
	if err := roundTrip(pod.NS, node); err != nil {
		t.Fatalf("pod to node after ADD: %v", err)
	}

	startPrivateAgent(t, env)
	old := stackOf(t, env, pod)
	if err := syscall.Kill(old.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the stack: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		now := lockedStackOf(t, env, pod)
		if now != old && launch.Alive(now) && roundTrip(pod.NS, node) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent in a private mount namespace did not restart the stack within 10 s (state names %+v, killed %+v)", now, old)
		}
	}
	if err := execPrivate(t, env, "CHECK", checkConf, pod); err != nil {
		t.Fatalf("CHECK after the restart, from another private mount namespace: %v", err)
	}

	if err := execPrivate(t, env, "DEL", conf, pod); err != nil {
		t.Fatalf("DEL from another private mount namespace: %v", err)
	}
	deleted = true
	if _, err := os.Lstat(pin); err == nil || wirens.Exists(pin) {
		t.Errorf("after DEL from a private mount namespace the node still has %s (pinned: %v)", pin, wirens.Exists(pin))
	}
}
