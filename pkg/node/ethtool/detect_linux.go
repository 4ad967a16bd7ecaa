package ethtool

import (
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
)

// Detect reads the segmentation offload of the link named ifName in the
// network namespace of the calling thread: gso_max_size and gso_max_segs
// over rtnetlink, the GSO and TSO features over the SIOCETHTOOL ioctl.
// It changes nothing. Callers that switch namespaces must hold the OS
// thread (ns.Do does).
func Detect(ifName string) (offload.LinkGSO, error) {
	link, err := netlinksafe.LinkByName(ifName)
	if err != nil {
		return offload.LinkGSO{}, fmt.Errorf("looking up link %s: %w", ifName, err)
	}
	attrs := link.Attrs()
	l := offload.LinkGSO{MaxSize: attrs.GSOMaxSize, MaxSegs: attrs.GSOMaxSegs}
	if l.GSO, l.TSO, err = ethtoolSegmentation(ifName); err != nil {
		return offload.LinkGSO{}, fmt.Errorf("reading offload features of %s: %w", ifName, err)
	}
	return l, nil
}
