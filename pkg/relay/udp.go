package relay

import (
	"bytes"
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
func (r *Relay) forwardUDP(req *udp.ForwarderRequest, to Leg) bool {
	if r.closing.Load() {
		return true
	}
	if r.stats.UDPActive.Add(1) > int64(r.opts.MaxUDP) {
		r.stats.UDPActive.Add(-1)
		r.stats.UDPLimitHit.Add(1)
		return true
	}
	id := req.ID()
	outWQ, outEP, err := dialUDP(to, tcpip.FullAddress{NIC: to.NIC, Addr: id.RemoteAddress, Port: id.RemotePort},
		tcpip.FullAddress{Addr: id.LocalAddress, Port: id.LocalPort}, netProto(id.LocalAddress))
	if err != nil {
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
		r.stats.UDPActive.Add(-1)
		r.stats.UDPDropped.Add(1)
		outEP.Close()
		return true
	}
	r.stats.UDPTotal.Add(1)
	f := &udpFlow{r: r, done: make(chan struct{})}
	f.touch()
	r.conns.add(f)
	go f.run(udpEnd{inEP, inWQ}, udpEnd{outEP, outWQ})
	return true
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
	done      chan struct{}
	closeOnce sync.Once
}

func (f *udpFlow) touch() { f.last.Store(time.Now().UnixNano()) }

func (f *udpFlow) Close() error {
	f.closeOnce.Do(func() { close(f.done) })
	return nil
}

func (f *udpFlow) run(a, b udpEnd) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.pump(a, b)
	}()
	f.pump(b, a)
	wg.Wait()
	a.ep.Close()
	b.ep.Close()
	f.r.conns.remove(f)
	f.r.stats.UDPActive.Add(-1)
}

func (f *udpFlow) pump(src, dst udpEnd) {
	defer f.Close()
	idle := f.r.opts.UDPIdle
	entry, readable := waiter.NewChannelEntry(waiter.ReadableEvents)
	src.wq.EventRegister(&entry)
	defer src.wq.EventUnregister(&entry)
	timer := time.NewTimer(idle)
	defer timer.Stop()
	for {
		if !f.drain(src, dst) {
			return
		}
		select {
		case <-readable:
		case <-f.done:
			return
		case <-timer.C:
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
func (f *udpFlow) drain(src, dst udpEnd) bool {
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
