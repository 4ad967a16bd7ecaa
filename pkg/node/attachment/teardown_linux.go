package attachment

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/ingressdrop"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/node/podcgroup"
	"github.com/cni-usernet/cni-usernet/pkg/node/podkernel"
	"github.com/cni-usernet/cni-usernet/pkg/node/sockmap"
	"github.com/cni-usernet/cni-usernet/pkg/node/sourceguard"
	"github.com/cni-usernet/cni-usernet/pkg/node/wirens"
)

// Teardown is everything needed to undo one attachment: a plain record,
// filled from the attachment's state (FromState) or, when that is gone,
// from what the caller knows.
type Teardown struct {
	// Store holds the attachment's state record; its directory is the
	// state directory the stack's files live under.
	Store state.Store
	// Log receives what is worth knowing but does not fail the teardown.
	Log *slog.Logger
	// RunDir and LogDir are where the control socket and the stack's log
	// are (PathsFor).
	RunDir, LogDir string
	// TUNName is the applications' TUN in the pod.
	TUNName                    string
	ContainerID, IfName, Netns string
	// Chained: the link and lease belong to an earlier plugin.
	Chained bool
	// IPs are the attachment's addresses (CIDR notation): chained, they go
	// back on the interface for the earlier plugins' DEL (restoreAddrs).
	IPs []string
	// WireNetns is the pin of the stack's own namespace, which holds the
	// pod's link; empty: WirePath's in NetnsDir, if it is there.
	WireNetns string
	// NetnsDir is the network's "netnsDir", for an attachment without
	// state; empty: none is looked for.
	NetnsDir string
	// MountNS is the mount namespace the pin was made in (a node agent in
	// a container passes the host's, /proc/1/ns/mnt); empty: the caller's.
	MountNS string
	// SourceGuard is the node-side link whose source guard goes; empty:
	// the standalone veth's (HostVethName).
	SourceGuard string
	// Proc is the stack; zero: found by its config path.
	Proc launch.Process
	// StackCgroups are the stack's cgroups as it started (the record's):
	// its StackLeaf goes with it (podcgroup.RemoveLeaf). CgroupRoot is
	// the cgroup mount they are read under; zero: /sys/fs/cgroup.
	StackCgroups []string
	CgroupRoot   string

	IPAMType string
	IPAMConf []byte
	// CNIPath finds the IPAM plugin; empty: CNI_PATH.
	CNIPath string
	// Redirect is the pod's socket redirect, which goes with it; nil:
	// none in the record, or no record. BPFDir is the network's
	// "bpfDir", where an attachment without a record looks for it.
	Redirect *state.SocketRedirect
	BPFDir   string
}

// FromState takes what the attachment's record knows.
func (td *Teardown) FromState(att *state.Attachment) {
	td.Chained = att.Chained
	td.IPs = att.IPs
	td.Proc = launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}
	td.StackCgroups = att.StackCgroups
	if att.WireNetns != "" {
		td.WireNetns = att.WireNetns
	}
	td.SourceGuard = att.SourceGuard
	td.Redirect = att.SocketRedirect
	if att.Netns != "" && td.Netns == "" {
		td.Netns = att.Netns
	}
	if att.IPAMType != "" {
		td.IPAMType, td.IPAMConf = att.IPAMType, att.IPAMConf
	}
}

