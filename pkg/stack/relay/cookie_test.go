package relay

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/qdisc/fifo"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// cookieRig is a netstack with one listener on port 80 of podAddr, its
// link a channel the test reads and writes, and a relay whose fast path
// knows that listener's cookie key.
type cookieRig struct {
	s      *tcpipstack.Stack
	link   *channel.Endpoint
	ln     tcpip.Endpoint
	lnWQ   *waiter.Queue
	r      *Relay
	pod    netip.Addr
	client netip.Addr
}

func newCookieRig(t *testing.T, v6 bool) *cookieRig { return newCookieRigWith(t, v6, nil) }

// gatedLink holds every write until its gate closes.
type gatedLink struct {
	*channel.Endpoint
	gate chan struct{}
}

func (l *gatedLink) WritePackets(pkts tcpipstack.PacketBufferList) (int, tcpip.Error) {
	<-l.gate
	return l.Endpoint.WritePackets(pkts)
}

// newCookieRigWith is newCookieRig with, when gate is not nil, a FIFO
// queue of 4 packets in front of a link that sends nothing until gate
// closes.
func newCookieRigWith(t *testing.T, v6 bool, gate chan struct{}) *cookieRig {
	t.Helper()
	s := tcpipstack.New(tcpipstack.Options{
		NetworkProtocols:   []tcpipstack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []tcpipstack.TransportProtocolFactory{tcp.NewProtocol},
	})
	t.Cleanup(func() { s.Close(); s.Wait() })
	link := channel.New(64, 1500, "")
	t.Cleanup(link.Close)
	var opts tcpipstack.NICOptions
	if gate != nil {
		gl := &gatedLink{Endpoint: link, gate: gate}
		opts.QDisc = fifo.New(gl, 1, 4)
		t.Cleanup(func() {
			select {
			case <-gate:
			default:
				close(gate)
			}
		})
	}
	if err := s.CreateNICWithOptions(1, link, opts); err != nil {
		t.Fatal(err)
	}
	rig := &cookieRig{s: s, link: link, pod: netip.MustParseAddr("10.0.0.2"), client: netip.MustParseAddr("10.0.0.9")}
	proto := ipv4.ProtocolNumber
	if v6 {
		rig.pod, rig.client, proto = netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::9"), ipv6.ProtocolNumber
	}
	pa := tcpip.ProtocolAddress{Protocol: proto, AddressWithPrefix: tcpip.AddrFromSlice(rig.pod.AsSlice()).WithPrefix()}
	if err := s.AddProtocolAddress(1, pa, tcpipstack.AddressProperties{}); err != nil {
		t.Fatal(err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: 1}, {Destination: header.IPv6EmptySubnet, NIC: 1}})
	rig.lnWQ = new(waiter.Queue)
	ln, err := s.NewEndpoint(tcp.ProtocolNumber, proto, rig.lnWQ)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ln.Close)
	if err := ln.Bind(tcpip.FullAddress{NIC: 1, Port: 80}); err != nil {
		t.Fatal(err)
	}
	if err := ln.Listen(16); err != nil {
		t.Fatal(err)
	}
	rig.ln = ln
	key, kerr := listenerCookieKey(ln)
	if kerr != nil {
		t.Fatalf("reading the listener's cookie key from the pinned gVisor: %v", kerr)
	}
	rig.r = newRelay(Leg{Stack: s, NIC: 1, MTU: 1500}, PodSide{}, Options{})
	rig.r.tcp.mirror.publishCookieKeys(map[mirrorKey]*mirrored{{port: 80, v6: v6}: {ep: ln, cookies: key}})
	return rig
}

// segment builds an IP packet carrying a TCP segment from the client to
// the pod's port 80 (options: raw TCP option bytes, a multiple of 4).
func (rig *cookieRig) segment(seq, ack uint32, flags header.TCPFlags, options []byte) []byte {
	p, t := newIPPacket(rig.client, rig.pod, protoTCP, header.TCPMinimumSize+len(options))
	header.TCP(t).Encode(&header.TCPFields{
		SrcPort: 40000, DstPort: 80, SeqNum: seq, AckNum: ack,
		DataOffset: uint8(header.TCPMinimumSize + len(options)), Flags: flags, WindowSize: 65535,
	})
	copy(t[header.TCPMinimumSize:], options)
	binary.BigEndian.PutUint16(t[16:18], transportChecksum(rig.client, rig.pod, protoTCP, t))
	return p
}

