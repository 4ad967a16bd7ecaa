package relay

import (
	"sync"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/podsock"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// The wire leg mirrors the applications' listening sockets: for each, a
// netstack listener on the pod's addresses. A connection from the network
// to a listening port then completes its handshake in netstack's listener,
// which answers a SYN flood with SYN cookies, statelessly, as the kernel
// does; only a peer that completed the handshake gets the application
// dialled. SYNs to ports without a mirror (closed ports, or a listener
// opened since the last look) still reach the forwarder, which dials the
// application first, so a closed port answers with a RST and a new
// listener works at once (and is mirrored from then on).

const (
	// mirrorInterval is how often the applications' listeners are listed.
	mirrorInterval = time.Second
	// mirrorMinGap spaces the lists a forwarded connection asks for.
	mirrorMinGap = 50 * time.Millisecond
	// mirrorBacklog is each mirrored listener's backlog: the handshakes
	// it keeps state for before answering with SYN cookies, and the
	// completed connections it queues for the relay.
	mirrorBacklog = 1024
)

type mirrorKey struct {
	addr tcpip.Address // zero: any address of the family
	port uint16
	v6   bool
}

type mirrored struct {
	ep      tcpip.Endpoint
	cookies *cookieKey // nil: the SYN cookie fast path does not serve it
	wq      *waiter.Queue
	done    chan struct{}
}

// mirrorSet is the wire leg's mirrored listeners.
type mirrorSet struct {
	diag   *podsock.Diag
	kick   chan struct{}
	syncMu sync.Mutex // serialises syncMirror
	mu     sync.Mutex // guards eps, ports and listed
	eps    map[mirrorKey]*mirrored
	ports  map[uint16]bool // every port an application listens on, any address
	listed time.Time       // when ports was read
}

// mirrorListeners keeps the mirror in step with the applications until
// the relay closes.
func (r *Relay) mirrorListeners() {
	defer r.wg.Done()
	m := &r.mirror
	t := time.NewTicker(mirrorInterval)
	defer t.Stop()
	for {
		r.syncMirror()
		select {
		case <-r.done:
			r.closeMirrors()
			return
		case <-t.C:
		case <-m.kick:
			time.Sleep(mirrorMinGap)
		}
	}
}

// knownClosed reports whether no application listens on port, by a list
// of the listeners read after since (the SYN's arrival), reading one if
// the last is older; one read serves every SYN that arrived before it
// started. A SYN to such a port is answered with a RST at once, without
// dialling the application: a flood of SYNs to closed ports then costs a
// RST each, like in a kernel, and holds no state. A failed read answers
// false, and the caller dials.
func (r *Relay) knownClosed(port uint16, since time.Time) bool {
	m := &r.mirror
	if m.diag == nil {
		return false
	}
	check := func() (closed, fresh bool) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return !m.ports[port], m.listed.After(since)
	}
	if closed, fresh := check(); fresh {
		return closed
	}
	m.syncMu.Lock()
	if _, fresh := check(); !fresh {
		r.syncMirrorLocked()
	}
	m.syncMu.Unlock()
	closed, fresh := check()
	return closed && fresh
}

// kickMirror asks for a look at the applications' listeners soon.
func (r *Relay) kickMirror() {
	if r.mirror.kick == nil {
		return
	}
	select {
	case r.mirror.kick <- struct{}{}:
	default:
	}
}

func (r *Relay) syncMirror() {
	r.mirror.syncMu.Lock()
	defer r.mirror.syncMu.Unlock()
	r.syncMirrorLocked()
}

