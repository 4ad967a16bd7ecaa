package launch

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// startInMountNS starts cmd in the given mount namespace and netns.
func startInMountNS(cmd *exec.Cmd, netns ns.NetNS, mountNS string) error {
	return InMountNS(mountNS, func() error {
		if err := unix.Setns(int(netns.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("entering netns %s: %w", netns.Path(), err)
		}
		return cmd.Start()
	})
}

// InMountNS runs f on a thread of its own in the mount namespace at
// mountNS (the caller's own: on a locked thread in place). Mount
// namespaces cannot be entered by a thread that shares its filesystem
// attributes with others, so the thread first unshares them; it is then
// unfit for any other goroutine and is never unlocked: the runtime
// discards it when the goroutine ends.
func InMountNS(mountNS string, f func() error) error {
	same, err := sameNS("/proc/self/ns/mnt", mountNS)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- func() error {
			if same {
				// f may switch this thread's network namespace: the
				// thread goes with the goroutine.
				return f()
			}
			mnt, err := os.Open(mountNS)
			if err != nil {
				return fmt.Errorf("opening mount namespace %s: %w", mountNS, err)
			}
			defer mnt.Close()
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return fmt.Errorf("unsharing filesystem attributes: %w", err)
			}
			if err := unix.Setns(int(mnt.Fd()), unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("entering mount namespace %s: %w", mountNS, err)
			}
			return f()
		}()
	}()
	return <-errc
}

func sameNS(a, b string) (bool, error) {
	sa, err := os.Stat(a)
	if err != nil {
		return false, fmt.Errorf("reading namespace %s: %w", a, err)
	}
	sb, err := os.Stat(b)
	if err != nil {
		return false, fmt.Errorf("reading namespace %s: %w", b, err)
	}
	return os.SameFile(sa, sb), nil
}
