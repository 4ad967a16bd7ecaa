package podstack

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/faketime"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// ackPair is a pod's stack (setTCPOptions, as every pod runs it) and a
// plain netstack peer on one wire, both on a manual clock: no timer fires
// unless the test moves the clock, so "acknowledged at once" and "held for
// the delay" are told apart without timing anything. Every segment the
// pod's stack sends is recorded.
type ackPair struct {
	clock    *faketime.ManualClock
	pod      *tcpipstack.Stack
	peer     *tcpipstack.Stack
	podAddr  tcpip.FullAddress
	mu       sync.Mutex
	fromPod  []header.TCP
	received chan struct{}
}

func newACKPair(t *testing.T) *ackPair {
	t.Helper()
	p := &ackPair{clock: faketime.NewManualClock(), received: make(chan struct{}, 1024)}
	mk := func() *tcpipstack.Stack {
		return tcpipstack.New(tcpipstack.Options{
			NetworkProtocols:   []tcpipstack.NetworkProtocolFactory{ipv4.NewProtocol},
			TransportProtocols: []tcpipstack.TransportProtocolFactory{tcp.NewProtocol},
			Clock:              p.clock,
		})
	}
	p.pod, p.peer = mk(), mk()
	if err := setTCPOptions(p.pod, 4<<20); err != nil {
		t.Fatal(err)
	}
	const mtu = 1500
	podLink, peerLink := channel.New(256, mtu, ""), channel.New(256, mtu, "")
	podIP := tcpip.AddrFrom4([4]byte{10, 9, 0, 1})
	peerIP := tcpip.AddrFrom4([4]byte{10, 9, 0, 2})
	for _, s := range []struct {
		st   *tcpipstack.Stack
		link *channel.Endpoint
		ip   tcpip.Address
	}{{p.pod, podLink, podIP}, {p.peer, peerLink, peerIP}} {
		if err := s.st.CreateNIC(1, s.link); err != nil {
			t.Fatal(err)
		}
		if err := s.st.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
			AddressWithPrefix: s.ip.WithPrefix()}, tcpipstack.AddressProperties{}); err != nil {
			t.Fatal(err)
		}
		s.st.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: 1}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	pump := func(from, to *channel.Endpoint, record bool) {
		defer wg.Done()
		for {
			pkt := from.ReadContext(ctx)
			if pkt == nil {
				return
			}
			b := pkt.ToView().AsSlice()
			pkt.DecRef()
			if record {
				ip := header.IPv4(b)
				p.mu.Lock()
				p.fromPod = append(p.fromPod, header.TCP(bytes.Clone(ip.Payload())))
				p.mu.Unlock()
				select {
				case p.received <- struct{}{}:
				default:
				}
			}
			to.InjectInbound(ipv4.ProtocolNumber, tcpipstack.NewPacketBuffer(tcpipstack.PacketBufferOptions{
				Payload: buffer.MakeWithData(b),
			}))
		}
	}
	wg.Add(2)
	go pump(podLink, peerLink, true)
	go pump(peerLink, podLink, false)
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		p.pod.Close()
		p.peer.Close()
		p.pod.Wait()
		p.peer.Wait()
	})
	p.podAddr = tcpip.FullAddress{NIC: 1, Addr: podIP, Port: 80}
	return p
}

// connect returns the pod's side and the peer's side of a new connection
// from the peer to the pod (the pod's stack answers, as for a Service).
func (p *ackPair) connect(t *testing.T) (pod, peer *gonet.TCPConn) {
	t.Helper()
	ln, err := gonet.ListenTCP(p.pod, p.podAddr, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan *gonet.TCPConn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c.(*gonet.TCPConn)
	}()
	peer, err = gonet.DialTCP(p.peer, p.podAddr, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	pod, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { pod.Close(); peer.Close() })
	return pod, peer
}

// sent is the number of segments the pod has sent so far.
func (p *ackPair) sent() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.fromPod)
}

// segmentsAfter waits until the pod has sent more than n segments (or a
// second of real time has passed: the wire is in-process) and returns
// those after the first n.
func (p *ackPair) segmentsAfter(n int, quiet time.Duration) []header.TCP {
	deadline := time.Now().Add(quiet)
	for time.Now().Before(deadline) {
		if p.sent() > n {
			break
		}
		select {
		case <-p.received:
		case <-time.After(10 * time.Millisecond):
		}
	}
	// what else the same wake-up sent
	time.Sleep(20 * time.Millisecond)
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]header.TCP(nil), p.fromPod[n:]...)
}

func pureACKs(segs []header.TCP) (acks, data int) {
	for _, s := range segs {
		if len(s.Payload()) > 0 || s.Flags()&(header.TCPFlagFin|header.TCPFlagSyn) != 0 {
			data++
		} else if s.Flags()&header.TCPFlagAck != 0 {
			acks++
		}
	}
	return acks, data
}

// TestDelayedACKAnswerCarriesIt: a request answered by the pod's
// application costs the pod's stack one segment, the answer carrying the
// acknowledgement (hack/gvisor/patches/0001); unanswered, the
// acknowledgement goes out when the delay has passed.
func TestDelayedACKAnswerCarriesIt(t *testing.T) {
	p := newACKPair(t)
	pod, peer := p.connect(t)
	req, ans := []byte("GET / HTTP/1.1\r\n\r\n"), []byte("HTTP/1.1 200 OK\r\n\r\n")
	buf := make([]byte, 100)
	for i := 0; i < 20; i++ {
		n0 := p.sent()
		if _, err := peer.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, err := pod.Read(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := pod.Write(ans); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Read(buf); err != nil {
			t.Fatal(err)
		}
		segs := p.segmentsAfter(n0, time.Second)
		if acks, data := pureACKs(segs); acks != 0 || data != 1 {
			t.Fatalf("round trip %d: the pod's stack sent %d pure ACKs and %d data segments, want 0 and 1", i, acks, data)
		}
	}

	// A request the application leaves unanswered: no ACK until the
	// delay has passed on the stack's clock, then exactly one.
	n0 := p.sent()
	if _, err := peer.Write(req); err != nil {
		t.Fatal(err)
	}
	if _, err := pod.Read(buf); err != nil {
		t.Fatal(err)
	}
	if segs := p.segmentsAfter(n0, 200*time.Millisecond); len(segs) != 0 {
		t.Fatalf("acknowledged before the delay: %d segments", len(segs))
	}
	p.clock.Advance(delayedACK)
	if acks, data := pureACKs(p.segmentsAfter(n0, time.Second)); acks != 1 || data != 0 {
		t.Fatalf("after the delay: %d pure ACKs, %d data segments; want 1 and 0", acks, data)
	}
}

// TestDelayedACKNotHeld: what must be acknowledged at once is, with the
// stack's clock standing still: two full-sized segments, and a FIN.
func TestDelayedACKNotHeld(t *testing.T) {
	p := newACKPair(t)
	_, peer := p.connect(t)
	n0 := p.sent()
	if _, err := peer.Write(make([]byte, 4*1460)); err != nil {
		t.Fatal(err)
	}
	if acks, _ := pureACKs(p.segmentsAfter(n0, time.Second)); acks == 0 {
		t.Fatal("four full-sized segments not acknowledged while the clock stood still")
	}
	n0 = p.sent()
	peer.CloseWrite()
	segs := p.segmentsAfter(n0, time.Second)
	if acks, _ := pureACKs(segs); acks == 0 {
		t.Fatalf("FIN not acknowledged while the clock stood still (%d segments)", len(segs))
	}
}
