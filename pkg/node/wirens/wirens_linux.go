// Package wirens owns the wire namespace: the network namespace of a pod's
// stack in which the pod's link to the node lives, out of reach of every
// process in the pod. A link in the pod's own namespace is a link a root
// container opens a packet socket on, sends any frame through and reads
// every frame of; a filter there is one CAP_NET_ADMIN removes. The
// namespace is pinned by a bind mount (as `ip netns add` does), so that it
// and the link in it outlive the stack process: a stack restarted after a
// crash finds them where they were. The pins sit beside the runtime's pods'
// namespaces (/var/run/netns), a shared mount that the node agent's
// container sees with the mounts made after it started.
package wirens

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
)

// Path is the pin, in dir, of the attachment whose state key is key:
// named like `ip netns add` names, so that `ip netns exec` enters it
// when dir is /var/run/netns.
func Path(dir, key string) string { return filepath.Join(dir, "cni-usernet-"+key) }

// Create makes a new network namespace pinned at path and returns it
// open.
// An existing pin is an error: it belongs to an attachment that is still
// there, or to one whose teardown has not finished.
func Create(path string) (ns.NetNS, error) {
	dir := filepath.Dir(path)
	if err := makeSharedDir(dir); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return nil, fmt.Errorf("creating the wire namespace's pin %s: %w", path, err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread is left in the new namespace and never unlocked:
		// the runtime discards it when this goroutine ends.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("creating a network namespace: %w", err)
			}
			self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
			if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("pinning the network namespace at %s: %w", path, err)
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return nil, err
	}
	n, err := ns.GetNS(path)
	if err != nil {
		Remove(path)
		return nil, fmt.Errorf("opening the wire namespace %s: %w", path, err)
	}
	return n, nil
}

// makeSharedDir makes dir a shared mount point, as iproute2 does for
// /run/netns: pins made later propagate into mount namespaces that bind
// dir with slave propagation (the node agent's container), so that what
// the plugin pinned on the host is there for the agent too.
func makeSharedDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("making %s a shared mount: %w", dir, err)
	}
	// EINVAL: not a mount point yet. Bind it onto itself first; two
	// plugins racing here both succeed (a second bind stacks harmlessly).
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding %s onto itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making %s a shared mount: %w", dir, err)
	}
	return nil
}

// Remove unpins the namespace at path and removes the pin. The namespace
// goes when nothing else holds it (its stack has exited), and the links
// in it with it: a veth's node end disappears with its pod end. Already
// gone is success.
func Remove(path string) error {
	if path == "" {
		return nil
	}
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unpinning the wire namespace %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the wire namespace's pin %s: %w", path, err)
	}
	return nil
}

// RemoveIn is Remove done in the mount namespace at mountNS (e.g.
// /proc/1/ns/mnt): a node agent in a container unpins in the host's mount
// namespace, where the plugin pinned; an unmount in its own would only
// detach its copy. mountNS empty or the caller's own: Remove.
func RemoveIn(mountNS, path string) error {
	if mountNS == "" || path == "" {
		return Remove(path)
	}
	return launch.InMountNS(mountNS, func() error { return Remove(path) })
}

// Exists reports whether path is a pinned network namespace.
func Exists(path string) bool {
	n, err := ns.GetNS(path)
	if err != nil {
		return false
	}
	n.Close()
	return true
}

// ErrNoLink is MoveLink's answer when from holds no link of that name.
var ErrNoLink = errors.New("no such link")

// MoveLink moves the link name from the namespace from into to, where it
// arrives down (the kernel's doing), and brings it up there.
func MoveLink(from ns.NetNS, name string, to ns.NetNS) error {
	err := from.Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName(name)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return fmt.Errorf("moving %s out of %s: %w", name, from.Path(), ErrNoLink)
			}
			return fmt.Errorf("looking up %s in %s: %w", name, from.Path(), err)
		}
		if err := netlink.LinkSetNsFd(l, int(to.Fd())); err != nil {
			return fmt.Errorf("moving %s from %s to %s: %w", name, from.Path(), to.Path(), err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return to.Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName(name)
		if err != nil {
			return fmt.Errorf("looking up %s in %s: %w", name, to.Path(), err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("bringing %s up in %s: %w", name, to.Path(), err)
		}
		return nil
	})
}
