package cni

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// openNetNS opens CNI_NETNS and makes sure it is a network namespace:
// ns.GetNS accepts any nsfs file, and a mount or PID namespace would only
// fail at the first setns, after the IP lease was taken.
func openNetNS(path string) (ns.NetNS, error) {
	const want = "the path of the pod's network namespace, e.g. /var/run/netns/NAME or /proc/PID/ns/net"
	netns, err := ns.GetNS(path)
	if err != nil {
		var notExist ns.NSPathNotExistErr
		var notNS ns.NSPathNotNSErr
		switch {
		case errors.As(err, &notExist):
			return nil, errorf(types.ErrInvalidNetNS, "CNI_NETNS %q does not exist, want %s", path, want)
		case errors.As(err, &notNS):
			return nil, errorf(types.ErrInvalidNetNS, "CNI_NETNS %q is not a namespace (%v), want %s", path, err, want)
		}
		return nil, errorf(types.ErrInvalidNetNS, "opening CNI_NETNS %q: %v", path, err)
	}
	typ, err := unix.IoctlRetInt(int(netns.Fd()), unix.NS_GET_NSTYPE)
	switch {
	case errors.Is(err, syscall.ENOTTY):
		// Before Linux 4.11 the type cannot be asked; setns will tell.
	case err != nil:
		netns.Close()
		return nil, errorf(types.ErrInvalidNetNS, "reading the namespace type of CNI_NETNS %q: %v", path, err)
	case typ != unix.CLONE_NEWNET:
		netns.Close()
		return nil, errorf(types.ErrInvalidNetNS, "CNI_NETNS %q is a %s namespace, want %s", path, nsTypeName(typ), want)
	}
	return netns, nil
}

func nsTypeName(t int) string {
	switch t {
	case unix.CLONE_NEWNS:
		return "mount"
	case unix.CLONE_NEWPID:
		return "PID"
	case unix.CLONE_NEWUTS:
		return "UTS"
	case unix.CLONE_NEWIPC:
		return "IPC"
	case unix.CLONE_NEWUSER:
		return "user"
	case unix.CLONE_NEWCGROUP:
		return "cgroup"
	case unix.CLONE_NEWTIME:
		return "time"
	}
	return fmt.Sprintf("non-network (type %#x)", t)
}

// linkInTheWay describes a link named ifName already in netns, "" when
// there is none. Standalone ADD creates the pod's interface itself; it
// must not take, rename or delete one it did not make.
func linkInTheWay(netns ns.NetNS, ifName string) (string, error) {
	var desc string
	err := netns.Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName(ifName)
		if err != nil {
			if errors.As(err, &netlink.LinkNotFoundError{}) {
				return nil
			}
			return fmt.Errorf("looking up %s in %s: %w", ifName, netns.Path(), err)
		}
		var addrs []string
		if as, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL); err == nil {
			for _, a := range as {
				if !a.IP.IsLinkLocalUnicast() {
					addrs = append(addrs, a.IPNet.String())
				}
			}
		}
		desc = fmt.Sprintf("a %s link", l.Type())
		if len(addrs) > 0 {
			desc += " with " + strings.Join(addrs, ", ")
		}
		return nil
	})
	return desc, err
}

// errLinkInTheWay is ADD's answer to an interface it would have to create
// but finds already there. Code 999: the CNI spec has no code for it, and
// nothing in the configuration or the variables is wrong by itself.
func errLinkInTheWay(ifName, netnsPath, desc string) error {
	return errorf(types.ErrInternal,
		"interface %q already exists in netns %s (%s); cni-usernet creates the pod's interface itself and leaves this one alone: "+
			"remove it, choose another CNI_IFNAME, or chain cni-usernet after the plugin that made it (the conflist passes its prevResult)",
		ifName, netnsPath, desc)
}
