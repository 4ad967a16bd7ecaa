package ethtool

import (
	"fmt"
	"path"
	"slices"

	"golang.org/x/sys/unix"
)

// offPatterns are the features "ethtool -K dev tso off gso off sg off"
// turns off: ethtool(8) expands each legacy name to the netdev features
// its pattern matches (off_flag_def in ethtool.c), so that newer TSO
// variants (tx-tcp-accecn-segmentation …) go off too, which the legacy
// ETHTOOL_STSO command does not do.
var offPatterns = []string{
	tsoPattern,
	"tx-generic-segmentation", // gso
	"tx-scatter-gather*",      // sg
}

// tsoPattern is what "ethtool -K dev tso off" turns off.
const tsoPattern = "tx-tcp*-segmentation"

func matchesAny(name string, patterns []string) bool {
	for _, p := range patterns {
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
	if err := featuresOff(ifName, offPatterns); err != nil {
		return fmt.Errorf("turning offloads off on %s: %w", ifName, err)
	}
	return nil
}

// LinkTSOOff turns TCP segmentation offload off on ifName, as "ethtool -K
// ifName tso off" does, so that the GSO packets the stack hands the kernel
// in ModeSoftware are segmented by the kernel's GSO before the device
// rather than passed to it whole. Generic segmentation offload and
// scatter-gather stay on: the kernel's GSO then splits a packet without
// copying its payload.
func LinkTSOOff(ifName string) error {
	if err := featuresOff(ifName, []string{tsoPattern}); err != nil {
		return fmt.Errorf("turning TSO off on %s: %w", ifName, err)
	}
	return nil
}

// LinkGROOn turns generic receive offload on for ifName, as "ethtool -K
// ifName gro on" does. On the node's end of a pod's veth it has the node
// receive what the pod's stack sends in software mode as the aggregates
// the stack handed its kernel, not as the MTU-sized segments the kernel's
// GSO cut them into: a veth with GRO on receives through NAPI, which
// merges a burst's segments before the node's TCP sees them. It reports
// whether GRO is on afterwards (a device may keep it fixed off).
func LinkGROOn(ifName string) (on bool, err error) {
	err = withFeatures(ifName, func(fd int, names []string) error {
		gro := slices.Index(names, groFeature)
		if gro < 0 {
			return fmt.Errorf("no %s feature", groFeature)
		}
		if err := setFeatures(fd, ifName, len(names), func(bit int) bool { return bit == gro }, true); err != nil {
			return err
		}
		active, err := activeFeatures(fd, ifName, len(names))
		if err != nil {
			return err
		}
		on = active[gro]
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("turning GRO on on %s: %w", ifName, err)
	}
	return on, nil
}

// groFeature is what "ethtool -K dev gro" sets.
const groFeature = "rx-gro"

// featuresOff turns off the features of ifName whose names match patterns.
func featuresOff(ifName string, patterns []string) error {
	return withFeatures(ifName, func(fd int, names []string) error {
		return setFeaturesOff(fd, ifName, len(names), func(bit int) bool { return matchesAny(names[bit], patterns) })
	})
}

// withFeatures runs do with an ethtool ioctl socket and the names of
// ifName's features, indexed by their bit.
func withFeatures(ifName string, do func(fd int, names []string) error) error {
	if len(ifName) >= unix.IFNAMSIZ {
		return fmt.Errorf("interface name %q longer than %d bytes", ifName, unix.IFNAMSIZ-1)
	}
	fd, err := ioctlSocket()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	names, err := featureNames(fd, ifName)
	if err != nil {
		return err
	}
	return do(fd, names)
}