// Run undoes the attachment. Everything already gone counts as done; on
// an error the state record stays, so that a retried DEL or GC can finish.
func (td *Teardown) Run() error {
	var errs []error
	p := PathsFor(td.Store.Dir, td.RunDir, td.LogDir, td.ContainerID, td.IfName)
	procs := []launch.Process{td.Proc}
	if td.Proc.PID == 0 {
		// No state: the stack, if it runs, is the process started with
		// this attachment's config path.
		procs = launch.Find(launch.StackArgs(p.Config)...)
	}
	for _, proc := range procs {
		if err := launch.Stop(proc, StopGrace); err != nil {
			errs = append(errs, fmt.Errorf("stopping stack: %w", err))
		}
	}
	// Best effort: kubelet removes the pod's cgroup with what is in it.
	if err := podcgroup.RemoveLeaf(td.CgroupRoot, td.StackCgroups); err != nil {
		td.log().Warn("the stack's cgroup stays", "err", err)
	}
	td.disableRedirect()
	if err := td.CleanNetns(); err != nil {
		errs = append(errs, err)
	}
	// The guard's table outlives its link on newer kernels, where a link
	// of the same name would take it over.
	guard := td.SourceGuard
	if guard == "" && !td.Chained {
		guard = HostVethName(td.ContainerID, td.IfName)
	}
	if guard != "" {
		if err := sourceguard.Remove(guard); err != nil {
			errs = append(errs, err)
		}
	}
	if !td.Chained {
		if err := DelLink(HostVethName(td.ContainerID, td.IfName)); err != nil {
			errs = append(errs, err)
		}
		if td.IPAMType != "" {
			if err := td.releaseLease(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, path := range []string{p.StackDir, p.Socket, p.Log, launch.RotatedLog(p.Log)} {
		if err := removeAll(path); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// Keep the state so that a retried DEL or GC can finish the job.
		return errors.Join(errs...)
	}
	return td.Store.Delete(td.ContainerID, td.IfName)
}

// disableRedirect takes the pod's namespace out of the node's socket
// redirect. Best effort: an entry left behind names a namespace that is
// gone (cookies are never reused) and costs a slot of the map.
func (td *Teardown) disableRedirect() {
	r := td.Redirect
	if r == nil && td.BPFDir != "" && td.Netns != "" {
		// No record: the pod's namespace, while it exists, names its
		// entry.
		cookie, err := sockmap.NetnsCookie(td.Netns)
		if err != nil {
			return
		}
		r = &state.SocketRedirect{On: true, BPFDir: td.BPFDir, NetnsCookie: cookie}
	}
	if r == nil || !r.On || r.NetnsCookie == 0 {
		return
	}
	node, err := sockmap.Open(r.BPFDir)
	if err != nil {
		if td.Redirect != nil {
			td.log().Warn("the node's socket redirect is gone: nothing to take the pod out of", "err", err)
		}
		return
	}
	defer node.Close()
	if err := node.Disable(r.NetnsCookie); err != nil {
		td.log().Warn("cannot take the pod out of the socket redirect", "cookie", r.NetnsCookie, "err", err)
	}
}

// CleanNetns removes what the stack left in the pod's namespace (the TUN,
// the divert) and its own namespace with the pod's link: standalone the
// veth goes with it; chained, the earlier plugin's interface goes back
// into the pod's namespace with its addresses, for that plugin's DEL. A
// pod namespace that is gone took its part with it. Attachments made
// when the link sat in the pod's namespace have no namespace of their
// own; for them the link and its ingress drop are undone in the pod's.
func (td *Teardown) CleanNetns() error {
	wirePath := td.WireNetns
	if wirePath == "" && td.NetnsDir != "" {
		wirePath = WirePath(td.NetnsDir, td.ContainerID, td.IfName)
	}
	wire := wirePath != "" && wirens.Exists(wirePath)
	podNS, err := td.openPodNS()
	if err != nil {
		return err
	}
	var errs []error
	if podNS != nil {
		defer podNS.Close()
		// The pod's link is ours only as the peer of this attachment's
		// veth: a DEL after an ADD that found CNI_IFNAME taken must leave
		// it. Looked up here, in the node's namespace.
		host := 0
		if !td.Chained {
			host = hostIndex(td.ContainerID, td.IfName)
		}
		if err := podNS.Do(func(ns.NetNS) error { return td.cleanPodNS(wire, host) }); err != nil {
			errs = append(errs, err)
		}
	}
	if wire {
		if td.Chained && podNS != nil {
			// Best effort, as restoreAddrs: a DEL failing here would
			// keep the pod from ever being deleted.
			if err := ReturnLink(wirePath, podNS, td.IfName, td.IPs); err != nil {
				td.log().Warn("cannot give the earlier plugin its interface back for its DEL", "err", err)
			}
		}
		if err := wirens.RemoveIn(td.MountNS, wirePath); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// openPodNS opens the pod's namespace; nil when there is none to clean.
func (td *Teardown) openPodNS() (ns.NetNS, error) {
	if td.Netns == "" {
		return nil, nil
	}
	netns, err := ns.GetNS(td.Netns)
	if err != nil {
		var notExist ns.NSPathNotExistErr
		var notNS ns.NSPathNotNSErr
		if errors.As(err, &notExist) || errors.As(err, &notNS) || errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("opening netns %s: %w", td.Netns, err)
	}
	if !isNetNS(netns) {
		netns.Close()
		return nil, nil // another kind of namespace: nothing of ours can be in it
	}
	return netns, nil
}

// cleanPodNS runs in the pod's namespace. wire says the pod's link is in
// the stack's own namespace, so that CNI_IFNAME here is the stack's TUN;
// host is the index of the attachment's node-side veth (hostIndex).
func (td *Teardown) cleanPodNS(wire bool, host int) error {
	for _, tun := range []string{td.TUNName, td.IfName} {
		if err := podkernel.DeleteTUN(tun); err != nil {
			return err
		}
	}
	if err := podkernel.RemoveDivert(); err != nil {
		return err
	}
	if wire {
		return nil
	}
	if err := ingressdrop.Remove(td.IfName); err != nil {
		return err
	}
	if td.Chained {
		// Best effort: a DEL failing here would keep the pod from ever
		// being deleted.
		if err := restoreAddrs(td.IfName, td.IPs); err != nil {
			td.log().Warn("cannot give the interface its addresses back for the earlier plugins' DEL", "err", err)
		}
	}
	if l, err := netlinksafe.LinkByName(td.IfName); err == nil && isPeerOf(l, host) {
		return DelLink(td.IfName)
	}
	return nil
}

// ReturnLink moves a chained attachment's interface out of the stack's
// namespace at wirePath back into the pod's, up and with its addresses,
// as the earlier plugin made it. Nothing to move is success.
func ReturnLink(wirePath string, podNS ns.NetNS, ifName string, cidrs []string) error {
	wire, err := ns.GetNS(wirePath)
	if err != nil {
		return nil
	}
	defer wire.Close()
	if err := wirens.MoveLink(wire, ifName, podNS); err != nil {
		if errors.Is(err, wirens.ErrNoLink) {
			return nil
		}
		return err
	}
	return podNS.Do(func(ns.NetNS) error { return restoreAddrs(ifName, cidrs) })
}

// releaseLease runs the IPAM plugin's DEL with the attachment's own
// identity (GC runs it for attachments other than the one in CNI_*).
func (td *Teardown) releaseLease() error {
	cniPath := td.CNIPath
	if cniPath == "" {
		cniPath = os.Getenv("CNI_PATH")
	}
	path, err := invoke.FindInPath(td.IPAMType, filepath.SplitList(cniPath))
	if err != nil {
		return fmt.Errorf("finding IPAM plugin %s: %w", td.IPAMType, err)
	}
	args := &invoke.Args{
		Command:     "DEL",
		ContainerID: td.ContainerID,
		NetNS:       td.Netns,
		IfName:      td.IfName,
		Path:        cniPath,
	}
	if err := invoke.ExecPluginWithoutResult(context.Background(), path, td.IPAMConf, args, nil); err != nil {
		return fmt.Errorf("releasing lease with %s: %w", td.IPAMType, err)
	}
	return nil
}

// DelLink deletes a link in the current namespace; already gone is success.
func DelLink(name string) error {
	// ENODEV: the kernel removed it between lookup and delete (a veth dies
	// with its peer's namespace, asynchronously).
	if err := ip.DelLinkByName(name); err != nil && !errors.Is(err, ip.ErrLinkNotFound) && !errors.Is(err, unix.ENODEV) {
		// DelLinkByName keeps only the message of the kernel's ENODEV.
		var nf netlink.LinkNotFoundError
		if _, lerr := netlinksafe.LinkByName(name); errors.As(lerr, &nf) {
			return nil
		}
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// isPeerOf reports whether link is the pod end of the veth whose node end
// has index hostIndex: only then is it this attachment's to delete.
func isPeerOf(link netlink.Link, hostIndex int) bool {
	if _, ok := link.(*netlink.Veth); !ok || hostIndex == 0 {
		return false
	}
	peer, err := netlink.VethPeerIndex(link.(*netlink.Veth))
	if err != nil {
		return link.Attrs().ParentIndex == hostIndex
	}
	return peer == hostIndex
}

// hostIndex is the index of the attachment's node-side veth in the
// calling thread's namespace; 0 when it is gone.
func hostIndex(containerID, ifName string) int {
	l, err := netlinksafe.LinkByName(HostVethName(containerID, ifName))
	if err != nil {
		return 0
	}
	return l.Attrs().Index
}

// isNetNS is false only for a namespace known to be of another type.
func isNetNS(netns ns.NetNS) bool {
	typ, err := unix.IoctlRetInt(int(netns.Fd()), unix.NS_GET_NSTYPE)
	return err != nil || typ == unix.CLONE_NEWNET
}

// restoreAddrs gives a chained attachment's interface back the addresses
// the earlier plugin put on it and the stack took over at ADD, so that the
// earlier plugins' DEL, which the runtime runs after ours, finds the
// interface as they left it. Some find what to undo by those addresses:
// bridge and ptp with ipMasq read them off the interface to remove the
// pod's masquerade rule, and leaked it (one iptables chain per pod) while
// the interface had none. It runs in the pod's network namespace; an
// interface that is gone needs nothing.
func restoreAddrs(ifName string, cidrs []string) error {
	link, err := netlink.LinkByName(ifName)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("finding %s: %w", ifName, err)
	}
	var errs []error
	for _, c := range cidrs {
		a, err := netlink.ParseAddr(c)
		if err != nil {
			errs = append(errs, fmt.Errorf("address %q: %w", c, err))
			continue
		}
		// (no duplicate address detection: the address was the pod's a
		// moment ago, and a tentative one may be skipped by a lister)
		a.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrReplace(link, a); err != nil {
			errs = append(errs, fmt.Errorf("putting %s back on %s: %w", c, ifName, err))
		}
	}
	return errors.Join(errs...)
}

// Reclaim undoes an attachment from its state alone: its stack, its
// namespace leftovers, its node-side veth, its IP lease and its files. The
// node agent uses it for attachments whose network namespace is gone
// without a DEL (a runtime that lost the pod, a reboot). The caller holds
// the attachment's lock. cniPath is where the IPAM plugin is found,
// mountNS the mount namespace the attachment's pins were made in
// (Teardown.MountNS).
func Reclaim(store state.Store, att *state.Attachment, cniPath, mountNS string, log *slog.Logger) error {
	td := Teardown{
		Store: store, Log: log, MountNS: mountNS,
		RunDir: filepath.Dir(att.ControlSocket), LogDir: filepath.Dir(att.LogPath),
		TUNName:     tunNameOf(att.ConfigPath),
		ContainerID: att.ContainerID, IfName: att.IfName, Netns: att.Netns, CNIPath: cniPath,
	}
	td.FromState(att)
	if err := td.Run(); err != nil {
		return fmt.Errorf("reclaiming %s/%s: %w", att.ContainerID, att.IfName, err)
	}
	return nil
}

// tunNameOf reads the TUN name from the stack's config; the default when
// the config is unreadable (the namespace, and the TUN with it, is usually
// gone by then anyway).
func tunNameOf(configPath string) string {
	var c stackconfig.Config
	if b, err := os.ReadFile(configPath); err == nil && json.Unmarshal(b, &c) == nil && c.TUNName != "" {
		return c.TUNName
	}
	return stackconfig.DefaultTUNName
}

func (td *Teardown) log() *slog.Logger {
	if td.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return td.Log
}

// removeAll is os.RemoveAll, tried again when a file appeared in a
// directory meanwhile: the node agent writes a pod's policy.json into its
// stack directory without the attachment's lock (ADD holds that lock while
// it waits for the agent), so a policy pass can land in the middle of DEL.
// That write cannot recreate the directory once it is gone. Without the
// retry such a DEL fails with "unlinkat .../stacks/<key>: directory not
// empty" and the runtime has to retry it (docs/RELIABILITY.md, pods
// churned with faults).
func removeAll(path string) error {
	var err error
	for range 5 {
		if err = os.RemoveAll(path); !errors.Is(err, unix.ENOTEMPTY) {
			return err
		}
	}
	return err
}
