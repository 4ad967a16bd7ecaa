package podstack

import (
	"github.com/cni-usernet/cni-usernet/pkg/stack/tap"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// wireTap is the capture tap, named here so that podstack.go needs no
// import for it.
type wireTap = tap.Tap

// tapWire puts the capture tap around the wire leg's link, whatever link
// that is: below the counters and the SYN admission cap, so that a capture
// shows what arrived on the wire, shed SYNs included, and what left.
func (s *Stack) tapWire(ep tcpipstack.LinkEndpoint) *wireTap {
	s.Capture = tap.NewTap(ep)
	return s.Capture
}
