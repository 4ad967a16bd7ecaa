package dataplane

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestStackRestartsFromSpec kills a pod's stack and starts a new one with
// the same configuration, as a supervisor would: the kernel no longer holds
// the pod's addresses, so the new stack must come back from its spec, and
// the pod serves again.
func TestStackRestartsFromSpec(t *testing.T) {
	env, pod := newPod(t, nil)
	nettest.ServeRemoteAddr(t, nettest.Listen(t, pod.NS, "tcp", ":8080"))
	if got := nettest.GetPeer(t, env.Node, pod.IP(4), 8080); got != pod.Gateway(4) {
		t.Fatalf("before restart: pod saw %s, want %s", got, pod.Gateway(4))
	}
	store := state.Store{Dir: filepath.Join(env.Dir, "state")}
	att, err := store.Load(pod.ID, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	old := launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}
	if err := syscall.Kill(old.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); launch.Alive(old); {
		if time.Now().After(deadline) {
			t.Fatal("killed stack still alive")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := nettest.Dial(env.Node, "tcp", nettest.HostPort(pod.IP(4), 8080), 500*time.Millisecond); err == nil {
		t.Fatal("pod still reachable with its stack dead")
	}

	// The plugin ran the stack from the stack's binary beside it; the
	// restart uses what the record says, as the agent does.
	if want := filepath.Join(env.BinDir, "cni-usernet-stack"); att.StackBinary != want {
		t.Errorf("stack binary recorded: %s, want %s", att.StackBinary, want)
	}
	proc, err := launch.Start(launch.Options{
		Binary:       att.StackBinary,
		Args:         launch.StackArgs(att.ConfigPath),
		Netns:        pod.NS.Path(),
		WireNetns:    att.WireNetns,
		LogPath:      att.LogPath,
		ReadyTimeout: 20 * time.Second,
	})
	if err != nil {
		t.Fatalf("restarting the stack: %v", err)
	}
	// DEL must stop the new stack, not look for the dead one.
	att.StackPID, att.StackStartTime = proc.PID, proc.StartTime
	if err := store.Save(att); err != nil {
		t.Fatal(err)
	}
	for _, fam := range []int{4, 6} {
		if got := nettest.GetPeer(t, env.Node, pod.IP(fam), 8080); got != pod.Gateway(fam) {
			t.Errorf("after restart, IPv%d: pod saw %s, want %s", fam, got, pod.Gateway(fam))
		}
	}
	nettest.ServeRemoteAddr(t, nettest.Listen(t, env.Node, "tcp", ":8081"))
	if got := nettest.GetPeer(t, pod.NS, pod.Gateway(4), 8081); got != pod.IP(4) {
		t.Errorf("after restart, pod→node: node saw %s, want %s", got, pod.IP(4))
	}
}

// TestADDWithoutStackBinary: on a node where only the plugin's binary was
// copied (no cni-usernet-stack beside it), ADD fails with an error that
// names the missing file, and leaves nothing behind: the plugin's binary
// carries no stack to fall back on.
func TestADDWithoutStackBinary(t *testing.T) {
	env := nettest.NewEnv(t)
	dir := t.TempDir()
	for _, name := range []string{"cni-usernet", "host-local", "ptp"} {
		b, err := os.ReadFile(filepath.Join(env.BinDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env.BinDir = dir
	conf := env.Conf(cniVersion, nil)
	netns := nettest.NewNS(t)
	_, err := env.Add(conf, "no-stack-binary", netns)
	if err == nil {
		t.Fatal("ADD succeeded without cni-usernet-stack")
	}
	if !strings.Contains(err.Error(), "cni-usernet-stack") {
		t.Errorf("ADD's error does not name the missing binary: %v", err)
	}
	// ADD undid its own work; the runtime's DEL that follows still works.
	env.AssertNoLeaks(t)
	if err := env.Del(conf, "no-stack-binary", netns); err != nil {
		t.Errorf("DEL after the failed ADD: %v", err)
	}
}