// syncMirrorLocked is syncMirror with syncMu held.
func (r *Relay) syncMirrorLocked() {
	m := &r.mirror
	listed := time.Now()
	ls, err := m.diag.Listeners()
	if err != nil {
		r.opts.Logger.Debug("listing the applications' listeners", "err", err)
		return
	}
	want := make(map[mirrorKey]bool)
	ports := make(map[uint16]bool)
	for _, l := range ls {
		ports[l.Addr.Port()] = true
		for _, k := range r.mirrorKeys(l) {
			want[k] = true
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	defer func() { r.stats.TCPMirrored.Store(int64(len(m.eps))) }()
	m.ports, m.listed = ports, listed
	changes := r.stats.TCPMirrorChanges.Load()
	defer func() {
		if r.stats.TCPMirrorChanges.Load() != changes || r.cookieKeys.Load() == nil {
			r.publishCookieKeys(m.eps)
		}
	}()
	for k, e := range m.eps {
		if !want[k] {
			delete(m.eps, k)
			close(e.done)
			e.ep.Close()
			r.stats.TCPMirrorChanges.Add(1)
		}
	}
	for k := range want {
		if _, ok := m.eps[k]; ok {
			continue
		}
		e, err := r.listenWire(k)
		if err != nil {
			r.opts.Logger.Debug("mirroring a listener", "port", k.port, "err", err)
			continue
		}
		e.cookies = r.keyOf(e.ep)
		m.eps[k] = e
		r.stats.TCPMirrorChanges.Add(1)
		r.wg.Add(1)
		go r.acceptInbound(e)
	}
}

// mirrorKeys says which wire listeners mirror l: none for a loopback or
// foreign address (the relay's own listeners among them), the pod
// address it is bound to, or any address of its family (of both, for an
// IPv6 listener that takes IPv4 too).
func (r *Relay) mirrorKeys(l podsock.Listener) []mirrorKey {
	a := l.Addr.Addr()
	if a.IsLoopback() || a.Is4In6() && a.Unmap().IsLoopback() {
		return nil
	}
	if a.IsUnspecified() {
		if a.Is4() {
			return []mirrorKey{{port: l.Addr.Port()}}
		}
		if l.V6Only {
			return []mirrorKey{{port: l.Addr.Port(), v6: true}}
		}
		return []mirrorKey{{port: l.Addr.Port()}, {port: l.Addr.Port(), v6: true}}
	}
	addr := tcpipAddr(a.Unmap())
	if r.wire.Stack.CheckLocalAddress(r.wire.NIC, netProto(addr), addr) == 0 {
		return nil
	}
	return []mirrorKey{{addr: addr, port: l.Addr.Port(), v6: a.Is6() && !a.Is4In6()}}
}

func (r *Relay) listenWire(k mirrorKey) (*mirrored, tcpip.Error) {
	proto := ipv4.ProtocolNumber
	if k.v6 {
		proto = ipv6.ProtocolNumber
	}
	wq := new(waiter.Queue)
	ep, err := r.wire.Stack.NewEndpoint(tcp.ProtocolNumber, proto, wq)
	if err != nil {
		return nil, err
	}
	if k.v6 {
		ep.SocketOptions().SetV6Only(true)
	}
	// The application may run beside connections that bound the port on
	// the wire leg (an outbound connection from the same port).
	ep.SocketOptions().SetReuseAddress(true)
	if err := ep.Bind(tcpip.FullAddress{NIC: r.wire.NIC, Addr: k.addr, Port: k.port}); err != nil {
		ep.Close()
		return nil, err
	}
	if err := ep.Listen(mirrorBacklog); err != nil {
		ep.Close()
		return nil, err
	}
	return &mirrored{ep: ep, wq: wq, done: make(chan struct{})}, nil
}

// acceptInbound relays each connection a mirrored listener completes.
func (r *Relay) acceptInbound(m *mirrored) {
	defer r.wg.Done()
	entry, ready := waiter.NewChannelEntry(waiter.ReadableEvents)
	m.wq.EventRegister(&entry)
	defer m.wq.EventUnregister(&entry)
	for {
		ep, wq, err := m.ep.Accept(nil)
		if err != nil {
			if _, wouldBlock := err.(*tcpip.ErrWouldBlock); !wouldBlock {
				return
			}
			select {
			case <-ready:
				continue
			case <-m.done:
				return
			}
		}
		go r.relayAccepted(ep, wq)
	}
}

// relayAccepted dials the application for a connection whose handshake a
// mirrored listener completed; a refusal (the application closed its
// listener meanwhile) resets it. A peer the ingress policy denies is
// dropped unanswered first (see ingress.go): its handshake may have
// completed through a SYN cookie, without the SYN the wire leg judged.
func (r *Relay) relayAccepted(ep tcpip.Endpoint, wq *waiter.Queue) {
	local, lerr := ep.GetLocalAddress()
	remote, rerr := ep.GetRemoteAddress()
	if lerr != nil || rerr != nil {
		ep.Abort()
		ep.Close()
		return
	}
	id := stack.TransportEndpointID{LocalAddress: local.Addr, LocalPort: local.Port, RemoteAddress: remote.Addr, RemotePort: remote.Port}
	if !r.ingressAllowed(id, policy.ProtoTCP) {
		abortSilently(ep, wq)
		return
	}
	if !r.admitTCP() {
		ep.Abort()
		ep.Close()
		return
	}
	app, err := r.dialApp(r.ctx, id)
	if err != nil {
		r.stats.TCPActive.Add(-1)
		if podsock.Refused(err) {
			r.stats.TCPRefused.Add(1)
			r.kickMirror()
		}
		ep.Abort()
		ep.Close()
		return
	}
	r.start(newWireConn(ep, wq), app)
}

func (r *Relay) closeMirrors() {
	m := &r.mirror
	m.mu.Lock()
	defer m.mu.Unlock()
	defer r.publishCookieKeys(nil)
	for k, e := range m.eps {
		delete(m.eps, k)
		close(e.done)
		e.ep.Close()
	}
}
