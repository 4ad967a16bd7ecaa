package ethtool

import (
	"bytes"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtoolStringLen is ETH_GSTRING_LEN, the size of one name in a string
// set.
const ethtoolStringLen = 32

// ethSSFeatures is ETH_SS_FEATURES from enum ethtool_stringset.
const ethSSFeatures = 4

// featureNames returns the names of ifName's netdev features (the string
// set ETH_SS_FEATURES, "tx-tcp-segmentation" …), indexed by feature bit.
func featureNames(fd int, ifName string) ([]string, error) {
	// struct ethtool_sset_info with room for one count in data[].
	var info struct {
		cmd      uint32
		reserved uint32
		mask     uint64
		count    uint32
	}
	info.cmd = unix.ETHTOOL_GSSET_INFO
	info.mask = 1 << ethSSFeatures
	if err := ethtoolIoctlPtr(fd, ifName, unsafe.Pointer(&info)); err != nil {
		return nil, fmt.Errorf("ETHTOOL_GSSET_INFO: %w", err)
	}
	if info.mask == 0 {
		return nil, fmt.Errorf("ETHTOOL_GSSET_INFO: %s has no feature names", ifName)
	}
	n := int(info.count)
	// struct ethtool_gstrings: cmd, string_set, len, then len names.
	buf := make([]byte, 12+n*ethtoolStringLen)
	*(*uint32)(unsafe.Pointer(&buf[0])) = unix.ETHTOOL_GSTRINGS
	*(*uint32)(unsafe.Pointer(&buf[4])) = ethSSFeatures
	*(*uint32)(unsafe.Pointer(&buf[8])) = uint32(n)
	if err := ethtoolIoctlPtr(fd, ifName, unsafe.Pointer(&buf[0])); err != nil {
		return nil, fmt.Errorf("ETHTOOL_GSTRINGS: %w", err)
	}
	if got := int(*(*uint32)(unsafe.Pointer(&buf[8]))); got < n {
		n = got
	}
	names := make([]string, n)
	for i := range names {
		s := buf[12+i*ethtoolStringLen : 12+(i+1)*ethtoolStringLen]
		if j := bytes.IndexByte(s, 0); j >= 0 {
			s = s[:j]
		}
		names[i] = string(s)
	}
	return names, nil
}

// featureBlocks is the number of 32-bit blocks that hold n feature bits.
func featureBlocks(n int) int { return (n + 31) / 32 }

// setFeaturesOff asks the kernel to turn the features for which off says
// true off (ETHTOOL_SFEATURES), leaving all others as they are.
func setFeaturesOff(fd int, ifName string, nbits int, off func(bit int) bool) error {
	return setFeatures(fd, ifName, nbits, off, false)
}

// setFeatures asks the kernel to turn the features for which which says
// true on or off (ETHTOOL_SFEATURES), leaving all others as they are.
func setFeatures(fd int, ifName string, nbits int, which func(bit int) bool, on bool) error {
	blocks := featureBlocks(nbits)
	// struct ethtool_sfeatures: cmd, size, then {valid, requested} blocks.
	buf := make([]uint32, 2+2*blocks)
	buf[0] = unix.ETHTOOL_SFEATURES
	buf[1] = uint32(blocks)
	for bit := range nbits {
		if which(bit) {
			buf[2+2*(bit/32)] |= 1 << (bit % 32) // valid
			if on {
				buf[2+2*(bit/32)+1] |= 1 << (bit % 32) // requested
			}
		}
	}
	if err := ethtoolIoctlPtr(fd, ifName, unsafe.Pointer(&buf[0])); err != nil {
		return fmt.Errorf("ETHTOOL_SFEATURES: %w", err)
	}
	return nil
}

// activeFeatures reads which of ifName's nbits features are active
// (ETHTOOL_GFEATURES).
func activeFeatures(fd int, ifName string, nbits int) ([]bool, error) {
	blocks := featureBlocks(nbits)
	// struct ethtool_gfeatures: cmd, size, then {available, requested,
	// active, never_changed} blocks.
	buf := make([]uint32, 2+4*blocks)
	buf[0] = unix.ETHTOOL_GFEATURES
	buf[1] = uint32(blocks)
	if err := ethtoolIoctlPtr(fd, ifName, unsafe.Pointer(&buf[0])); err != nil {
		return nil, fmt.Errorf("ETHTOOL_GFEATURES: %w", err)
	}
	active := make([]bool, nbits)
	for bit := range active {
		active[bit] = buf[2+4*(bit/32)+2]&(1<<(bit%32)) != 0
	}
	return active, nil
}