func (rig *cookieRig) inject(p []byte) {
	proto := ipv4.ProtocolNumber
	if rig.pod.Is6() {
		proto = ipv6.ProtocolNumber
	}
	rig.link.InjectInbound(proto, tcpipstack.NewPacketBuffer(tcpipstack.PacketBufferOptions{Payload: buffer.MakeWithData(p)}))
}

// read returns the next packet the stack sent, as IP bytes.
func (rig *cookieRig) read(t *testing.T) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pkt := rig.link.ReadContext(ctx)
	if pkt == nil {
		t.Fatal("the stack sent nothing")
	}
	defer pkt.DecRef()
	return pkt.ToView().AsSlice()
}

// TestSYNCookieFastPath: a SYN answered by AnswerSYN, never seen by
// netstack, is completed by netstack's listener when the client's ACK
// comes back, so the fast path's cookie is netstack's own. If gVisor
// changes its cookie (its layout or its hash), this fails.
func TestSYNCookieFastPath(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		t.Run(name, func(t *testing.T) {
			rig := newCookieRig(t, v6)
			const isn = 1000000
			mss := []byte{tcpOptionMSS, 4, 0x05, 0xb4} // 1460
			if !rig.r.AnswerSYN(rig.segment(isn, 0, header.TCPFlagSyn, mss), "\x02\x00\x00\x00\x00\x09") {
				t.Fatal("AnswerSYN did not answer a SYN to a mirrored port")
			}
			synAck := rig.read(t)
			ipLen, src, dst, ok := tcpHeaderAt(synAck)
			if !ok || src != rig.pod || dst != rig.client {
				t.Fatalf("answer is not TCP from %s to %s: % x", rig.pod, rig.client, synAck)
			}
			th := header.TCP(synAck[ipLen:])
			if th.Flags() != header.TCPFlagSyn|header.TCPFlagAck || th.AckNumber() != isn+1 || th.SourcePort() != 80 || th.DestinationPort() != 40000 {
				t.Fatalf("not a SYN-ACK for the SYN: flags %s ack %d ports %d→%d", th.Flags(), th.AckNumber(), th.SourcePort(), th.DestinationPort())
			}
			if c := ^checksum.Checksum(th, pseudo(src, dst, len(th))); c != 0 {
				t.Fatalf("SYN-ACK checksum does not verify (%#x)", c)
			}
			wantMSS := 1500 - 20 - 20
			if v6 {
				wantMSS = 1500 - 40 - 20
			}
			if o := header.ParseSynOptions(th.Options(), true); int(o.MSS) != wantMSS || o.WS != -1 || o.TS || o.SACKPermitted {
				t.Fatalf("SYN-ACK options %+v, want MSS %d only", o, wantMSS)
			}
			cookie := th.SequenceNumber()
			if st := rig.s.Stats().TCP.ListenOverflowSynCookieSent.Value(); st != 0 {
				t.Fatalf("netstack sent %d cookies itself: the SYN reached it", st)
			}

			// A forged ACK (wrong cookie) must not open a connection.
			rig.inject(rig.segment(isn+1, cookie+7, header.TCPFlagAck, nil))
			// The client's real ACK must.
			rig.inject(rig.segment(isn+1, cookie+1, header.TCPFlagAck, nil))
			deadline := time.Now().Add(5 * time.Second)
			for {
				ep, _, err := rig.ln.Accept(nil)
				if err == nil {
					defer ep.Close()
					remote, _ := ep.GetRemoteAddress()
					if got := addrPort(remote.Addr, remote.Port); got != netip.AddrPortFrom(rig.client, 40000) {
						t.Fatalf("accepted connection from %s", got)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("netstack's listener did not complete the handshake the fast path's cookie began (invalid cookies seen: %d)",
						rig.s.Stats().TCP.ListenOverflowInvalidSynCookieRcvd.Value())
				}
				time.Sleep(5 * time.Millisecond)
			}
			if n := rig.s.Stats().TCP.ListenOverflowInvalidSynCookieRcvd.Value(); n != 1 {
				t.Fatalf("%d ACKs with an invalid cookie counted, want 1 (the forged one)", n)
			}
			if n := rig.r.stats.TCPCookieFast.Load(); n != 1 {
				t.Fatalf("TCPCookieFast = %d, want 1", n)
			}
		})
	}
}

