package relay

import (
	"bytes"
	"container/list"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/podsock"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// maxDatagram is the largest UDP payload IPv4 or IPv6 (without jumbograms)
// can carry.
const maxDatagram = 65535

var datagramPool = sync.Pool{New: func() any { b := make([]byte, maxDatagram); return &b }}

// udpRelay relays UDP flows, each between a wire endpoint and a socket in
// the pod's kernel, and owns the table that bounds them.
type udpRelay struct {
	*env
	flows udpTable
}

func newUDPRelay(e *env) *udpRelay {
	u := &udpRelay{env: e}
	u.flows.init(e.opts.MaxUDP, e.opts.MaxUDPUnreplied)
	return u
}

// forwardInbound opens a flow for a datagram from the network: the wire
// endpoint the forwarder creates, and a pod socket bound to the sender's
// address and port, connected to the application, so that both ends see
// their real peer. Flows from the network may be evicted until answered.
func (u *udpRelay) forwardInbound(req *udp.ForwarderRequest) bool {
	id := req.ID()
	if !u.ingressAllowed(id, policy.ProtoUDP) {
		return true // dropped: no flow, and no port unreachable either
	}
	f, ok := u.newFlow(true)
	if !ok {
		return true
	}
	f.key = flowKey{app: addrPort(id.LocalAddress, id.LocalPort), remote: addrPort(id.RemoteAddress, id.RemotePort)}
	pod, err := u.podSocket(f.key)
	if err != nil {
		u.dropFlow(f, "opening a pod socket for a UDP flow", err)
		return true
	}
	wq := new(waiter.Queue)
	// CreateEndpoint delivers the datagram that opened the flow into the
	// new endpoint, so it is relayed like every later one.
	ep, terr := req.CreateEndpoint(wq)
	if terr != nil {
		if pod != nil {
			pod.Close()
		}
		u.dropFlow(f, "creating a wire endpoint for a UDP flow", nil)
		return true
	}
	u.flows.index(f)
	u.runFlow(f, udpEnd{ep, wq}, pod)
	return true
}

// podSocket opens the socket that carries flow k's datagrams to and from
// the application: bound to the remote's address and port, connected to
// the application's. When the pod's kernel refuses the binding because an
// application holds that port on every address (a DNS server on :53 that
// also queries an upstream on port 53), it returns nil, nil: the flow then
// writes its datagrams into the TUN, and the application's answers reach
// the UDP listeners (see readOutbound).
func (u *udpRelay) podSocket(k flowKey) (*net.UDPConn, error) {
	pod, err := u.pod.Dialer.DialUDP(k.remote, k.app)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, nil
	}
	return pod, err
}

// readOutbound receives the applications' datagrams to peers without a
// flow (the divert rules hand them to l with their original destination),
// opens a flow for each new peer, and relays the datagram. Once a flow's
// pod socket is bound, the kernel delivers the flow's datagrams to it, not
// to l.
func (u *udpRelay) readOutbound(l *net.UDPConn) {
	defer u.wg.Done()
	buf := make([]byte, maxDatagram)
	oob := make([]byte, podsock.OrigDstOOBSize)
	for {
		n, src, dst, err := podsock.ReadOrigDst(l, buf, oob)
		if err != nil {
			if u.closing.Load() {
				return
			}
			u.opts.Logger.Debug("reading the applications' datagrams", "err", err)
			continue
		}
		k := flowKey{app: src, remote: dst}
		f := u.flows.lookup(k)
		if f == nil {
			// Only a new flow needs the check: every flow's key holds a
			// source that passed it, so a foreign one finds no flow.
			if !u.fromPodSocket(src.Addr()) {
				continue // a transparent socket bound to a foreign address
			}
			if f = u.openOutbound(k); f == nil {
				continue
			}
		}
		f.touch()
		if f.inbound {
			f.sawReply()
		}
		u.stats.FromAppBytes.Add(int64(n))
		if _, werr := f.wire.ep.Write(bytes.NewReader(buf[:n]), tcpip.WriteOptions{}); werr != nil {
			u.stats.UDPDropped.Add(1)
		}
	}
}

// openOutbound opens the flow k for an application's datagram, when
// the egress policy allows it; the wire leg's end goes to the allowed
// backend when k.remote is a Service VIP, the pod's end keeps k.
func (u *udpRelay) openOutbound(k flowKey) *udpFlow {
	dst, ok := u.egressTo(k, policy.ProtoUDP)
	if !ok {
		return nil
	}
	f, ok := u.newFlow(false)
	if !ok {
		return nil
	}
	wq, ep, terr := dialUDP(u.wire, tcpip.FullAddress{NIC: u.wire.NIC, Addr: tcpipAddr(k.app.Addr()), Port: k.app.Port()},
		tcpip.FullAddress{Addr: tcpipAddr(dst.Addr()), Port: dst.Port()}, netProto(tcpipAddr(dst.Addr())))
	if terr != nil {
		u.dropFlow(f, "opening a wire endpoint for a UDP flow", nil)
		return nil
	}
	pod, err := u.podSocket(k)
	if err != nil {
		ep.Close()
		u.dropFlow(f, "opening a pod socket for a UDP flow", err)
		return nil
	}
	f.key = k
	u.flows.index(f)
	u.runFlow(f, udpEnd{ep, wq}, pod)
	return f
}

