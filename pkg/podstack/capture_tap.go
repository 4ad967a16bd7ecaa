package podstack

import (
	"net/http"

	"github.com/cni-usernet/cni-usernet/pkg/capture"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// wireTap is the capture tap, named here so that podstack.go needs no
// import for it.
type wireTap = capture.Tap

// tapWire puts the capture tap around the wire leg's link, whatever link
// that is: below the counters and the SYN admission cap, so that a capture
// shows what arrived on the wire, shed SYNs included, and what left.
func (s *Stack) tapWire(ep stack.LinkEndpoint) stack.LinkEndpoint {
	s.Capture = capture.NewTap(ep)
	return s.Capture
}

// CaptureHandler implements control.Capturer: `cni-usernet capture`
// streams the wire leg from here.
func (d *Daemon) CaptureHandler() http.Handler { return d.stack.Capture }
