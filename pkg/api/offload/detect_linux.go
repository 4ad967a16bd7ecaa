package offload

import (
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
)

// Detect reads the segmentation offload of the link named ifName in the
// network namespace of the calling thread: gso_max_size and gso_max_segs
// over rtnetlink, the GSO and TSO features over the SIOCETHTOOL ioctl.
// It changes nothing. Callers that switch namespaces must hold the OS
// thread (ns.Do does).
func Detect(ifName string) (LinkGSO, error) {
	link, err := netlinksafe.LinkByName(ifName)
	if err != nil {
		return LinkGSO{}, fmt.Errorf("looking up link %s: %w", ifName, err)
	}
	attrs := link.Attrs()
	l := LinkGSO{MaxSize: attrs.GSOMaxSize, MaxSegs: attrs.GSOMaxSegs}
	if l.GSO, l.TSO, err = ethtoolSegmentation(ifName); err != nil {
		return LinkGSO{}, fmt.Errorf("reading offload features of %s: %w", ifName, err)
	}
	return l, nil
}