// newFlow admits a flow against the limits.
func (u *udpRelay) newFlow(inbound bool) (*udpFlow, bool) {
	if u.closing.Load() {
		return nil, false
	}
	f := &udpFlow{u: u, inbound: inbound, done: make(chan struct{})}
	ok, evicted := u.flows.admit(f, inbound)
	if !ok {
		u.stats.UDPLimitHit.Add(1)
		return nil, false
	}
	if evicted != nil {
		u.stats.UDPEvicted.Add(1)
		evicted.Close()
	}
	u.stats.UDPActive.Add(1)
	return f, true
}

func (u *udpRelay) dropFlow(f *udpFlow, what string, err error) {
	u.flows.remove(f)
	u.stats.UDPActive.Add(-1)
	u.stats.UDPDropped.Add(1)
	if err != nil {
		u.opts.Logger.Debug(what, "err", err)
	}
}

func (u *udpRelay) runFlow(f *udpFlow, wire udpEnd, pod *net.UDPConn) {
	f.wire, f.pod = wire, pod
	u.stats.UDPTotal.Add(1)
	f.touch()
	u.conns.add(f)
	go f.run()
}

// udpTable counts live UDP flows against MaxUDP. Flows from the network
// that have never carried a reply are kept oldest first, at most
// MaxUDPUnreplied of them, so that a flood of datagrams that each open a
// flow (to many ports, from many sources) evicts its own oldest flows
// instead of locking new ones out for the idle time; a flow that was
// answered, or that the pod's applications opened, is never evicted.
// Every flow is also indexed by its addresses, for the application's
// datagrams that reach the UDP listeners: before the flow's socket is
// bound, or always for a flow that has none (see podSocket).
type udpTable struct {
	max, maxUnreplied int
	mu                sync.Mutex // guards n, unreplied, byKey and the flows' elem and counted
	n                 int        // admitted flows not yet removed or evicted
	unreplied         list.List  // of *udpFlow, oldest first
	byKey             map[flowKey]*udpFlow
}

func (t *udpTable) init(max, maxUnreplied int) {
	t.max, t.maxUnreplied = max, maxUnreplied
	t.byKey = make(map[flowKey]*udpFlow)
}

// admit counts f in, evicting the oldest unanswered inbound flow when
// either limit is reached. The caller closes the evicted flow.
func (t *udpTable) admit(f *udpFlow, inbound bool) (ok bool, evicted *udpFlow) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n >= t.max || (inbound && t.unreplied.Len() >= t.maxUnreplied) {
		oldest := t.unreplied.Front()
		if oldest == nil {
			return false, nil
		}
		evicted = t.unreplied.Remove(oldest).(*udpFlow)
		evicted.elem, evicted.counted = nil, false
		t.n--
	}
	t.n++
	f.counted = true
	if inbound {
		f.elem = t.unreplied.PushBack(f)
	}
	return true, evicted
}

func (t *udpTable) index(f *udpFlow) {
	t.mu.Lock()
	t.byKey[f.key] = f
	t.mu.Unlock()
}

func (t *udpTable) lookup(k flowKey) *udpFlow {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byKey[k]
}

// replied makes f immune to eviction.
func (t *udpTable) replied(f *udpFlow) {
	t.mu.Lock()
	if f.elem != nil {
		t.unreplied.Remove(f.elem)
		f.elem = nil
	}
	t.mu.Unlock()
}

// remove counts f out; removing an evicted flow is harmless.
func (t *udpTable) remove(f *udpFlow) {
	t.mu.Lock()
	if f.elem != nil {
		t.unreplied.Remove(f.elem)
		f.elem = nil
	}
	if f.counted {
		t.n--
		f.counted = false
	}
	if f.key.app.IsValid() && t.byKey[f.key] == f {
		delete(t.byKey, f.key)
	}
	t.mu.Unlock()
}

func dialUDP(leg Leg, local, remote tcpip.FullAddress, proto tcpip.NetworkProtocolNumber) (*waiter.Queue, tcpip.Endpoint, tcpip.Error) {
	wq := new(waiter.Queue)
	ep, err := leg.Stack.NewEndpoint(udp.ProtocolNumber, proto, wq)
	if err != nil {
		return nil, nil, err
	}
	// One application socket may talk to many peers from one port: each
	// peer is its own flow, each binding the same local address and port.
	ep.SocketOptions().SetReuseAddress(true)
	ep.SocketOptions().SetReusePort(true)
	if err := ep.Bind(local); err != nil {
		ep.Close()
		return nil, nil, err
	}
	if err := ep.Connect(remote); err != nil {
		ep.Close()
		return nil, nil, err
	}
	return wq, ep, nil
}

type udpEnd struct {
	ep tcpip.Endpoint
	wq *waiter.Queue
}

