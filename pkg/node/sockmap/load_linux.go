package sockmap

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/util/flock"
)

// bpffsMount is where nodes mount bpffs.
const bpffsMount = "/sys/fs/bpf"

// DefaultPinRoot is where the node's programs and maps are pinned; a
// directory per layout version (PinDir), so that a node upgraded to a
// new layout replaces the old programs instead of running both.
const DefaultPinRoot = "/sys/fs/bpf/cni-usernet"

// layoutVersion names the maps' and programs' layout; bump it with any
// change of a key, a value or a program's contract with the maps.
const layoutVersion = "sockmap-v4"

// PinDir is the directory of the node's pins under root.
func PinDir(root string) string { return filepath.Join(root, layoutVersion) }

// The pins in PinDir.
const (
	pinSocks    = "socks"
	pinTargets  = "targets"
	pinInfo     = "info"
	pinNetns    = "netns"
	pinCounters = "counters"
	pinChoice   = "choice"
	pinOwners   = "owners"
	pinServices = "services"
	pinService  = "service"
	pinVerdict  = "verdict"
	pinSockOps  = "sock_ops_link"
)

// ErrUnsupported wraps every reason the kernel cannot run the redirect;
// the pod then keeps the loopback TCP.
var ErrUnsupported = errors.New("socket redirect unsupported")

// Node is the node's redirect: the namespaces map, through which a pod
// is enabled, and its counters.
type Node struct {
	dir                               string
	netns, counters, owners, services *ebpf.Map
}

// Close releases the handle; the programs stay loaded and attached.
func (n *Node) Close() error {
	n.counters.Close()
	n.owners.Close()
	n.services.Close()
	return n.netns.Close()
}

// Open opens the node's pinned namespaces map, when Load has run; it
// loads nothing (DEL and the commands use it).
func Open(root string) (*Node, error) {
	// The sock_ops link is pinned last: its pin says the load finished.
	if _, err := os.Stat(filepath.Join(PinDir(root), pinSockOps)); err != nil {
		return nil, fmt.Errorf("opening the node's socket redirect: %w", err)
	}
	n := &Node{dir: PinDir(root)}
	for _, m := range []struct {
		pin string
		to  **ebpf.Map
	}{{pinNetns, &n.netns}, {pinCounters, &n.counters}, {pinOwners, &n.owners}, {pinServices, &n.services}} {
		mp, err := ebpf.LoadPinnedMap(filepath.Join(n.dir, m.pin), nil)
		if err != nil {
			n.closeOpened()
			return nil, fmt.Errorf("opening the node's socket redirect: %w", err)
		}
		*m.to = mp
	}
	return n, nil
}

// closeOpened closes the maps Open opened before it failed.
func (n *Node) closeOpened() {
	for _, m := range []*ebpf.Map{n.netns, n.counters, n.owners, n.services} {
		if m != nil {
			m.Close()
		}
	}
}

