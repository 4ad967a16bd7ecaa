package podkernel

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// neighList is netlink.NeighList retried when the kernel flags the dump
// as interrupted (NLM_F_DUMP_INTR: the table changed while it was read),
// as netlinksafe does for the dumps it wraps; it has no NeighList. After
// the last attempt the possibly inconsistent answer is used, as
// netlinksafe does, rather than failing ADD.
func neighList(linkIndex, family int) ([]netlink.Neigh, error) {
	var (
		neighs []netlink.Neigh
		err    error
	)
	for range 5 {
		if neighs, err = netlink.NeighList(linkIndex, family); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return neighs, err
		}
	}
	return neighs, nil
}
