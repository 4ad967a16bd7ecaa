package cni

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/cni-usernet/cni-usernet/pkg/api/kube"
	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/sockmap"
)

// redirectLock serialises the ADDs that find the node's socket redirect
// not loaded yet.
const redirectLock = "sockmap.lock"

// redirect puts the pod's namespace in the node's socket redirect
// (pkg/node/sockmap) when the pod asks for it, loading the programs on
// the node's first ADD. A kernel that cannot, or any other failure,
// leaves the pod on loopback TCP, as the record, a log line and an Event
// say: the redirect is speed, never the pod's network.
func (a *addition) redirect() {
	mode, source, _ := a.conf.SocketRedirectMode() // checked in prepareAdd
	r := &state.SocketRedirect{Reason: source}
	a.att.SocketRedirect = r
	if mode == netconf.SocketRedirectOff {
		return
	}
	both := mode == netconf.SocketRedirectBoth
	direct := mode == netconf.SocketRedirectDirect
	cookie, err := a.enableRedirect(r, both, direct)
	if err != nil {
		r.Reason = err.Error()
		a.log.Warn("socket redirect off: the pod's loopback connections use TCP", "err", err)
		if !errors.Is(err, sockmap.ErrUnsupported) {
			a.event(kube.EventWarning, "SocketRedirectOff", fmt.Sprintf("socket redirect off: %v; the pod's loopback connections use TCP", err))
		}
		return
	}
	r.On, r.Both, r.Direct, r.BPFDir, r.NetnsCookie = true, both, direct, a.conf.BPFDir, cookie
	a.undo.add(func() { disableRedirect(r) })
	a.step("redirect")
}

// enableRedirect puts the pod in the node's redirect; a direct pod's
// link gets the service program too (r says whether it did).
func (a *addition) enableRedirect(r *state.SocketRedirect, both, direct bool) (uint64, error) {
	node, err := sockmap.Load(a.conf.BPFDir, filepath.Join(a.conf.RunDir, redirectLock))
	if err != nil {
		return 0, err
	}
	defer node.Close()
	cookie, err := sockmap.NetnsCookie(a.att.Netns)
	if err != nil {
		return 0, err
	}
	if !direct {
		return cookie, node.Enable(cookie, both)
	}
	addrs, err := podAddrs(a.att.IPs)
	if err != nil {
		return 0, err
	}
	if err := node.EnableDirect(cookie, addrs); err != nil {
		return 0, err
	}
	a.joinServices(node, r)
	return cookie, nil
}

// joinServices puts the node's service program on the node's end of a
// direct pod's link, so that connections to the pod through a Service's
// cluster IP join too. A chained pod's link is the earlier plugin's, and
// a kernel may lack what the program reads: the pod then joins only
// connections to its own address, and the record says why.
func (a *addition) joinServices(node *sockmap.Node, r *state.SocketRedirect) {
	if a.att.HostVeth == "" {
		r.ServicesOff = "chained: the node's end of the pod's link is the earlier plugin's"
		return
	}
	if err := node.AttachServices(a.att.HostVeth); err != nil {
		r.ServicesOff = err.Error()
		a.log.Warn("socket redirect direct: connections through a Service's cluster IP keep the stacks", "err", err)
		return
	}
	r.Services = true
}

// podAddrs are the addresses of the pod's CIDRs, which the direct
// redirect registers as the pod's.
func podAddrs(cidrs []string) ([]netip.Addr, error) {
	out := make([]netip.Addr, 0, len(cidrs))
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("reading the pod's address %q: %w", c, err)
		}
		out = append(out, p.Addr())
	}
	return out, nil
}

// disableRedirect undoes enableRedirect for an ADD that failed after it.
func disableRedirect(r *state.SocketRedirect) {
	if node, err := sockmap.Open(r.BPFDir); err == nil {
		node.Disable(r.NetnsCookie)
		node.Close()
	}
}
