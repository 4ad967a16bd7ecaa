package dataplane

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/test/nettest"
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

	// The plugin ran the stack from the small binary beside it; the
	// restart uses the multi-call binary's stack command, as the agent
	// does for an attachment recorded before the two were split.
	if want := filepath.Join(env.BinDir, "cni-usernet-stack"); att.StackBinary != want {
		t.Errorf("stack binary recorded: %s, want %s", att.StackBinary, want)
	}
	proc, err := launch.Start(launch.Options{
		Binary:       filepath.Join(env.BinDir, "cni-usernet"),
		Args:         []string{"stack", "--config", att.ConfigPath},
		Netns:        pod.NS.Path(),
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

// TestStackFromPluginAlone: on a node where only the plugin's binary was
// copied (no cni-usernet-stack beside it), ADD runs the stack from the
// plugin's own stack command and the pod works.
func TestStackFromPluginAlone(t *testing.T) {
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
	pod := env.NewPod(env.Conf(cniVersion, nil))
	nettest.ServeRemoteAddr(t, nettest.Listen(t, pod.NS, "tcp", ":8080"))
	if got := nettest.GetPeer(t, env.Node, pod.IP(4), 8080); got != pod.Gateway(4) {
		t.Fatalf("pod saw %s, want %s", got, pod.Gateway(4))
	}
	att, err := state.Store{Dir: filepath.Join(env.Dir, "state")}.Load(pod.ID, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "cni-usernet")
	if att.StackBinary != want {
		t.Errorf("stack binary recorded: %s, want %s", att.StackBinary, want)
	}
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", att.StackPID)); err != nil || exe != want {
		t.Errorf("stack process runs %s (%v), want %s", exe, err, want)
	}
}