// Load returns the node's redirect, loading, attaching and pinning it
// under root first when it is not there yet. lockPath serialises loaders
// (concurrent ADDs). Errors that say the kernel cannot do it wrap
// ErrUnsupported.
func Load(root, lockPath string) (*Node, error) {
	if n, err := Open(root); err == nil {
		return n, nil
	}
	unlock, err := flock.Lock(lockPath)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if n, err := Open(root); err == nil {
		return n, nil // loaded by the ADD we waited for
	}
	if err := mountBPFFS(root); err != nil {
		return nil, err
	}
	spec, err := kernelSpec()
	if err != nil {
		return nil, err
	}
	layout, err := layoutIn(spec)
	if err != nil {
		return nil, err
	}
	// Without conntrack in the kernel's BTF there is no service program:
	// direct pods then join only the connections the node does not
	// translate, and AttachServices says why.
	var ct *ctLayout
	if c, err := ctLayoutIn(spec); err == nil {
		ct = &c
	}
	dir := PinDir(root)
	if err := os.RemoveAll(dir); err != nil { // a half-finished load
		return nil, fmt.Errorf("removing %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := load(dir, layout, ct); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	removeOtherLayouts(root)
	return Open(root)
}

// Unload detaches the node's redirect and removes its pins (the agent's
// uninstall, tests). Sockets already redirecting keep their programs
// until they close.
func Unload(root string) error {
	return os.RemoveAll(root)
}

func load(dir string, layout psockLayout, ct *ctLayout) (err error) {
	var m maps
	var closers []interface{ Close() error }
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	newMap := func(name string, spec *ebpf.MapSpec) (*ebpf.Map, error) {
		mp, err := ebpf.NewMap(spec)
		if err != nil {
			return nil, fmt.Errorf("%w: creating the %s map: %v", ErrUnsupported, name, err)
		}
		closers = append(closers, mp)
		if err := mp.Pin(filepath.Join(dir, name)); err != nil {
			return nil, fmt.Errorf("pinning the %s map: %w", name, err)
		}
		return mp, nil
	}
	if m.socks, err = newMap(pinSocks, &ebpf.MapSpec{Name: "usn_socks", Type: ebpf.SockHash, KeySize: keySize, ValueSize: 8, MaxEntries: maxSockets}); err != nil {
		return err
	}
	// targets has no programs attached, ever: its members keep TCP's own
	// sendmsg.
	if m.targets, err = newMap(pinTargets, &ebpf.MapSpec{Name: "usn_targets", Type: ebpf.SockHash, KeySize: keySize, ValueSize: 8, MaxEntries: maxSockets}); err != nil {
		return err
	}
	if m.info, err = newMap(pinInfo, &ebpf.MapSpec{Name: "usn_info", Type: ebpf.LRUHash, KeySize: keySize, ValueSize: infoSize, MaxEntries: maxSockets}); err != nil {
		return err
	}
	if m.netns, err = newMap(pinNetns, &ebpf.MapSpec{Name: "usn_netns", Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: maxPods}); err != nil {
		return err
	}
	if m.counters, err = newMap(pinCounters, &ebpf.MapSpec{Name: "usn_counters", Type: ebpf.Hash, KeySize: 8, ValueSize: countersSize, MaxEntries: maxPods}); err != nil {
		return err
	}
	if m.owners, err = newMap(pinOwners, &ebpf.MapSpec{Name: "usn_owners", Type: ebpf.Hash, KeySize: 16, ValueSize: 8, MaxEntries: maxOwners}); err != nil {
		return err
	}
	// Allocated as connections come: most nodes hold few.
	if m.services, err = newMap(pinServices, &ebpf.MapSpec{Name: "usn_services", Type: ebpf.Hash, KeySize: svcKeySize, ValueSize: svcValSize, MaxEntries: maxServices, Flags: unix.BPF_F_NO_PREALLOC}); err != nil {
		return err
	}
	// Socket storage needs BTF for its key and value.
	if m.choice, err = newMap(pinChoice, &ebpf.MapSpec{Name: "usn_choice", Type: ebpf.SkStorage, KeySize: 4, ValueSize: 8,
		Flags: unix.BPF_F_NO_PREALLOC, Key: &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed}, Value: &btf.Int{Name: "u64", Size: 8}}); err != nil {
		return err
	}
	verdict, err := ebpf.NewProgram(programSpec("usn_verdict", ebpf.SkMsg, skMsgProgram(m, layout)))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnsupported, errLoading("sk_msg", err))
	}
	closers = append(closers, verdict)
	if err := verdict.Pin(filepath.Join(dir, pinVerdict)); err != nil {
		return fmt.Errorf("pinning the sk_msg program: %w", err)
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: m.socks.FD(), Program: verdict, Attach: ebpf.AttachSkMsgVerdict}); err != nil {
		return fmt.Errorf("%w: attaching the sk_msg program to the socket hash: %v", ErrUnsupported, err)
	}
	// A verifier that refuses the service program leaves the rest of
	// the redirect on, as a kernel without it does (ct nil).
	if ct != nil {
		if svc, err := ebpf.NewProgram(programSpec("usn_service", ebpf.SchedCLS, serviceProgram(m, *ct, layout))); err == nil {
			closers = append(closers, svc)
			if err := svc.Pin(filepath.Join(dir, pinService)); err != nil {
				return fmt.Errorf("pinning the service program: %w", err)
			}
		}
	}
	ops, err := ebpf.NewProgram(programSpec("usn_sock_ops", ebpf.SockOps, sockOpsProgram(m, layout)))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnsupported, errLoading("sock_ops", err))
	}
	closers = append(closers, ops)
	cg, release, err := cgroup2Root()
	if err != nil {
		return err
	}
	defer release()
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupSockOps, Program: ops})
	if err != nil {
		return fmt.Errorf("%w: attaching the sock_ops program to cgroup %s: %v", ErrUnsupported, cg, err)
	}
	closers = append(closers, l)
	if err := l.Pin(filepath.Join(dir, pinSockOps)); err != nil {
		l.Close()
		return fmt.Errorf("pinning the sock_ops program's link: %w", err)
	}
	return nil
}

// removeOtherLayouts unpins the programs of other layout versions: their
// sock_ops link goes with its pin, so new sockets meet only this layout.
func removeOtherLayouts(root string) {
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "sockmap-") && e.Name() != layoutVersion {
			os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
}

// mountBPFFS makes root, mounting bpffs first when the nearest existing
// directory above it is on none (a node that mounts none at
// /sys/fs/bpf): at /sys/fs/bpf when root is below it, as systemd mounts
// it, else beside root.
func mountBPFFS(root string) error {
	for d := root; ; d = filepath.Dir(d) {
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err == nil {
			if st.Type == unix.BPF_FS_MAGIC {
				return os.MkdirAll(root, 0o700)
			}
			break
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	mnt := filepath.Dir(root)
	if strings.HasPrefix(root, bpffsMount+"/") {
		mnt = bpffsMount
	}
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", mnt, err)
	}
	if err := unix.Mount("bpffs", mnt, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("%w: mounting bpffs at %s: %v", ErrUnsupported, mnt, err)
	}
	return os.MkdirAll(root, 0o700)
}

// cgroup2Root is the root of the cgroup v2 hierarchy: where one is
// mounted (a unified node; /sys/fs/cgroup/unified on a hybrid one), else
// a mount of its own that release removes once the program is attached
// (the link holds the cgroup). Attached at the root, the sock_ops program
// sees the sockets of every process on the node, and its namespace check
// keeps it to the enabled pods'.
func cgroup2Root() (path string, release func(), err error) {
	if p := mountedCgroup2Root(); p != "" {
		return p, func() {}, nil
	}
	dir, err := os.MkdirTemp("/run", "cni-usernet-cgroup2-")
	if err != nil {
		return "", nil, fmt.Errorf("making a mount point for cgroup2: %w", err)
	}
	if err := unix.Mount("cgroup2", dir, "cgroup2", 0, ""); err != nil {
		os.Remove(dir)
		return "", nil, fmt.Errorf("%w: mounting cgroup2: %v", ErrUnsupported, err)
	}
	return dir, func() {
		unix.Unmount(dir, unix.MNT_DETACH)
		os.Remove(dir)
	}, nil
}

// mountedCgroup2Root finds a mount of the cgroup2 hierarchy's root in
// this mount namespace.
func mountedCgroup2Root() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source superopts
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fields[sep+1] == "cgroup2" && fields[3] == "/" {
			return fields[4]
		}
	}
	return ""
}
