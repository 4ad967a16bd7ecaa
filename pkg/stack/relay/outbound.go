package relay

import (
	"container/list"
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/podsock"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/waiter"
)

// flowKey names an application's connection or flow: its own address and
// port, and the remote's.
type flowKey struct{ app, remote netip.AddrPort }

// outboundConn is an application's connection whose SYN the stack holds:
// first while the remote is dialled, then until the pod's kernel hands
// the re-injected SYN's connection to a listener.
type outboundConn struct {
	syn []byte // the application's latest SYN, written back when dialled
	// dst is the remote dialled: the application's, or the backend the
	// policy chose for a Service VIP.
	dst    netip.AddrPort
	dialed bool
	cancel context.CancelFunc // ends the dial
	elem   *list.Element      // in outboundSet.dialing while dialling
	start  time.Time
	ep     tcpip.Endpoint
	wq     *waiter.Queue
	timer  *time.Timer // gives up an accepted dial nobody claims
}

// outboundSet holds the applications' connections being set up, keyed by
// their addresses. When MaxOutboundPending are being dialled, a new one
// gives up the oldest dial if that one is unanswered for evictAfter, and
// is dropped otherwise (the application retransmits): an application that
// floods unanswering addresses with connections (or a scan) must not lock
// itself out of the network until its dials time out, and a dial given up
// starts again when its application retransmits the SYN. Dials younger
// than evictAfter are never given up, which bounds the churn (and the
// memory of endpoints being torn down) to MaxOutboundPending per
// evictAfter whatever the SYN rate.
type outboundSet struct {
	max     int
	mu      sync.Mutex // guards m, dialing and the conns' elem
	m       map[flowKey]*outboundConn
	dialing list.List // of flowKey, oldest first
}

func (s *outboundSet) init(max int) { s.max, s.m = max, make(map[flowKey]*outboundConn) }

// evictAfter is how long a dial is safe from eviction: the applications'
// first SYN retransmission comes after 1 s.
const evictAfter = time.Second

// claimTimeout is how long a dialled connection waits for the pod's kernel
// to deliver the re-injected SYN to the listener: it arrives within
// microseconds, so this only bounds a lost one (the application's next SYN
// retransmission, after 1 s, is written back again).
const claimTimeout = 10 * time.Second

// outboundSYN handles an application's SYN read from the TUN: the first
// of a connection starts dialling the remote from the application's own
// address and port; a retransmission replaces the held SYN, or is written
// back again when the dial is done.
func (t *tcpRelay) outboundSYN(k flowKey, syn []byte) {
	s := &t.outbound
	s.mu.Lock()
	if c, ok := s.m[k]; ok {
		c.syn = syn
		dialed := c.dialed
		s.mu.Unlock()
		if dialed {
			t.writeTUN(syn)
		}
		return
	}
	// Before the limit: a denied connection must not evict a dial.
	dst, ok := t.egressTo(k, policy.ProtoTCP)
	if !ok {
		s.mu.Unlock()
		return // dropped: the application's connect times out
	}
	if s.dialing.Len() >= s.max {
		oldest := s.dialing.Front().Value.(flowKey)
		old := s.m[oldest]
		if time.Since(old.start) < evictAfter {
			s.mu.Unlock()
			t.stats.TCPOutboundDropped.Add(1)
			return
		}
		s.dialing.Remove(old.elem)
		delete(s.m, oldest)
		old.elem = nil
		old.cancel()
		t.stats.TCPOutboundDropped.Add(1)
	}
	if !t.admit() {
		s.mu.Unlock()
		t.writeTUN(buildRST(syn))
		return
	}
	ctx, cancel := context.WithTimeout(t.ctx, t.opts.OutboundDialTimeout)
	c := &outboundConn{syn: syn, dst: dst, cancel: cancel, start: time.Now()}
	c.elem = s.dialing.PushBack(k)
	s.m[k] = c
	s.mu.Unlock()
	go t.dialOutbound(ctx, k, c)
}

