// Package reliability holds the root tests of the reliability guarantees: a
// pod never loses its network (supervision, reconcile), and the node is
// left as it was whatever happens.
package reliability

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// startAgent runs the node agent on the env, reconciling every second.
func startAgent(t *testing.T, env *nettest.Env, extra ...string) *nettest.Agent {
	t.Helper()
	return env.StartAgent(t, append([]string{"--reconcile-interval", "1s"}, extra...)...)
}

func newEnvPod(t *testing.T, extra map[string]any) (*nettest.Env, *nettest.Pod) {
	env := nettest.NewEnv(t)
	t.Cleanup(func() { env.AssertNoLeaks(t) })
	return env, env.NewPod(env.Conf("1.0.0", extra))
}

func loadAtt(t *testing.T, env *nettest.Env, pod *nettest.Pod) *state.Attachment {
	t.Helper()
	att, err := state.Store{Dir: filepath.Join(env.Dir, "state")}.Load(pod.ID, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	return att
}

func stackOf(t *testing.T, env *nettest.Env, pod *nettest.Pod) launch.Process {
	att := loadAtt(t, env, pod)
	return launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}
}

// lockedStackOf is stackOf read under the attachment's lock, as CHECK
// reads the state: never between a restarted stack's start and the
// agent's record of it.
func lockedStackOf(t *testing.T, env *nettest.Env, pod *nettest.Pod) launch.Process {
	t.Helper()
	store := state.Store{Dir: filepath.Join(env.Dir, "state")}
	lock, err := store.Lock(pod.ID, "eth0", 30*time.Second)
	if err != nil {
		t.Fatalf("locking the attachment: %v", err)
	}
	defer lock.Release()
	att, err := store.Load(pod.ID, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	return launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}
}

// echoServer answers every connection by sending back what it reads.
func echoServer(t *testing.T, netns ns.NetNS, port int) {
	nettest.Serve(nettest.Listen(t, netns, "tcp", fmt.Sprintf(":%d", port)), nettest.Echo)
}