// udpFlow relays datagrams both ways until neither way has carried one for
// the idle time.
type udpFlow struct {
	u         *udpRelay
	inbound   bool    // opened by a datagram from the network
	key       flowKey // the application's and the remote's addresses
	wire      udpEnd
	pod       *net.UDPConn // nil: through the TUN (see podSocket)
	last      atomic.Int64 // unix nanoseconds of the last datagram either way
	answered  atomic.Bool  // a datagram went against the opening direction
	done      chan struct{}
	closeOnce sync.Once

	elem    *list.Element // in u.flows.unreplied; guarded by u.flows.mu
	counted bool          // counted in u.flows.n; guarded by u.flows.mu
}

func (f *udpFlow) touch() { f.last.Store(time.Now().UnixNano()) }

// idle is how long the flow may stay silent.
func (f *udpFlow) idle() time.Duration {
	if f.answered.Load() {
		return f.u.opts.UDPIdle
	}
	return f.u.opts.UDPUnrepliedIdle
}

// Close ends the flow; its goroutines finish and release it.
func (f *udpFlow) Close() error {
	f.closeOnce.Do(func() {
		close(f.done)
		if f.pod != nil {
			// Unblocks podToWire's read.
			f.pod.SetReadDeadline(time.Unix(1, 0))
		}
	})
	return nil
}

// sawReply notes a datagram against the opening direction.
func (f *udpFlow) sawReply() {
	if !f.answered.Load() {
		f.answered.Store(true)
		f.u.flows.replied(f)
	}
}

func (f *udpFlow) run() {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.podToWire()
	}()
	f.wireToPod()
	wg.Wait()
	f.wire.ep.Close()
	if f.pod != nil {
		f.pod.Close()
	}
	f.u.conns.remove(f)
	f.u.flows.remove(f)
	f.u.stats.UDPActive.Add(-1)
}

// podToWire relays the applications' datagrams; it also keeps the idle
// clock, since a blocking read is where waiting is cheapest.
func (f *udpFlow) podToWire() {
	defer f.Close()
	if f.pod == nil {
		f.idleWait()
		return
	}
	bp := datagramPool.Get().(*[]byte)
	defer datagramPool.Put(bp)
	for {
		select {
		case <-f.done:
			return
		default:
		}
		idle := f.idle()
		since := time.Since(time.Unix(0, f.last.Load()))
		if since >= idle {
			return
		}
		f.pod.SetReadDeadline(time.Now().Add(idle - since))
		n, err := f.pod.Read(*bp)
		select {
		case <-f.done:
			return
		default:
		}
		if err != nil {
			if podsock.TimedOut(err) {
				continue // the loop head decides whether the flow is idle
			}
			// ECONNREFUSED: nothing listens on the application's port
			// (its kernel's ICMP error reached this socket), so a flood to
			// closed ports does not hold flows for the idle time.
			return
		}
		f.touch()
		if f.inbound {
			f.sawReply()
		}
		f.u.stats.FromAppBytes.Add(int64(n))
		if _, werr := f.wire.ep.Write(bytes.NewReader((*bp)[:n]), tcpip.WriteOptions{}); werr != nil {
			f.u.stats.UDPDropped.Add(1)
		}
	}
}

// idleWait keeps the idle clock of a flow whose application datagrams
// arrive through the UDP listeners.
func (f *udpFlow) idleWait() {
	for {
		idle := f.idle()
		since := time.Since(time.Unix(0, f.last.Load()))
		if since >= idle {
			return
		}
		t := time.NewTimer(idle - since)
		select {
		case <-f.done:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// wireToPod relays the network's datagrams.
func (f *udpFlow) wireToPod() {
	defer f.Close()
	entry, readable := waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventErr)
	f.wire.wq.EventRegister(&entry)
	defer f.wire.wq.EventUnregister(&entry)
	for {
		if !f.drainWire() {
			return
		}
		select {
		case <-readable:
		case <-f.done:
			return
		}
	}
}

// drainWire relays every datagram queued at the wire endpoint. It returns
// false when the endpoint failed.
func (f *udpFlow) drainWire() bool {
	bp := datagramPool.Get().(*[]byte)
	defer datagramPool.Put(bp)
	for {
		w := tcpip.SliceWriter(*bp)
		res, err := f.wire.ep.Read(&w, tcpip.ReadOptions{})
		if err != nil {
			_, wouldBlock := err.(*tcpip.ErrWouldBlock)
			return wouldBlock
		}
		f.touch()
		if !f.inbound {
			f.sawReply()
		}
		if res.Count < res.Total {
			f.u.stats.UDPDropped.Add(1) // cannot happen below 64 KiB
			continue
		}
		if f.pod == nil {
			p := buildUDP(f.key.remote, f.key.app, (*bp)[:res.Count])
			if p == nil {
				f.u.stats.UDPDropped.Add(1)
				continue
			}
			f.u.writeTUN(p)
			f.u.stats.ToAppBytes.Add(int64(res.Count))
			continue
		}
		if _, werr := f.pod.Write((*bp)[:res.Count]); werr != nil {
			f.u.stats.UDPDropped.Add(1)
		} else {
			f.u.stats.ToAppBytes.Add(int64(res.Count))
		}
	}
}
