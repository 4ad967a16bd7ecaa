package cni_test

// Root tests of DEL of an attachment never added, or whose record is
// lost: DEL undoes what it can find from its arguments and succeeds.

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestDelWithoutAdd checks that DEL of a pod never added succeeds, also
// when the namespace is gone or not given, and creates nothing.
func TestDelWithoutAdd(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	gone := nettest.NewNS(t)
	gonePath := gone.Path()
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	if err := unmount(gonePath); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, netns string }{
		{"netns exists", nettest.NewNS(t).Path()},
		{"netns gone", gonePath},
		{"netns never existed", "/var/run/netns/cni-usernet-test-never-made"},
		{"no CNI_NETNS", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			for i := range 2 {
				if _, err := env.ExecNetns("cni-usernet", "DEL", conf, "never-added", c.netns, "eth0"); err != nil {
					t.Errorf("DEL %d: got %v, want success", i+1, err)
				}
			}
			env.AssertNoLeaks(t)
		})
	}
}

// unmount removes a namespace's bind mount and its file, as a runtime
// does when the sandbox is gone.
func unmount(path string) error {
	if err := syscall.Unmount(path, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting %s: %w", path, err)
	}
	return os.Remove(path)
}

// TestDelWithoutStateWithPrevResult loses the state file of a standalone
// attachment (its stack already dead) and runs DEL the way runtimes do
// since 0.4.0, with the ADD result as prevResult: DEL must recognise its
// own result, not mistake it for an earlier plugin's, and remove the veth
// and the lease.
func TestDelWithoutStateWithPrevResult(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	pod := env.NewPod(conf)
	att := loadState(t, env, pod.ID)
	if err := launch.Stop(launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}, 10*time.Second); err != nil {
		t.Fatalf("stopping stack %d: %v", att.StackPID, err)
	}
	if err := (state.Store{Dir: filepath.Join(env.Dir, "state")}).Delete(pod.ID, "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := env.Del(nettest.WithPrevResult(t, conf, pod.Result), pod.ID, pod.NS); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	env.AssertNoLeaks(t)
	assertNSClean(t, pod.NS)
}

// TestDelWithLostStateStopsStack: the state file is gone but the stack
// still runs; DEL finds it by its config path and stops it.
func TestDelWithLostStateStopsStack(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	pod := env.NewPod(conf)
	att := loadState(t, env, pod.ID)
	if err := (state.Store{Dir: filepath.Join(env.Dir, "state")}).Delete(pod.ID, "eth0"); err != nil {
		t.Fatal(err)
	}
	if err := env.Del(conf, pod.ID, pod.NS); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if launch.Alive(launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}) {
		t.Errorf("stack %d still running after DEL without state", att.StackPID)
	}
	env.AssertNoLeaks(t)
	assertNSClean(t, pod.NS)
}
