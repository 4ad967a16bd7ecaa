package plugin

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

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
