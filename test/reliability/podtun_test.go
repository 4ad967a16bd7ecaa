// SPDX-License-Identifier: Apache-2.0

package reliability

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestPodDeletesItsTUN deletes the pod's eth0, the stack's TUN, from
// inside the pod's namespace, as a container with CAP_NET_ADMIN can. The
// stack's descriptor then reads and writes nothing (EBADFD, and the
// poller reports it readable for ever): the stack must not stay up
// spinning on it with its health still ok, but exit at once, so that the
// agent restarts it, the TUN is made anew from the spec and the pod
// opens connections again.
func TestPodDeletesItsTUN(t *testing.T) {
	env, pod := newEnvPod(t, nil)
	startAgent(t, env)
	echoServer(t, env.Node, 7000)
	node := nettest.HostPort(pod.Gateway(4), 7000)
	if err := roundTrip(pod.NS, node); err != nil {
		t.Fatalf("before eth0 was deleted: %v", err)
	}
	old := stackOf(t, env, pod)
	cpuBefore, err := cpuTicks(old.PID)
	if err != nil {
		t.Fatal(err)
	}
	err = pod.NS.Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	})
	if err != nil {
		t.Fatalf("deleting eth0 in the pod: %v", err)
	}
	deletedAt := time.Now()
	const exitWithin = 3 * time.Second
	for launch.Alive(old) {
		if time.Since(deletedAt) > exitWithin {
			cpu, _ := cpuTicks(old.PID)
			t.Fatalf("stack %d still runs %s after the pod deleted its TUN, having spent %s of CPU meanwhile: want it to exit",
				old.PID, exitWithin, time.Duration(cpu-cpuBefore)*time.Second/100)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the stack exited %s after its TUN was deleted", time.Since(deletedAt).Round(time.Millisecond))
	for {
		if err := roundTrip(pod.NS, node); err == nil {
			break
		}
		if time.Since(deletedAt) > 15*time.Second {
			t.Fatalf("pod cannot open connections %s after it deleted its eth0", time.Since(deletedAt).Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("new connections work %s after eth0 was deleted", time.Since(deletedAt).Round(time.Millisecond))
	if now := lockedStackOf(t, env, pod); now == old || !launch.Alive(now) {
		t.Fatalf("state names stack %+v, before eth0 was deleted %+v: want a restarted stack", now, old)
	}
	if err := env.Check(pod.Conf, pod.ID, pod.NS); err != nil {
		t.Fatalf("CHECK after the restart: %v", err)
	}
}

// cpuTicks is the user and system time pid spent, in clock ticks
// (USER_HZ, 100 a second on Linux).
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command, which may hold spaces, in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return utime + stime, nil
}

// TestTUNRefusesThePodWhileTheStackIsDown stops a pod's stack and, while
// no stack holds the pod's persistent TUN, has a process of the pod (root,
// without CAP_NET_ADMIN, as a container runs) try to attach to it: the
// TUN has an owner that is not the process, so the kernel refuses
// (EPERM). Without an owner the process would hold the pod's TUN, and the
// stack could not attach when it came back. Then the agent restarts the
// stack, which attaches, and the pod opens connections again.
func TestTUNRefusesThePodWhileTheStackIsDown(t *testing.T) {
	env, pod := newEnvPod(t, nil)
	echoServer(t, env.Node, 7000)
	node := nettest.HostPort(pod.Gateway(4), 7000)
	if err := roundTrip(pod.NS, node); err != nil {
		t.Fatalf("before the stack stopped: %v", err)
	}
	old := stackOf(t, env, pod)
	if err := syscall.Kill(old.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("stopping the stack: %v", err)
	}
	stoppedAt := time.Now()
	// The thread group's leader is a zombie while its other threads still
	// exit, holding the TUN: busy until the last one is gone. The kernel
	// checks the owner before it looks for a free queue.
	var (
		fd  int
		err error
	)
	for {
		fd, err = attachWithoutNetAdmin(pod.NS, "eth0")
		if !errors.Is(err, unix.EBUSY) || time.Since(stoppedAt) > 5*time.Second {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err == nil {
		unix.Close(fd)
		t.Fatal("a process of the pod without CAP_NET_ADMIN attached to the pod's TUN while its stack was down: want EPERM")
	}
	if !errors.Is(err, unix.EPERM) {
		t.Fatalf("attaching to the pod's TUN without CAP_NET_ADMIN: got %v, want EPERM", err)
	}
	t.Logf("refused: %v", err)

	startAgent(t, env)
	since := time.Now()
	for {
		if err := roundTrip(pod.NS, node); err == nil {
			break
		}
		if time.Since(since) > 15*time.Second {
			t.Fatalf("pod cannot open connections %s after the agent started", time.Since(since).Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if now := lockedStackOf(t, env, pod); now == old || !launch.Alive(now) {
		t.Fatalf("state names stack %+v, the stopped one %+v: want a restarted stack", now, old)
	}
}

// attachWithoutNetAdmin opens /dev/net/tun and attaches to the TUN name
// in netns from a thread that dropped CAP_NET_ADMIN from its effective
// set (capabilities are per thread), as root. The thread is never handed
// back to the runtime: it exits with its goroutine.
func attachWithoutNetAdmin(netns ns.NetNS, name string) (int, error) {
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread's namespace and capabilities are
		// not the process's, so it ends with this goroutine.
		fd, err := func() (int, error) {
			if err := unix.Setns(int(netns.Fd()), unix.CLONE_NEWNET); err != nil {
				return -1, fmt.Errorf("entering the pod's namespace: %w", err)
			}
			hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
			var data [2]unix.CapUserData
			if err := unix.Capget(&hdr, &data[0]); err != nil {
				return -1, fmt.Errorf("reading the thread's capabilities: %w", err)
			}
			data[unix.CAP_NET_ADMIN/32].Effective &^= 1 << (unix.CAP_NET_ADMIN % 32)
			if err := unix.Capset(&hdr, &data[0]); err != nil {
				return -1, fmt.Errorf("dropping CAP_NET_ADMIN: %w", err)
			}
			fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return -1, fmt.Errorf("opening /dev/net/tun: %w", err)
			}
			ifr, err := unix.NewIfreq(name)
			if err != nil {
				unix.Close(fd)
				return -1, err
			}
			ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
			if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
				unix.Close(fd)
				return -1, fmt.Errorf("attaching to %s: %w", name, err)
			}
			return fd, nil
		}()
		done <- result{fd, err}
	}()
	r := <-done
	return r.fd, r.err
}
