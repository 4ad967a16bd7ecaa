package cni

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/node/podcgroup"
)

// v2Mount is the node's cgroup v2 hierarchy: /sys/fs/cgroup on a unified
// node, /sys/fs/cgroup/unified on a hybrid one.
func v2Mount(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p
		}
	}
	t.Skip("no cgroup v2 hierarchy mounted")
	return ""
}

// testCgroupMount makes a cgroup of the test's own in the v2 hierarchy,
// which the test then takes for the node's cgroup mount (a cgroup has
// cgroup.controllers as the hierarchy's root has), and removes it with
// everything made in it at cleanup. It returns the cgroup's directory
// and its path in the hierarchy.
func testCgroupMount(t *testing.T) (dir, inHierarchy string) {
	t.Helper()
	mount := v2Mount(t)
	name := fmt.Sprintf("cni-usernet-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	dir = filepath.Join(mount, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("creating a test cgroup: %v", err)
	}
	t.Cleanup(func() { removeCgroups(t, dir) })
	return dir, "/" + name
}

// removeCgroups removes the cgroup at dir and those below it, deepest
// first: rmdir is how a cgroup goes, with its control files.
func removeCgroups(t *testing.T, dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			removeCgroups(t, filepath.Join(dir, e.Name()))
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removing test cgroup %s: %v", dir, err)
	}
}

// startInCgroup starts a process the way ADD starts a stack, joining
// cgroupPath under root, and stops and reaps it at cleanup.
func startInCgroup(t *testing.T, root, cgroupPath string) (launch.Process, error) {
	t.Helper()
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		netns.Close()
		testutils.UnmountNS(netns)
	})
	p, err := launch.Start(launch.Options{
		Binary:       "/bin/sh",
		Args:         []string{"-c", "echo ok >&3; exec sleep 60"},
		Netns:        netns.Path(),
		LogPath:      filepath.Join(t.TempDir(), "stack.log"),
		ReadyTimeout: 5 * time.Second,
		CgroupRoot:   root,
		CgroupPath:   cgroupPath,
	})
	if err != nil {
		return p, err
	}
	t.Cleanup(func() {
		launch.Stop(p, time.Second)
		// Released by Start, but still this process's child.
		syscall.Wait4(p.PID, nil, 0, nil)
	})
	return p, nil
}

// enableLikeKubelet enables a controller for the children of each
// cgroup from dir down to pod, as kubelet's runtime does for a pod's
// containers, so that the pod's cgroup can hold no process itself. It
// returns the controller, or "" where the hierarchy offers none (a hybrid
// node's v2 hierarchy has no controllers).
func enableLikeKubelet(t *testing.T, dir, pod string) string {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	avail := strings.Fields(string(b))
	if len(avail) == 0 {
		return ""
	}
	ctrl := avail[0]
	for _, c := range avail {
		if c == "pids" {
			ctrl = c // the cheapest to enable
		}
	}
	p := dir
	for _, c := range append([]string{""}, strings.Split(pod, "/")...) {
		p = filepath.Join(p, c)
		if err := os.WriteFile(filepath.Join(p, "cgroup.subtree_control"), []byte("+"+ctrl), 0); err != nil {
			t.Fatalf("enabling %s in %s: %v", ctrl, p, err)
		}
	}
	return ctrl
}

// TestStackCgroupJoinsRealCgroup: on a real cgroup v2 hierarchy, the
// cgroup stackCgroup chooses is the one a started stack is in, as
// /proc/PID/cgroup reports it: the pod's (leaf) from the runtime's path
// or the pod's UID, with either driver, and the node's.
func TestStackCgroupJoinsRealCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups, network namespace)")
	}
	cgroupfs := "kubepods/burstable/pod" + testPodUID
	systemd := "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testPodUIDSD + ".slice"
	for _, c := range []struct {
		name, pod, runtimePath, stackCgroup, want string
	}{
		{"runtime cgroupfs path", cgroupfs, "/" + cgroupfs, netconf.StackCgroupPod, cgroupfs + "/" + podcgroup.StackLeaf},
		{"runtime systemd slice:prefix:name", systemd, "kubepods-burstable-pod" + testPodUIDSD + ".slice:cri-containerd:0123", netconf.StackCgroupPod, systemd + "/" + podcgroup.StackLeaf},
		{"pod UID", systemd, "", netconf.StackCgroupPod, systemd + "/" + podcgroup.StackLeaf},
		{"node", cgroupfs, "/" + cgroupfs, netconf.StackCgroupNode, "kubepods/" + podcgroup.NodeCgroup},
	} {
		t.Run(c.name, func(t *testing.T) {
			root, inHierarchy := testCgroupMount(t)
			if err := os.MkdirAll(filepath.Join(root, c.pod), 0o755); err != nil {
				t.Fatal(err)
			}
			ctrl := enableLikeKubelet(t, root, c.pod)
			path, note, err := cgroupInv(c.runtimePath, c.stackCgroup).stackCgroupUnder(root)
			if err != nil || note != "" {
				t.Fatalf("stackCgroup: got %q, note %q, %v", path, note, err)
			}
			if path != c.want {
				t.Fatalf("stackCgroup: got %q, want %q", path, c.want)
			}
			p, err := startInCgroup(t, root, path)
			if err != nil {
				t.Fatal(err)
			}
			lines, err := launch.Cgroups(p.PID)
			if err != nil {
				t.Fatal(err)
			}
			want := inHierarchy + "/" + c.want
			found := false
			for _, l := range lines {
				if cg, ok := strings.CutPrefix(l, "0::"); ok {
					found = true
					if !strings.HasSuffix(cg, want) {
						t.Errorf("/proc/%d/cgroup: v2 cgroup %s, want %s", p.PID, cg, want)
					}
				}
			}
			if !found {
				t.Errorf("/proc/%d/cgroup: no v2 line in %q", p.PID, lines)
			}
			procs, err := os.ReadFile(filepath.Join(root, c.want, "cgroup.procs"))
			if err != nil || !strings.Contains("\n"+string(procs), "\n"+strconv.Itoa(p.PID)+"\n") {
				t.Errorf("%s/cgroup.procs: got %q, %v, want PID %d in it", c.want, procs, err, p.PID)
			}
			if ctrl == "" || c.stackCgroup == netconf.StackCgroupNode {
				return
			}
			// Why the leaf: the pod's own cgroup refuses a process.
			if _, err := startInCgroup(t, root, c.pod); err == nil || !errors.Is(err, unix.EBUSY) && !strings.Contains(err.Error(), "join a leaf below it") {
				t.Errorf("joining the pod's cgroup (%s enabled for its children): got %v, want EBUSY", ctrl, err)
			}
		})
	}
}
