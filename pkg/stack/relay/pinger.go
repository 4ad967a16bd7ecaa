package relay

import (
	"bytes"
	"encoding/binary"
	"io"
	"sync"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/waiter"
)

const (
	// pingWorkers bounds concurrent echo requests in flight to the network.
	pingWorkers = 8
	// pingQueue bounds echo requests waiting for a worker; beyond it they
	// are dropped, as a ping flood deserves.
	pingQueue = 64
	// pingTimeout is how long a worker waits for the reply.
	pingTimeout = 3 * time.Second
)

// Pinger relays the applications' echo requests to the network through the
// wire stack's ICMP endpoints and writes the replies back to the TUN.
type Pinger struct {
	wire  Leg
	tun   io.Writer
	stats *Stats
	// policy takes the egress verdict on each echo request.
	policy *enforce.Enforcer
	queue  chan echo
	done   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
}

// newPinger starts the relay workers.
func newPinger(wire Leg, tun io.Writer, stats *Stats, pol *enforce.Enforcer) *Pinger {
	p := &Pinger{wire: wire, tun: tun, stats: stats, policy: pol, queue: make(chan echo, pingQueue), done: make(chan struct{})}
	for range pingWorkers {
		p.wg.Add(1)
		go p.work()
	}
	return p
}

// handle takes an echo request read from the TUN. It returns false for
// every other packet.
func (p *Pinger) handle(b []byte) bool {
	if !looksLikeEcho(b) {
		return false
	}
	e, ok := parseEchoRequest(bytes.Clone(b))
	if !ok {
		return false
	}
	if m := p.policy.For(policy.Egress); m != nil {
		proto := policy.ProtoICMP
		if e.dst.Is6() {
			proto = policy.ProtoICMPv6
		}
		if !m.CheckFlow(policy.Flow{Dir: policy.Egress, Proto: proto, Peer: e.dst, Local: e.src}) {
			return true // dropped: the application's ping times out
		}
	}
	select {
	case p.queue <- e:
	default:
		p.stats.ICMPEchoFailed.Add(1)
	}
	return true
}

func looksLikeEcho(h []byte) bool {
	switch {
	case len(h) >= 21 && h[0]>>4 == 4 && h[9] == protoICMPv4:
		ihl := int(h[0]&0x0f) * 4
		return len(h) > ihl && h[ihl] == icmpv4EchoRequest
	case len(h) >= 41 && h[0]>>4 == 6 && h[6] == protoICMPv6:
		return h[40] == icmpv6EchoRequest
	}
	return false
}

// Close stops the workers.
func (p *Pinger) Close() {
	p.once.Do(func() { close(p.done) })
	p.wg.Wait()
}

func (p *Pinger) work() {
	defer p.wg.Done()
	for {
		select {
		case <-p.done:
			return
		case e := <-p.queue:
			if p.relay(e) {
				p.stats.ICMPEchoes.Add(1)
			} else {
				p.stats.ICMPEchoFailed.Add(1)
			}
		}
	}
}

func (p *Pinger) relay(e echo) bool {
	tproto, nproto := icmp.ProtocolNumber4, ipv4.ProtocolNumber
	reqType := byte(icmpv4EchoRequest)
	if e.src.Is6() {
		tproto, nproto = icmp.ProtocolNumber6, ipv6.ProtocolNumber
		reqType = icmpv6EchoRequest
	}
	var wq waiter.Queue
	ep, err := p.wire.Stack.NewEndpoint(tproto, nproto, &wq)
	if err != nil {
		return false
	}
	defer ep.Close()
	if err := ep.Bind(tcpip.FullAddress{Addr: tcpip.AddrFromSlice(e.src.AsSlice())}); err != nil {
		return false
	}
	req := make([]byte, 8+len(e.data))
	req[0] = reqType
	binary.BigEndian.PutUint16(req[6:8], e.seq)
	copy(req[8:], e.data)
	entry, readable := waiter.NewChannelEntry(waiter.ReadableEvents)
	wq.EventRegister(&entry)
	defer wq.EventUnregister(&entry)
	to := tcpip.FullAddress{Addr: tcpip.AddrFromSlice(e.dst.AsSlice())}
	if _, err := ep.Write(bytes.NewReader(req), tcpip.WriteOptions{To: &to}); err != nil {
		return false
	}
	deadline := time.NewTimer(pingTimeout)
	defer deadline.Stop()
	buf := make([]byte, 8+len(e.data)+64)
	for {
		w := tcpip.SliceWriter(buf)
		res, err := ep.Read(&w, tcpip.ReadOptions{})
		if err == nil {
			reply := buf[:res.Count]
			if len(reply) < 8 || binary.BigEndian.Uint16(reply[6:8]) != e.seq {
				continue
			}
			_, werr := p.tun.Write(buildEchoReply(e, reply[8:]))
			return werr == nil
		}
		if _, wouldBlock := err.(*tcpip.ErrWouldBlock); !wouldBlock {
			return false
		}
		select {
		case <-readable:
		case <-deadline.C:
			return false
		case <-p.done:
			return false
		}
	}
}