// roundTrip opens a new connection and checks one echo.
func roundTrip(netns ns.NetNS, addr string) error {
	c, err := nettest.Dial(netns, "tcp", addr, 500*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	msg := []byte("hello through the stack\n")
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return nil
}

// sinkServer hashes everything a connection sends and reports the sum.
func sinkServer(t *testing.T, netns ns.NetNS, port int) <-chan [32]byte {
	ln := nettest.Listen(t, netns, "tcp", fmt.Sprintf(":%d", port))
	sums := make(chan [32]byte, 16)
	nettest.Serve(ln, func(c net.Conn) {
		if _, sum, err := nettest.ReceiveHashed(c); err == nil {
			sums <- sum
		}
	})
	return sums
}

// send writes n pseudo-random bytes to addr from netns, calling mid after
// half of them, and returns their hash.
func send(netns ns.NetNS, addr string, n int64, mid func()) ([32]byte, error) {
	var sum [32]byte
	c, err := nettest.Dial(netns, "tcp", addr, 2*time.Second)
	if err != nil {
		return sum, err
	}
	defer c.Close()
	h := sha256.New()
	buf := make([]byte, 64<<10)
	var seed uint64 = 0x9e3779b97f4a7c15
	var sent int64
	midDone := false
	for sent < n {
		for i := 0; i+8 <= len(buf); i += 8 {
			seed ^= seed << 13
			seed ^= seed >> 7
			seed ^= seed << 17
			for j := 0; j < 8; j++ {
				buf[i+j] = byte(seed >> (8 * j))
			}
		}
		chunk := buf[:min(int64(len(buf)), n-sent)]
		c.SetWriteDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Write(chunk); err != nil {
			return sum, fmt.Errorf("after %d bytes: %w", sent, err)
		}
		h.Write(chunk)
		sent += int64(len(chunk))
		if !midDone && sent >= n/2 && mid != nil {
			midDone = true
			mid()
		}
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	copy(sum[:], h.Sum(nil))
	return sum, nil
}

// TestKilledStackIsRestarted kills a pod's stack in the middle of a
// transfer (SIGKILL, and SIGQUIT which ends a Go program like a panic
// does): the agent restarts it from its spec and the pod opens new
// connections again within 5 s, byte-exact.
func TestKilledStackIsRestarted(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGQUIT} {
		t.Run(sig.String(), func(t *testing.T) {
			env, pod := newEnvPod(t, nil)
			startAgent(t, env)
			echoServer(t, env.Node, 7000)
			sums := sinkServer(t, env.Node, 7001)
			node := nettest.HostPort(pod.Gateway(4), 7000)
			old := stackOf(t, env, pod)

			var killedAt time.Time
			_, err := send(pod.NS, nettest.HostPort(pod.Gateway(4), 7001), 64<<20, func() {
				killedAt = time.Now()
				if err := syscall.Kill(old.PID, sig); err != nil {
					t.Errorf("killing stack: %v", err)
				}
			})
			t.Logf("transfer cut by %s: %v", sig, err)
			var back time.Duration
			for {
				if err := roundTrip(pod.NS, node); err == nil {
					back = time.Since(killedAt)
					break
				}
				if time.Since(killedAt) > 5*time.Second {
					t.Fatalf("pod cannot open connections %s after its stack was killed", time.Since(killedAt))
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("new connections work %s after %s", back.Round(time.Millisecond), sig)
			// The new stack serves before the agent records it (it holds
			// the attachment's lock from the start until the state names
			// the new stack, docs/RELIABILITY.md); under the lock, as
			// CHECK reads it, the state names the new stack.
			now := lockedStackOf(t, env, pod)
			if now == old || !launch.Alive(now) {
				t.Fatalf("state names stack %+v, killed %+v", now, old)
			}
			want, err := send(pod.NS, nettest.HostPort(pod.Gateway(4), 7001), 32<<20, nil)
			if err != nil {
				t.Fatalf("transfer after restart: %v", err)
			}
			for {
				select {
				case got := <-sums:
					if got == want {
						goto checked
					}
				case <-time.After(20 * time.Second):
					t.Fatal("transfer after restart did not arrive byte-exact")
				}
			}
		checked:
			att := loadAtt(t, env, pod)
			if att.Supervision == nil || att.Supervision.Restarts != 1 || att.Supervision.Crashes != 1 {
				t.Fatalf("supervision record %+v, want 1 restart, 1 crash", att.Supervision)
			}
			if err := env.Check(pod.Conf, pod.ID, pod.NS); err != nil {
				t.Fatalf("CHECK after restart: %v", err)
			}
		})
	}
}

// TestAgentRestartKeepsTransfers restarts the agent (SIGTERM, then
// SIGKILL) in the middle of transfers: the stacks are not the agent's
// children to lose, so both transfers complete byte-exact with the same
// stack process.
func TestAgentRestartKeepsTransfers(t *testing.T) {
	env, pod := newEnvPod(t, nil)
	agent := startAgent(t, env)
	sums := sinkServer(t, env.Node, 7001)
	addr := nettest.HostPort(pod.Gateway(4), 7001)
	before := stackOf(t, env, pod)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		want, err := send(pod.NS, addr, 128<<20, func() {
			agent.Stop(sig)
			agent.Start()
		})
		if err != nil {
			t.Fatalf("transfer across an agent %s: %v", sig, err)
		}
		select {
		case got := <-sums:
			if got != want {
				t.Fatalf("transfer across an agent %s arrived corrupted", sig)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("transfer across an agent %s did not arrive", sig)
		}
	}
	if after := stackOf(t, env, pod); after != before || !launch.Alive(after) {
		t.Fatalf("stack changed from %+v to %+v across agent restarts", before, after)
	}
}

// TestReconcileReclaimsDeletedNetns deletes a pod's namespace behind the
// plugin's back (a runtime that lost the pod, no DEL, no GC): the agent
// removes its stack, veth, lease and state.
func TestReconcileReclaimsDeletedNetns(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf("1.0.0", nil)
	// A pod the test deletes by hand: its namespace is not NewPod's.
	podNS, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Add(conf, "lost-pod", podNS); err != nil {
		t.Fatal(err)
	}
	keep := env.NewPod(conf)
	startAgent(t, env)
	stack := launch.Process{}
	if att, err := (state.Store{Dir: filepath.Join(env.Dir, "state")}).Load("lost-pod", "eth0"); err == nil {
		stack = launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}
	}
	// The stack holds the namespace open; killing it and unmounting the
	// namespace is what a node reboot or a runtime crash leaves.
	syscall.Kill(stack.PID, syscall.SIGKILL)
	loseNetns(t, podNS)
	lostVeth := hostVeth("lost-pod")
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, stErr := (state.Store{Dir: filepath.Join(env.Dir, "state")}).Load("lost-pod", "eth0")
		leaks := env.Leaks()
		nLeases, vethLeft := 0, false
		for _, l := range leaks {
			nLeases += strings.Count(l, "lease ")
			vethLeft = vethLeft || l == "link "+lostVeth
		}
		if errors.Is(stErr, state.ErrNotFound) && nLeases == 2 && !vethLeft && !launch.Alive(stack) && len(env.StackPIDs()) == 1 {
			break // only the kept pod's two leases (v4, v6) and stack remain
		}
		if time.Now().After(deadline) {
			t.Fatalf("not reclaimed after 15s: leaks %v, state err %v, stacks %v", leaks, stErr, env.StackPIDs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The other pod is untouched.
	if err := env.Check(keep.Conf, keep.ID, keep.NS); err != nil {
		t.Fatalf("CHECK of the other pod: %v", err)
	}
	env.Del(keep.Conf, keep.ID, keep.NS)
	env.AssertNoLeaks(t)
}

// TestCrashLoopBacksOffAndIsReported kills a stack every time it comes
// back: the agent backs off instead of looping hot, CHECK fails with the
// reason and status shows it; once the stack is left alone it runs again
// and the record clears after it has been stable.
func TestCrashLoopBacksOffAndIsReported(t *testing.T) {
	env, pod := newEnvPod(t, nil)
	startAgent(t, env, "--restart-backoff", "200ms", "--crash-loop-after", "3", "--stable-after", "3s")
	var restarts []time.Time
	last := stackOf(t, env, pod)
	for i := 0; i < 4; i++ {
		syscall.Kill(last.PID, syscall.SIGKILL)
		deadline := time.Now().Add(10 * time.Second)
		for {
			p := stackOf(t, env, pod)
			if p != last && launch.Alive(p) {
				restarts = append(restarts, time.Now())
				last = p
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("stack not restarted after kill %d", i+1)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if i == 2 {
			// Third quick death: reported, though running again.
			err := env.Check(pod.Conf, pod.ID, pod.NS)
			if err == nil || !strings.Contains(err.Error(), "crash loop") {
				t.Fatalf("CHECK in a crash loop: %v, want a crash loop error", err)
			}
			out, err := exec.Command(filepath.Join(env.BinDir, "cni-usernet"), "status", "--json", "--state-dir", filepath.Join(env.Dir, "state")).Output()
			if err != nil {
				t.Fatalf("status: %v", err)
			}
			var rows []struct {
				ContainerID string `json:"containerID"`
				Healthy     bool   `json:"healthy"`
				Problem     string `json:"problem"`
			}
			if err := json.Unmarshal(out, &rows); err != nil {
				t.Fatalf("status JSON: %v\n%s", err, out)
			}
			if len(rows) != 1 || rows[0].Healthy || !strings.Contains(rows[0].Problem, "crash loop") {
				t.Fatalf("status in a crash loop: %s", out)
			}
		}
	}
	// Backoff: 0, 200ms, 400ms between the deaths and the restarts.
	if gap := restarts[3].Sub(restarts[2]); gap < 400*time.Millisecond {
		t.Errorf("fourth restart %s after the third: no backoff", gap)
	}
	// Left alone, it serves, and after stable-after it is healthy again.
	echoServer(t, env.Node, 7000)
	if err := roundTrip(pod.NS, nettest.HostPort(pod.Gateway(4), 7000)); err != nil {
		t.Fatalf("restarted stack does not serve: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for env.Check(pod.Conf, pod.ID, pod.NS) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("still unhealthy after running stably: %v", env.Check(pod.Conf, pod.ID, pod.NS))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func hostVeth(containerID string) string {
	return "usn" + state.Key(containerID, "eth0")[:12]
}

// TestReconcileLeftovers: a stack directory nobody uses (a plugin killed
// mid-ADD long ago) is removed; a stack whose state file was lost keeps
// serving its pod (the agent cannot know the pod is gone), and the
// runtime's DEL, which finds it by its config path, still removes all.
func TestReconcileLeftovers(t *testing.T) {
	env, pod := newEnvPod(t, nil)
	stale := filepath.Join(env.Dir, "state", "stacks", "00000000deadbeef")
	if err := os.MkdirAll(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "config.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	stack := stackOf(t, env, pod)
	stateFile := filepath.Join(env.Dir, "state", state.Key(pod.ID, "eth0")+".json")
	if err := os.Remove(stateFile); err != nil {
		t.Fatal(err)
	}
	startAgent(t, env)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(stale); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("unused stack directory not removed")
		}
	}
	time.Sleep(1500 * time.Millisecond) // another reconcile pass
	if !launch.Alive(stack) {
		t.Fatal("the agent stopped a stack whose state was lost")
	}
	echoServer(t, env.Node, 7000)
	if err := roundTrip(pod.NS, nettest.HostPort(pod.Gateway(4), 7000)); err != nil {
		t.Fatalf("pod without state file lost its network: %v", err)
	}
	if err := env.Del(pod.Conf, pod.ID, pod.NS); err != nil {
		t.Fatal(err)
	}
	if launch.Alive(stack) {
		t.Fatal("DEL without state left the stack running")
	}
}

// loseNetns deletes a pod's namespace behind the plugin's back, the way a
// runtime does: a lazy unmount (an agent may hold the namespace open at
// that moment, which would make a plain unmount fail with EBUSY) and the
// bind-mount file removed.
func loseNetns(t testing.TB, n ns.NetNS) {
	t.Helper()
	path := n.Path()
	n.Close()
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
		t.Errorf("unmounting %s: %v", path, err)
	}
	if err := os.Remove(path); err != nil {
		t.Errorf("removing %s: %v", path, err)
	}
}
