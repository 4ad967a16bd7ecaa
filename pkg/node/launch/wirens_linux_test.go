package launch

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"
	"golang.org/x/sys/unix"
)

// TestWireNetnsReachesAnotherMountNamespace: a supervisor restarts stacks
// in the host's mount namespace (MountNS), which need not show the pin of
// the stack's own namespace (on the lab it does not); the process gets the
// namespace as descriptor WireNetnsFD, opened by the launcher, and finds
// it there although the path shows no namespace to it.
func TestWireNetnsReachesAnotherMountNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces)")
	}
	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pod.Close(); testutils.UnmountNS(pod) })
	wire, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wire.Close(); testutils.UnmountNS(wire) })

	// A mount namespace where the pin's directory is an empty tmpfs.
	holder := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		"mount -t tmpfs none "+filepath.Dir(wire.Path())+" && echo ready && exec sleep 60")
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	buf := make([]byte, 6)
	if _, err := out.Read(buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("mount namespace holder: %q, %v", buf, err)
	}
	mountNS := fmt.Sprintf("/proc/%d/ns/mnt", holder.Process.Pid)

	dir := t.TempDir()
	report := filepath.Join(dir, "report")
	script := fmt.Sprintf(`{ echo "fd=$(stat -L -c %%i /proc/self/fd/%d)"; echo "env=$%s"; `+
		`echo "pin=$(stat -f -c %%T %s 2>/dev/null)"; } > %s; echo ok >&3`, WireNetnsFD, WireNetnsEnv, wire.Path(), report)
	p, err := Start(Options{
		Binary: "/bin/sh", Args: []string{"-c", script},
		Netns: pod.Path(), WireNetns: wire.Path(), MountNS: mountNS,
		LogPath: filepath.Join(dir, "log"), ReadyTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Stop(p, time.Second) })
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var want unix.Stat_t
	if err := unix.Stat(wire.Path(), &want); err != nil {
		t.Fatal(err)
	}
	got := strings.Fields(string(b))
	if len(got) != 3 || got[0] != fmt.Sprintf("fd=%d", want.Ino) || got[1] != fmt.Sprintf("env=%d", WireNetnsFD) {
		t.Errorf("the process saw %q, want fd=%d (the namespace's inode) and env=%d", got, want.Ino, WireNetnsFD)
	}
	if len(got) == 3 && got[2] == "pin=nsfs" {
		t.Errorf("the pin shows in the process's mount namespace: the test proves nothing")
	}
}