func pseudo(src, dst netip.Addr, l4Len int) uint16 {
	sum := checksum.Checksum(src.AsSlice(), 0)
	sum = checksum.Checksum(dst.AsSlice(), sum)
	sum = checksum.Combine(sum, uint16(protoTCP))
	return checksum.Combine(sum, uint16(l4Len))
}

// TestSYNCookieFastPathLeavesOthers: only SYNs to a mirrored port get a
// cookie from the fast path; anything else is left to the caller.
func TestSYNCookieFastPathLeavesOthers(t *testing.T) {
	rig := newCookieRig(t, false)
	other := rig.segment(1, 0, header.TCPFlagSyn, nil)
	binary.BigEndian.PutUint16(other[20+2:], 81)
	for name, p := range map[string][]byte{
		"closed port": other,
		"SYN-ACK":     rig.segment(1, 1, header.TCPFlagSyn|header.TCPFlagAck, nil),
		"ACK":         rig.segment(1, 1, header.TCPFlagAck, nil),
		"truncated":   rig.segment(1, 0, header.TCPFlagSyn, nil)[:30],
	} {
		if rig.r.AnswerSYN(p, "\x02\x00\x00\x00\x00\x09") {
			t.Errorf("%s: answered", name)
		}
	}
	if n := rig.link.NumQueued(); n != 0 {
		t.Fatalf("%d packets sent", n)
	}
}

// TestSYNCookieFastPathPastFullQueue: when the NIC's queue refuses the
// answer, it goes out through Leg.WriteDirect; without one it is counted
// as an error.
func TestSYNCookieFastPathPastFullQueue(t *testing.T) {
	rig := newCookieRigWith(t, false, make(chan struct{}))
	mss := []byte{tcpOptionMSS, 4, 0x05, 0xb4}
	// Fill the queue: one packet held by its sender, four waiting.
	for i := range 5 {
		if !rig.r.AnswerSYN(rig.segment(uint32(i), 0, header.TCPFlagSyn, mss), "\x02\x00\x00\x00\x00\x09") {
			t.Fatalf("SYN %d not answered while the queue had room", i)
		}
		time.Sleep(10 * time.Millisecond) // the first is taken by the queue's sender
	}
	if rig.r.AnswerSYN(rig.segment(100, 0, header.TCPFlagSyn, mss), "\x02\x00\x00\x00\x00\x09") {
		t.Fatal("answered with the queue full and no direct writer")
	}
	if n := rig.r.stats.TCPCookieFastErrors.Load(); n != 1 {
		t.Fatalf("TCPCookieFastErrors = %d, want 1", n)
	}
	var got []byte
	var gotTo tcpip.LinkAddress
	rig.r.wire.WriteDirect = func(to tcpip.LinkAddress, _ tcpip.NetworkProtocolNumber, ip []byte) error {
		got, gotTo = append([]byte(nil), ip...), to
		return nil
	}
	if !rig.r.AnswerSYN(rig.segment(200, 0, header.TCPFlagSyn, mss), "\x02\x00\x00\x00\x00\x09") {
		t.Fatal("not answered through the direct writer")
	}
	ipLen, _, _, ok := tcpHeaderAt(got)
	if !ok || gotTo != "\x02\x00\x00\x00\x00\x09" || header.TCP(got[ipLen:]).AckNumber() != 201 {
		t.Fatalf("direct write: to %x, % x", gotTo, got)
	}
	if n := rig.r.stats.TCPCookieFastDirect.Load(); n != 1 {
		t.Fatalf("TCPCookieFastDirect = %d, want 1", n)
	}
}
