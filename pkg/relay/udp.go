package relay

import (
	"bytes"
	"container/list"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// maxDatagram is the largest UDP payload IPv4 or IPv6 (without jumbograms)
// can carry.
const maxDatagram = 65535

var datagramPool = sync.Pool{New: func() any { b := make([]byte, maxDatagram); return &b }}

// forwardUDP opens a flow for the datagram req announces: a connected
// endpoint on this leg and one on the other leg bound to the sender's
// address and port, so that both ends see their real peer.
// Flows from the network (inbound) may be evicted until answered.
func (r *Relay) forwardUDP(req *udp.ForwarderRequest, to Leg, inbound bool) bool {
	if r.closing.Load() {
		return true
	}
	f := &udpFlow{r: r, done: make(chan struct{})}
	ok, evicted := r.udp.admit(f, inbound)
	if !ok {
		r.stats.UDPLimitHit.Add(1)
		return true
	}
	if evicted != nil {
		r.stats.UDPEvicted.Add(1)
		evicted.Close()
	}
	r.stats.UDPActive.Add(1)
	id := req.ID()
	outWQ, outEP, err := dialUDP(to, tcpip.FullAddress{NIC: to.NIC, Addr: id.RemoteAddress, Port: id.RemotePort},
		tcpip.FullAddress{Addr: id.LocalAddress, Port: id.LocalPort}, netProto(id.LocalAddress))
	if err != nil {
		r.udp.remove(f)
		r.stats.UDPActive.Add(-1)
		r.stats.UDPDropped.Add(1)
		r.opts.Logger.Debug("relaying UDP", "from", id.RemoteAddress, "to", id.LocalAddress, "port", id.LocalPort, "err", err)
		return true
	}
	inWQ := new(waiter.Queue)
	// CreateEndpoint delivers the datagram that opened the flow into the
	// new endpoint, so it is relayed like every later one.
	inEP, err := req.CreateEndpoint(inWQ)
	if err != nil {
		r.udp.remove(f)
		r.stats.UDPActive.Add(-1)
		r.stats.UDPDropped.Add(1)
		outEP.Close()
		return true
	}
	r.stats.UDPTotal.Add(1)
	f.touch()
	r.conns.add(f)
	go f.run(udpEnd{inEP, inWQ}, udpEnd{outEP, outWQ})
	return true
}

// udpTable counts live UDP flows against MaxUDP. Flows from the network
// that have never carried a reply are kept oldest first, at most
// MaxUDPUnreplied of them, so that a flood of datagrams that each open a
// flow (to many ports, from many sources) evicts its own oldest flows
// instead of locking new ones out for the idle time; a flow that was
// answered, or that the pod's applications opened, is never evicted.
type udpTable struct {
	max, maxUnreplied int
	mu                sync.Mutex // guards n, unreplied and the flows' elem and counted
	n                 int        // admitted flows not yet removed or evicted
	unreplied         list.List  // of *udpFlow, oldest first
}

func (t *udpTable) init(max, maxUnreplied int) { t.max, t.maxUnreplied = max, maxUnreplied }

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
// the idle time. No buffer is held while waiting: a flow costs two
// endpoints and two goroutines, not two 64 KiB buffers.
type udpFlow struct {
	r         *Relay
	last      atomic.Int64 // unix nanoseconds of the last datagram either way
	answered  atomic.Bool  // a datagram went against the opening direction
	done      chan struct{}
	closeOnce sync.Once

	elem    *list.Element // in r.udp.unreplied; guarded by r.udp.mu
	counted bool          // counted in r.udp.n; guarded by r.udp.mu
}

func (f *udpFlow) touch() { f.last.Store(time.Now().UnixNano()) }

// idle is how long the flow may stay silent.
func (f *udpFlow) idle() time.Duration {
	if f.answered.Load() {
		return f.r.opts.UDPIdle
	}
	return f.r.opts.UDPUnrepliedIdle
}

func (f *udpFlow) Close() error {
	f.closeOnce.Do(func() { close(f.done) })
	return nil
}

// run relays until the flow ends; a is the end whose datagram opened it.
func (f *udpFlow) run(a, b udpEnd) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.pump(a, b, false)
	}()
	f.pump(b, a, true)
	wg.Wait()
	a.ep.Close()
	b.ep.Close()
	f.r.conns.remove(f)
	f.r.udp.remove(f)
	f.r.stats.UDPActive.Add(-1)
}

func (f *udpFlow) pump(src, dst udpEnd, reply bool) {
	defer f.Close()
	// EventErr: an ICMP port unreachable for the flow (nothing listens on
	// the port) ends it at once, so a flood to closed ports does not hold
	// flows for the idle time.
	entry, readable := waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventErr)
	src.wq.EventRegister(&entry)
	defer src.wq.EventUnregister(&entry)
	timer := time.NewTimer(f.idle())
	defer timer.Stop()
	for {
		if !f.drain(src, dst, reply) {
			return
		}
		select {
		case <-readable:
		case <-f.done:
			return
		case <-timer.C:
			idle := f.idle()
			since := time.Since(time.Unix(0, f.last.Load()))
			if since >= idle {
				return
			}
			timer.Reset(idle - since)
		}
	}
}

// drain relays every datagram queued at src. It returns false when the
// endpoint failed.
func (f *udpFlow) drain(src, dst udpEnd, reply bool) bool {
	bp := datagramPool.Get().(*[]byte)
	defer datagramPool.Put(bp)
	for {
		w := tcpip.SliceWriter(*bp)
		res, err := src.ep.Read(&w, tcpip.ReadOptions{})
		if err != nil {
			_, wouldBlock := err.(*tcpip.ErrWouldBlock)
			return wouldBlock
		}
		f.touch()
		if reply && !f.answered.Load() {
			f.answered.Store(true)
			f.r.udp.replied(f)
		}
		if res.Count < res.Total {
			f.r.stats.UDPDropped.Add(1) // cannot happen below 64 KiB
			continue
		}
		var rd bytes.Reader
		rd.Reset((*bp)[:res.Count])
		if _, werr := dst.ep.Write(&rd, tcpip.WriteOptions{}); werr != nil {
			f.r.stats.UDPDropped.Add(1)
		}
	}
}
