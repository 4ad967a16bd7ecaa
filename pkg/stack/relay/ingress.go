package relay

import (
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"gvisor.dev/gvisor/pkg/tcpip"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// The wire leg takes the ingress verdict on a SYN before netstack sees it
// (podstack's admitIngress), but a connection can complete without a SYN
// the verdict saw: a mirrored listener completes a handshake from an ACK
// that carries a valid SYN cookie, whoever sent the SYN it answers (the
// fast path's cookies, netstack's own under a full backlog), and the
// policy may change between a SYN and its ACK. So the relay takes the
// verdict again on every connection it accepts, before the application
// is dialled: one lookup per connection, against the dial that follows.

// ingressAllowed takes the ingress verdict on the connection or flow id
// of IP protocol proto, counting a denial.
func (e *env) ingressAllowed(id tcpipstack.TransportEndpointID, proto uint8) bool {
	m := e.opts.Policy.For(policy.Ingress)
	if m == nil {
		return true
	}
	return m.CheckFlow(policy.Flow{Dir: policy.Ingress, Proto: proto, Peer: addrPort(id.RemoteAddress, 0).Addr(),
		Port: id.LocalPort, Local: addrPort(id.LocalAddress, 0).Addr()})
}

// silentAbortWait bounds abortSilently's wait for netstack's timer, which
// fires at once; past it the connection is reset instead.
const silentAbortWait = time.Second

// abortSilently ends an established wire connection without sending the
// peer anything, as a drop would: netstack's Abort answers with a RST and
// its Close with a FIN, either of which tells a peer the policy denies
// that something listens. netstack ends a connection whose keepalive
// probes all went unanswered as timed out, without a RST; with a probe
// count of zero and an idle time of a nanosecond, its keepalive timer
// does that at once, before any probe is sent. Close then finds the
// connection already closed. This leans on how netstack treats a
// keepalive timeout; TestCookieHandshakeTakesIngressVerdict sees the RST
// of the fallback below if a gVisor update changes it.
func abortSilently(ep tcpip.Endpoint, wq *waiter.Queue) {
	entry, failed := waiter.NewChannelEntry(waiter.EventHUp | waiter.EventErr)
	wq.EventRegister(&entry)
	defer wq.EventUnregister(&entry)
	idle := tcpip.KeepaliveIdleOption(time.Nanosecond)
	if ep.SetSockOptInt(tcpip.KeepaliveCountOption, 0) == nil && ep.SetSockOpt(&idle) == nil {
		ep.SocketOptions().SetKeepAlive(true)
		t := time.NewTimer(silentAbortWait)
		defer t.Stop()
		select {
		case <-failed:
		case <-t.C:
		}
	}
	if s := tcp.EndpointState(ep.State()); s != tcp.StateError && s != tcp.StateClose {
		ep.Abort()
	}
	ep.Close()
}