func (t *tcpRelay) dialOutbound(ctx context.Context, k flowKey, c *outboundConn) {
	defer c.cancel()
	local := tcpip.FullAddress{NIC: t.wire.NIC, Addr: tcpipAddr(k.app.Addr()), Port: k.app.Port()}
	remote := tcpip.FullAddress{Addr: tcpipAddr(c.dst.Addr()), Port: c.dst.Port()}
	wq, ep, err := dialTCP(ctx, t.wire, local, remote, netProto(remote.Addr))
	if _, inUse := err.(*tcpip.ErrPortInUse); inUse {
		// The application's port is taken on the wire leg (a connection
		// from the network bound it); an ephemeral port keeps the
		// connection working at the cost of the port being visible as
		// rewritten.
		local.Port = 0
		wq, ep, err = dialTCP(ctx, t.wire, local, remote, netProto(remote.Addr))
	}
	s := &t.outbound
	s.mu.Lock()
	if s.m[k] != c || t.closing.Load() {
		// Given up meanwhile: evicted by a newer dial, or the relay closed.
		s.mu.Unlock()
		t.stats.TCPActive.Add(-1)
		if err == nil {
			ep.Abort()
			ep.Close()
		}
		return
	}
	if c.elem != nil {
		s.dialing.Remove(c.elem)
		c.elem = nil
	}
	if err != nil {
		delete(s.m, k)
		s.mu.Unlock()
		t.stats.TCPActive.Add(-1)
		switch err.(type) {
		case *tcpip.ErrConnectionRefused:
			t.stats.TCPRefused.Add(1)
			t.writeTUN(buildRST(c.syn))
		case *tcpip.ErrTimeout, *tcpip.ErrAborted:
			// No answer: the application's own connect timeout decides.
		default:
			t.opts.Logger.Debug("relaying TCP", "from", k.app, "to", k.remote, "err", err)
			t.writeTUN(buildRST(c.syn))
		}
		return
	}
	c.dialed, c.ep, c.wq = true, ep, wq
	c.timer = time.AfterFunc(claimTimeout, func() { t.unclaimed(k, c) })
	syn := c.syn
	s.mu.Unlock()
	t.writeTUN(syn)
}

// egressTo takes the egress verdict on the application's new connection
// or flow k of protocol proto, and returns the remote to dial: k's own,
// or, when egress is isolated and k's remote is a Service VIP, the
// backend the policy chose. A denial is counted.
func (e *env) egressTo(k flowKey, proto uint8) (netip.AddrPort, bool) {
	m := e.opts.Policy.For(policy.Egress)
	if m == nil {
		return k.remote, true
	}
	dst, isService, ok := m.ResolveService(k.remote, proto, k.hash())
	switch {
	case !isService:
		return dst, m.CheckFlow(policy.Flow{Dir: policy.Egress, Proto: proto, Peer: dst.Addr(), Port: dst.Port(), Local: k.app.Addr()})
	case !ok:
		m.Deny(policy.Flow{Dir: policy.Egress, Proto: proto, Peer: k.remote.Addr(), Port: k.remote.Port(), Local: k.app.Addr()}, policy.NoAllowedBackend)
	}
	return dst, ok
}

// hash is FNV-1a of k's addresses and ports: the same flow picks the same
// Service backend.
func (k flowKey) hash() uint32 {
	h := uint32(2166136261)
	mix := func(b []byte) {
		for _, c := range b {
			h = (h ^ uint32(c)) * 16777619
		}
	}
	for _, ap := range []netip.AddrPort{k.app, k.remote} {
		a := ap.Addr().As16()
		mix(a[:])
		mix([]byte{byte(ap.Port() >> 8), byte(ap.Port())})
	}
	return h
}

// unclaimed gives up a dialled connection the listener never received.
func (t *tcpRelay) unclaimed(k flowKey, c *outboundConn) {
	s := &t.outbound
	s.mu.Lock()
	if s.m[k] != c {
		s.mu.Unlock()
		return
	}
	delete(s.m, k)
	s.mu.Unlock()
	c.ep.Abort()
	c.ep.Close()
	t.stats.TCPActive.Add(-1)
}

// claim takes the dialled connection k off the set.
func (s *outboundSet) claim(k flowKey) *outboundConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.m[k]
	if !ok || !c.dialed || !c.timer.Stop() {
		return nil
	}
	delete(s.m, k)
	return c
}

// closeAll gives up every connection being set up.
func (s *outboundSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, c := range s.m {
		if c.dialed && c.timer.Stop() {
			c.ep.Abort()
			c.ep.Close()
		}
		if !c.dialed {
			c.cancel()
		}
		delete(s.m, k)
	}
	s.dialing.Init()
}

// acceptOutbound receives the applications' connections from the pod's
// kernel once their SYN was written back, and relays each to the wire
// connection dialled for it.
func (t *tcpRelay) acceptOutbound(l *net.TCPListener) {
	defer t.wg.Done()
	for {
		conn, err := l.AcceptTCP()
		if err != nil {
			if t.closing.Load() {
				return
			}
			t.opts.Logger.Debug("accepting an application's connection", "err", err)
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: do not spin
			continue
		}
		k := flowKey{app: podsock.AddrPort(conn.RemoteAddr()), remote: podsock.AddrPort(conn.LocalAddr())}
		// readTUN never dials for a foreign source, so claim would find
		// nothing; counted here all the same, as the attempt it is.
		if !t.fromPodSocket(k.app.Addr()) {
			podsock.Reset(conn)
			continue
		}
		c := t.outbound.claim(k)
		if c == nil {
			// Not a connection the stack dialled for (an application that
			// connected to the listener's own address, or one given up).
			podsock.Reset(conn)
			continue
		}
		t.start(newWireConn(c.ep, c.wq), conn)
	}
}
