package ethtool

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtoolValue mirrors struct ethtool_value from <linux/ethtool.h>, the
// argument of the legacy one-feature commands (ETHTOOL_[GS]GSO, _[GS]TSO,
// _[GS]SG).
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqData mirrors struct ifreq with its union used as ifr_data. It is a
// separate type from a byte array so the pointer stays visible to the
// garbage collector for the duration of the ioctl.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	// Pad the union to its kernel size of 24 bytes.
	_ [24 - unsafe.Sizeof(unsafe.Pointer(nil))]byte
}

// ioctlFamilies are tried in order for the socket that carries SIOCETHTOOL.
// The ioctl only needs a socket in the right network namespace: AF_INET is
// what ethtool(8) uses, AF_UNIX its fallback when IPv4 is compiled out, and
// AF_NETLINK a last resort; all of them pass SIOCETHTOOL to dev_ioctl.
var ioctlFamilies = []struct{ domain, typ, proto int }{
	{unix.AF_INET, unix.SOCK_DGRAM, 0},
	{unix.AF_UNIX, unix.SOCK_DGRAM, 0},
	{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE},
}

// ethtoolSegmentation reads the generic-segmentation-offload and
// tcp-segmentation-offload features of ifName in the calling thread's
// network namespace.
func ethtoolSegmentation(ifName string) (gso, tso bool, err error) {
	if len(ifName) >= unix.IFNAMSIZ {
		return false, false, fmt.Errorf("interface name %q longer than %d bytes", ifName, unix.IFNAMSIZ-1)
	}
	fd, err := ioctlSocket()
	if err != nil {
		return false, false, err
	}
	defer unix.Close(fd)

	if gso, err = ethtoolGet(fd, ifName, unix.ETHTOOL_GGSO); err != nil {
		return false, false, fmt.Errorf("ETHTOOL_GGSO: %w", err)
	}
	if tso, err = ethtoolGet(fd, ifName, unix.ETHTOOL_GTSO); err != nil {
		return false, false, fmt.Errorf("ETHTOOL_GTSO: %w", err)
	}
	return gso, tso, nil
}

func ioctlSocket() (int, error) {
	var errs error
	for _, f := range ioctlFamilies {
		fd, err := unix.Socket(f.domain, f.typ|unix.SOCK_CLOEXEC, f.proto)
		if err == nil {
			return fd, nil
		}
		errs = errors.Join(errs, err)
	}
	return -1, fmt.Errorf("opening a socket for SIOCETHTOOL: %w", errs)
}

// ethtoolGet issues one ethtool "get value" command on ifName.
func ethtoolGet(fd int, ifName string, cmd uint32) (bool, error) {
	v := ethtoolValue{cmd: cmd}
	if err := ethtoolIoctl(fd, ifName, &v); err != nil {
		return false, err
	}
	return v.data != 0, nil
}

// ethtoolSet issues one ethtool "set value" command on ifName.
func ethtoolSet(fd int, ifName string, cmd uint32, on bool) error {
	v := ethtoolValue{cmd: cmd}
	if on {
		v.data = 1
	}
	return ethtoolIoctl(fd, ifName, &v)
}

func ethtoolIoctl(fd int, ifName string, v *ethtoolValue) error {
	return ethtoolIoctlPtr(fd, ifName, unsafe.Pointer(v))
}

// ethtoolIoctlPtr issues SIOCETHTOOL on ifName with data, an ethtool
// command structure that starts with its cmd.
func ethtoolIoctlPtr(fd int, ifName string, data unsafe.Pointer) error {
	var ifr ifreqData
	copy(ifr.name[:], ifName)
	ifr.data = data
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	if errno != 0 {
		return errno
	}
	return nil
}
