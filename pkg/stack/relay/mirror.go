package relay

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/stack/podsock"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
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
	// maxMirrored caps the mirrored listeners (one per family and
	// address a listener takes): each holds a netstack endpoint and a
	// goroutine, and a pod opens as many listening sockets as it likes.
	// Far more than the ports a pod serves; the listeners beyond it are
	// not mirrored (Stats.TCPMirrorOverCap) and their connections go
	// through the forwarder, which dials the application first, without
	// the listener's SYN cookies. Mirrors already open stay while their
	// application listens, so that the cap does not make them churn.
	maxMirrored = 512
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

// mirror keeps the wire leg's mirrored listeners in step with the
// applications' and publishes their SYN cookie keys to the fast path
// (cookie.go). Without a Diag (PodSide.Diag) it mirrors nothing and
// knows no port closed.
type mirror struct {
	*env
	diag *podsock.Diag
	// accepted relays a connection a mirrored listener completed.
	accepted func(tcpip.Endpoint, *waiter.Queue)
	kicks    chan struct{}
	syncMu   sync.Mutex // serialises sync
	mu       sync.Mutex // guards eps, ports and listed
	eps      map[mirrorKey]*mirrored
	ports    map[uint16]bool // every port an application listens on, any address
	listed   time.Time       // when ports was read
	// cookieKeys are the mirrored listeners' SYN cookie keys, replaced
	// whole when the mirror changes.
	cookieKeys      atomic.Pointer[map[mirrorKey]*cookieKey]
	cookieKeyLogged atomic.Bool
	// capLogged is set once the cap was logged: a pod that keeps
	// thousands of listeners open must not fill the log every second.
	capLogged atomic.Bool
}

func newMirror(e *env, accepted func(tcpip.Endpoint, *waiter.Queue)) *mirror {
	return &mirror{env: e, diag: e.pod.Diag, accepted: accepted, kicks: make(chan struct{}, 1), eps: make(map[mirrorKey]*mirrored)}
}

// start keeps the mirror in step until the relay closes.
func (m *mirror) start() {
	if m.diag == nil {
		return
	}
	m.wg.Add(1)
	go m.run()
}

// run keeps the mirror in step with the applications until the relay
// closes.
func (m *mirror) run() {
	defer m.wg.Done()
	t := time.NewTicker(mirrorInterval)
	defer t.Stop()
	for {
		m.sync()
		select {
		case <-m.done:
			m.closeAll()
			return
		case <-t.C:
		case <-m.kicks:
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
func (m *mirror) knownClosed(port uint16, since time.Time) bool {
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
		m.syncLocked()
	}
	m.syncMu.Unlock()
	closed, fresh := check()
	return closed && fresh
}

// kick asks for a look at the applications' listeners soon.
func (m *mirror) kick() {
	select {
	case m.kicks <- struct{}{}:
	default:
	}
}

func (m *mirror) sync() {
	m.syncMu.Lock()
	defer m.syncMu.Unlock()
	m.syncLocked()
}

// syncLocked is sync with syncMu held.
func (m *mirror) syncLocked() {
	listed := time.Now()
	ls, err := m.diag.Listeners()
	if err != nil {
		m.opts.Logger.Debug("listing the applications' listeners", "err", err)
		return
	}
	want := make(map[mirrorKey]bool)
	ports := make(map[uint16]bool)
	for _, l := range ls {
		ports[l.Addr.Port()] = true
		for _, k := range m.keys(l) {
			want[k] = true
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	defer func() { m.stats.TCPMirrored.Store(int64(len(m.eps))) }()
	m.ports, m.listed = ports, listed
	changes := m.stats.TCPMirrorChanges.Load()
	defer func() {
		if m.stats.TCPMirrorChanges.Load() != changes || m.cookieKeys.Load() == nil {
			m.publishCookieKeys(m.eps)
		}
	}()
	for k, e := range m.eps {
		if !want[k] {
			delete(m.eps, k)
			close(e.done)
			e.ep.Close()
			m.stats.TCPMirrorChanges.Add(1)
		}
	}
	over := 0
	for k := range want {
		if _, ok := m.eps[k]; ok {
			continue
		}
		if len(m.eps) >= maxMirrored {
			over++
			continue
		}
		e, err := m.listen(k)
		if err != nil {
			m.opts.Logger.Debug("mirroring a listener", "port", k.port, "err", err)
			continue
		}
		e.cookies = m.keyOf(e.ep)
		m.eps[k] = e
		m.stats.TCPMirrorChanges.Add(1)
		m.wg.Add(1)
		go m.acceptInbound(e)
	}
	m.stats.TCPMirrorOverCap.Store(int64(over))
	if over > 0 && !m.capLogged.Swap(true) {
		m.opts.Logger.Warn("the applications listen on more sockets than the wire leg mirrors: the rest go through the forwarder, without SYN cookies",
			"mirrored", len(m.eps), "max", maxMirrored, "notMirrored", over)
	}
}

// keys says which wire listeners mirror l: none for a loopback or
// foreign address (the relay's own listeners among them), the pod
// address it is bound to, or any address of its family (of both, for an
// IPv6 listener that takes IPv4 too).
func (m *mirror) keys(l podsock.Listener) []mirrorKey {
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
	if m.wire.Stack.CheckLocalAddress(m.wire.NIC, netProto(addr), addr) == 0 {
		return nil
	}
	return []mirrorKey{{addr: addr, port: l.Addr.Port(), v6: a.Is6() && !a.Is4In6()}}
}

func (m *mirror) listen(k mirrorKey) (*mirrored, tcpip.Error) {
	proto := ipv4.ProtocolNumber
	if k.v6 {
		proto = ipv6.ProtocolNumber
	}
	wq := new(waiter.Queue)
	ep, err := m.wire.Stack.NewEndpoint(tcp.ProtocolNumber, proto, wq)
	if err != nil {
		return nil, err
	}
	if k.v6 {
		ep.SocketOptions().SetV6Only(true)
	}
	// The application may run beside connections that bound the port on
	// the wire leg (an outbound connection from the same port).
	ep.SocketOptions().SetReuseAddress(true)
	if err := ep.Bind(tcpip.FullAddress{NIC: m.wire.NIC, Addr: k.addr, Port: k.port}); err != nil {
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
func (m *mirror) acceptInbound(l *mirrored) {
	defer m.wg.Done()
	entry, ready := waiter.NewChannelEntry(waiter.ReadableEvents)
	l.wq.EventRegister(&entry)
	defer l.wq.EventUnregister(&entry)
	for {
		ep, wq, err := l.ep.Accept(nil)
		if err != nil {
			if _, wouldBlock := err.(*tcpip.ErrWouldBlock); !wouldBlock {
				return
			}
			select {
			case <-ready:
				continue
			case <-l.done:
				return
			}
		}
		go m.accepted(ep, wq)
	}
}

func (m *mirror) closeAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.publishCookieKeys(nil)
	for k, e := range m.eps {
		delete(m.eps, k)
		close(e.done)
		e.ep.Close()
	}
}
