// SPDX-License-Identifier: Apache-2.0

package cni

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/node/podcgroup"
)

// cgroup2Stage names the stage of TestStackCgroupOnCgroup2Kernel a
// re-executed test binary runs; cgroup2Controller the controller its
// "node" stage enables.
const (
	cgroup2Stage      = "CNI_USERNET_TEST_CGROUP2_STAGE"
	cgroup2Controller = "CNI_USERNET_TEST_CGROUP2_CONTROLLER"
)

// TestStackCgroupOnCgroup2Kernel runs what the plugin does with a pod's
// cgroup on a real cgroup v2 hierarchy that the test mounts itself, so
// that it runs on a node that boots cgroup v1 too. The test binary runs
// itself again in a private mount namespace ("mount" stage), which mounts
// cgroup2, makes a cgroup of the test's own and enables a controller down
// to it; and once more in a private mount namespace and a cgroup
// namespace rooted at that cgroup ("node" stage), which mounts cgroup2 on
// /sys/fs/cgroup: there the plugin's default root is a v2 hierarchy root
// and /proc/PID/cgroup reads as on a node. For each cgroup driver and QoS
// class the node stage builds the pod's cgroups as kubelet does, with a
// controller enabled for the pod's containers, and checks that the pod's
// cgroup is found by its UID, that the pod's cgroup itself refuses the
// stack (EBUSY, the no-internal-process rule) while the cni-usernet
// child takes it, that a restart from the recorded cgroups lands there
// again, and that DEL's teardown removes the child and leaves the pod's
// cgroup to kubelet.
func TestStackCgroupOnCgroup2Kernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts, cgroups, network namespace)")
	}
	switch os.Getenv(cgroup2Stage) {
	case "":
		runCgroup2Stage(t, "mount", &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}, "")
	case "mount":
		cgroup2MountStage(t)
	case "node":
		cgroup2NodeStage(t)
	}
}

// runCgroup2Stage runs this test again in a child with attr, as stage,
// and fails with the child's output when it fails.
func runCgroup2Stage(t *testing.T, stage string, attr *syscall.SysProcAttr, ctrl string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestStackCgroupOnCgroup2Kernel$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), cgroup2Stage+"="+stage, cgroup2Controller+"="+ctrl)
	cmd.SysProcAttr = attr
	out, err := cmd.CombinedOutput()
	t.Logf("%s stage:\n%s", stage, out)
	if err != nil {
		t.Fatalf("%s stage: %v", stage, err)
	}
}

