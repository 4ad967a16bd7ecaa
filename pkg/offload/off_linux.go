package offload

import (
	"fmt"
	"path"

	"golang.org/x/sys/unix"
)

// offPatterns are the features "ethtool -K dev tso off gso off sg off"
// turns off: ethtool(8) expands each legacy name to the netdev features
// its pattern matches (off_flag_def in ethtool.c), so that newer TSO
// variants (tx-tcp-accecn-segmentation …) go off too, which the legacy
// ETHTOOL_STSO command does not do.
var offPatterns = []string{
	"tx-tcp*-segmentation",    // tso
	"tx-generic-segmentation", // gso
	"tx-scatter-gather*",      // sg
}

func turnedOff(name string) bool {
	for _, p := range offPatterns {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// LinkOffloadsOff turns TCP segmentation offload, generic segmentation
// offload and scatter-gather off on ifName in the calling thread's network
// namespace, as "ethtool -K ifName tso off gso off sg off" does, through
// the ethtool ioctl rather than ethtool(8), which neither the image nor
// every node has.
func LinkOffloadsOff(ifName string) error {
	if len(ifName) >= unix.IFNAMSIZ {
		return fmt.Errorf("interface name %q longer than %d bytes", ifName, unix.IFNAMSIZ-1)
	}
	fd, err := ioctlSocket()
	if err != nil {
		return fmt.Errorf("turning offloads off on %s: %w", ifName, err)
	}
	defer unix.Close(fd)
	names, err := featureNames(fd, ifName)
	if err != nil {
		return fmt.Errorf("turning offloads off on %s: %w", ifName, err)
	}
	if err := setFeaturesOff(fd, ifName, len(names), func(bit int) bool { return turnedOff(names[bit]) }); err != nil {
		return fmt.Errorf("turning offloads off on %s: %w", ifName, err)
	}
	return nil
}