// cgroup2MountStage: in a private mount namespace, on the cgroup2
// hierarchy mounted here, a cgroup of the test's own with a controller
// enabled from the hierarchy's root down to it; the node stage runs in a
// cgroup namespace rooted at its "node" child.
func cgroup2MountStage(t *testing.T) {
	mnt := t.TempDir()
	if err := unix.Mount("none", mnt, "cgroup2", 0, ""); err != nil {
		t.Fatalf("mounting cgroup2 on %s: %v", mnt, err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	b, err := os.ReadFile(filepath.Join(mnt, "cgroup.controllers"))
	if err != nil {
		t.Fatal(err)
	}
	avail := strings.Fields(string(b))
	// A controller bound to a v1 hierarchy is not the v2 hierarchy's.
	t.Logf("controllers of the cgroup2 hierarchy: %q", avail)
	ctrl := ""
	if len(avail) > 0 {
		ctrl = avail[0]
		if slices.Contains(avail, "pids") {
			ctrl = "pids"
		}
	}
	if ctrl != "" {
		b, _ := os.ReadFile(filepath.Join(mnt, "cgroup.subtree_control"))
		if !slices.Contains(strings.Fields(string(b)), ctrl) {
			subtreeControl(t, mnt, "+"+ctrl)
			t.Cleanup(func() {
				// EBUSY when another cgroup enabled it meanwhile: it
				// stays, as harmless as it was to enable.
				if err := os.WriteFile(filepath.Join(mnt, "cgroup.subtree_control"), []byte("-"+ctrl), 0); err != nil {
					t.Logf("disabling %s in the hierarchy's root again: %v", ctrl, err)
				}
			})
		}
	}
	own := filepath.Join(mnt, fmt.Sprintf("cni-usernet-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatalf("creating a test cgroup: %v", err)
	}
	t.Cleanup(func() { removeCgroups(t, own) })
	if ctrl != "" {
		subtreeControl(t, own, "+"+ctrl)
	}
	node := filepath.Join(own, "node")
	if err := os.Mkdir(node, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.Open(node)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	runCgroup2Stage(t, "node", &syscall.SysProcAttr{
		Unshareflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWCGROUP,
		UseCgroupFD:  true,
		CgroupFD:     int(dir.Fd()),
	}, ctrl)
}

func subtreeControl(t *testing.T, dir, change string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(change), 0); err != nil {
		t.Fatalf("%s in %s: %v", change, dir, err)
	}
}

// cgroup2NodeStage: /sys/fs/cgroup is the cgroup2 hierarchy, rooted at
// the test's cgroup, in this process's mount namespace only.
func cgroup2NodeStage(t *testing.T) {
	const root = podcgroup.DefaultRoot
	if err := unix.Mount("none", root, "cgroup2", 0, ""); err != nil {
		t.Fatalf("mounting cgroup2 on %s: %v", root, err)
	}
	// The root cannot both hold this process and enable controllers for
	// its children.
	runner := filepath.Join(root, "test-runner")
	if err := os.Mkdir(runner, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(runner, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		t.Fatalf("moving the test into %s: %v", runner, err)
	}
	ctrl := os.Getenv(cgroup2Controller)
	if ctrl == "" {
		t.Log("the cgroup2 hierarchy has no controller to enable: the no-internal-process rule cannot be shown")
	} else {
		subtreeControl(t, root, "+"+ctrl)
	}

	for _, driver := range []struct {
		name string
		// tree is the kubepods cgroup, classes its QoS classes' cgroups,
		// pod the cgroup of pod uid in class ("" for Guaranteed).
		tree    string
		classes []string
		pod     func(class, uid string) string
	}{
		{"cgroupfs", "kubepods", []string{"kubepods/burstable", "kubepods/besteffort"}, func(class, uid string) string {
			if class == "" {
				return "kubepods/pod" + uid
			}
			return "kubepods/" + class + "/pod" + uid
		}},
		{"systemd", "kubepods.slice", []string{"kubepods.slice/kubepods-burstable.slice", "kubepods.slice/kubepods-besteffort.slice"}, func(class, uid string) string {
			u := strings.ReplaceAll(uid, "-", "_")
			if class == "" {
				return "kubepods.slice/kubepods-pod" + u + ".slice"
			}
			return "kubepods.slice/kubepods-" + class + ".slice/kubepods-" + class + "-pod" + u + ".slice"
		}},
	} {
		t.Run(driver.name, func(t *testing.T) {
			mkCgroup(t, root, driver.tree, ctrl)
			t.Cleanup(func() { removeCgroups(t, filepath.Join(root, driver.tree)) })
			for _, c := range driver.classes {
				mkCgroup(t, root, c, ctrl)
			}
			for _, class := range []string{"", "burstable", "besteffort"} {
				name := class
				if name == "" {
					name = "guaranteed"
				}
				t.Run(name, func(t *testing.T) {
					uid := newUID(t)
					pod := driver.pod(class, uid)
					// Kubelet's pod cgroup, its runtime's sandbox below it,
					// and another pod of the same class.
					mkCgroup(t, root, pod, ctrl)
					mkCgroup(t, root, pod+"/sandbox", "")
					mkCgroup(t, root, driver.pod(class, newUID(t)), "")
					stackCgroupOnKernel(t, root, uid, pod, ctrl)
				})
			}
		})
	}
}

// stackCgroupOnKernel is ADD's choice of the stack's cgroup for pod uid,
// whose cgroup is pod, the stack's start there, its restart and DEL.
func stackCgroupOnKernel(t *testing.T, root, uid, pod, ctrl string) {
	inv := cgroupInv("", netconf.StackCgroupPod)
	inv.pod.K8S_POD_UID = types.UnmarshallableString(uid)
	got, note, err := inv.stackCgroup()
	want := pod + "/" + podcgroup.StackLeaf
	if err != nil || note != "" || got != want {
		t.Fatalf("the stack's cgroup for pod %s: got %q, note %q, %v, want %q", uid, got, note, err, want)
	}
	if fi, err := os.Stat(filepath.Join(root, want, "cgroup.procs")); err != nil || fi.IsDir() {
		t.Fatalf("%s is not a cgroup the kernel made: %v", want, err)
	}
	if ctrl != "" {
		// The rule the child exists for: kubelet's runtime enabled a
		// controller for the pod's containers.
		_, err := startInCgroup(t, "", pod)
		if !errors.Is(err, unix.EBUSY) || !strings.Contains(err.Error(), "join a leaf below it") {
			t.Errorf("starting a stack in the pod's own cgroup (%s enabled for its children): got %v, want EBUSY and the advice", ctrl, err)
		}
	}
	p, err := startInCgroup(t, "", got)
	if err != nil {
		t.Fatalf("starting a stack in %s: %v", got, err)
	}
	lines, err := launch.Cgroups(p.PID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(lines, "0::/"+want) {
		t.Fatalf("/proc/%d/cgroup: got %q, want 0::/%s", p.PID, lines, want)
	}

	// The agent's restart: from the cgroups recorded at start.
	if err := launch.Stop(p, time.Second); err != nil {
		t.Fatal(err)
	}
	syscall.Wait4(p.PID, nil, 0, nil)
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		netns.Close()
		testutils.UnmountNS(netns)
	})
	again, err := launch.Start(launch.Options{
		Binary:       "/bin/sh",
		Args:         []string{"-c", "echo ok >&3; exec sleep 60"},
		Netns:        netns.Path(),
		LogPath:      filepath.Join(t.TempDir(), "stack.log"),
		ReadyTimeout: 5 * time.Second,
		Cgroups:      lines,
	})
	if err != nil {
		t.Fatalf("restarting the stack: %v", err)
	}
	t.Cleanup(func() {
		launch.Stop(again, time.Second)
		syscall.Wait4(again.PID, nil, 0, nil)
	})
	// The v1 hierarchies this process is in are recorded too, and not
	// mounted here: the warning says so, and only the v2 line counts.
	if again.Warning != nil {
		t.Logf("restart's warning: %v", again.Warning)
	}
	if now, _ := launch.Cgroups(again.PID); !slices.Contains(now, "0::/"+want) {
		t.Errorf("restarted stack: /proc/%d/cgroup is %q, want 0::/%s", again.PID, now, want)
	}

	// DEL: the teardown stops the stack and takes its cgroup away, twice
	// as well as once; the pod's cgroup is kubelet's to remove.
	for i := range 2 {
		td := attachment.Teardown{
			Store:        state.Store{Dir: t.TempDir()},
			RunDir:       t.TempDir(),
			LogDir:       t.TempDir(),
			TUNName:      "eth0",
			ContainerID:  fmt.Sprintf("cgroup-%s-%d", uid[:8], i),
			IfName:       "eth0",
			Proc:         again,
			StackCgroups: lines,
		}
		// In a namespace of its own: a teardown removes links by name.
		if err := netns.Do(func(ns.NetNS) error { return td.Run() }); err != nil {
			t.Fatalf("DEL %d: %v", i+1, err)
		}
	}
	if launch.Alive(again) {
		t.Errorf("stack %d still runs after DEL", again.PID)
	}
	if _, err := os.Stat(filepath.Join(root, want)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after DEL, %s: got %v, want it gone", want, err)
	}
	if _, err := os.Stat(filepath.Join(root, pod)); err != nil {
		t.Errorf("after DEL, the pod's cgroup %s: %v, want it left to kubelet", pod, err)
	}
}

// mkCgroup makes the cgroup rel under root and, when ctrl is set, enables
// it for rel's children, as kubelet does for its kubepods, QoS and pod
// cgroups.
func mkCgroup(t *testing.T, root, rel, ctrl string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatalf("creating cgroup %s: %v", path.Clean(rel), err)
	}
	if ctrl != "" {
		subtreeControl(t, p, "+"+ctrl)
	}
}

// newUID is a pod UID as the API server makes them.
func newUID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
