package tap

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/pcap"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

var (
	podMAC  = tcpip.LinkAddress("\x02\x00\x00\x00\x00\x01")
	peerMAC = tcpip.LinkAddress("\x02\x00\x00\x00\x00\x02")
)

// countingDispatcher stands for the NIC above the tap.
type countingDispatcher struct{ n int }

func (d *countingDispatcher) DeliverNetworkPacket(tcpip.NetworkProtocolNumber, *tcpipstack.PacketBuffer) {
	d.n++
}
func (d *countingDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *tcpipstack.PacketBuffer) {
}

func newTestTap(t testing.TB) (*Tap, *countingDispatcher) {
	ep := channel.New(1024, 1500, podMAC)
	tap := NewTap(ep)
	d := &countingDispatcher{}
	tap.Attach(d)
	t.Cleanup(ep.Close)
	return tap, d
}

// inbound builds a received frame as a link endpoint hands it over: the
// Ethernet header consumed, the IP packet behind it.
func inbound(payload []byte) *tcpipstack.PacketBuffer {
	frame := make([]byte, header.EthernetMinimumSize+len(payload))
	header.Ethernet(frame).Encode(&header.EthernetFields{SrcAddr: peerMAC, DstAddr: podMAC, Type: header.IPv4ProtocolNumber})
	copy(frame[header.EthernetMinimumSize:], payload)
	pkt := tcpipstack.NewPacketBuffer(tcpipstack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
	pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	return pkt
}

// outbound builds a packet as the NIC hands it to the link: the Ethernet
// header pushed.
func outbound(payload []byte) *tcpipstack.PacketBuffer {
	pkt := tcpipstack.NewPacketBuffer(tcpipstack.PacketBufferOptions{ReserveHeaderBytes: header.EthernetMinimumSize, Payload: buffer.MakeWithData(payload)})
	pkt.NetworkProtocolNumber = header.IPv4ProtocolNumber
	header.Ethernet(pkt.LinkHeader().Push(header.EthernetMinimumSize)).Encode(&header.EthernetFields{SrcAddr: podMAC, DstAddr: peerMAC, Type: header.IPv4ProtocolNumber})
	return pkt
}

func TestTapIdleAllocatesNothing(t *testing.T) {
	tap, d := newTestTap(t)
	pkt := inbound(bytes.Repeat([]byte{0x45}, 100))
	defer pkt.DecRef()
	allocs := testing.AllocsPerRun(1000, func() { tap.DeliverNetworkPacket(header.IPv4ProtocolNumber, pkt) })
	if allocs != 0 {
		t.Errorf("idle tap: %v allocations per packet, want 0", allocs)
	}
	if d.n == 0 {
		t.Fatal("the tap did not pass packets on")
	}
}

// BenchmarkTapDeliverIdle is the idle tap's cost per received packet:
// compare with .../direct, the dispatcher called without the tap, and
// .../nested, what a plain nested.Endpoint wrapper costs.
func BenchmarkTapDeliverIdle(b *testing.B) {
	tap, d := newTestTap(b)
	pkt := inbound(bytes.Repeat([]byte{0x45}, 1400))
	defer pkt.DecRef()
	b.Run("tap", func(b *testing.B) {
		for b.Loop() {
			tap.DeliverNetworkPacket(header.IPv4ProtocolNumber, pkt)
		}
	})
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			d.DeliverNetworkPacket(header.IPv4ProtocolNumber, pkt)
		}
	})
	b.Run("nested", func(b *testing.B) {
		for b.Loop() {
			tap.Endpoint.DeliverNetworkPacket(header.IPv4ProtocolNumber, pkt)
		}
	})
}

type stream struct {
	resp *http.Response
	pr   *pcap.PcapReader
	id   string
}

func openStream(t *testing.T, srv *httptest.Server, query string) *stream {
	t.Helper()
	resp, err := http.Get(srv.URL + pcap.StreamPath + query)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s: %s", pcap.StreamPath, resp.Status, b)
	}
	t.Cleanup(func() { resp.Body.Close() })
	pr, err := pcap.NewPcapReader(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return &stream{resp: resp, pr: pr, id: resp.Header.Get(pcap.HeaderID)}
}

func (s *stream) stop(t *testing.T, srv *httptest.Server) {
	t.Helper()
	resp, err := http.Post(srv.URL+pcap.StopPath+"?id="+s.id, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stop: %s", resp.Status)
	}
}

func TestTapStreamsBothDirections(t *testing.T) {
	tap, d := newTestTap(t)
	srv := httptest.NewServer(tap)
	// A cleanup, so that it runs after the streams' bodies are closed:
	// Close waits for the handlers.
	t.Cleanup(srv.Close)
	s := openStream(t, srv, "")
	in := bytes.Repeat([]byte("in"), 50)
	pkt := inbound(in)
	tap.DeliverNetworkPacket(header.IPv4ProtocolNumber, pkt)
	pkt.DecRef()
	out := bytes.Repeat([]byte("out"), 30)
	var list tcpipstack.PacketBufferList
	list.PushBack(outbound(out))
	if n, err := tap.WritePackets(list); n != 1 || err != nil {
		t.Fatalf("WritePackets: %d, %v", n, err)
	}
	list.DecRef()
	if d.n != 1 {
		t.Errorf("dispatcher got %d packets, want 1", d.n)
	}
	for _, want := range []struct {
		dir     uint8
		addr    tcpip.LinkAddress
		payload []byte
	}{{pcap.PacketHost, peerMAC, in}, {pcap.PacketOutgoing, podMAC, out}} {
		p, err := s.pr.Next()
		if err != nil {
			t.Fatal(err)
		}
		f := p.Frame
		if got := binary.BigEndian.Uint16(f[0:2]); got != uint16(header.IPv4ProtocolNumber) {
			t.Errorf("ethertype %#x, want IPv4", got)
		}
		if got := binary.BigEndian.Uint16(f[8:10]); got != pcap.ARPHRDEther {
			t.Errorf("hatype %d, want %d", got, pcap.ARPHRDEther)
		}
		if f[10] != want.dir {
			t.Errorf("packet type %d, want %d", f[10], want.dir)
		}
		if got := tcpip.LinkAddress(f[12 : 12+f[11]]); got != want.addr {
			t.Errorf("address %s, want %s", got, want.addr)
		}
		if !bytes.Equal(f[pcap.SLL2HeaderLen:], want.payload) || p.OrigLen != pcap.SLL2HeaderLen+len(want.payload) {
			t.Errorf("payload %q (orig %d), want %q", f[pcap.SLL2HeaderLen:], p.OrigLen, want.payload)
		}
		if time.Since(p.Time) > time.Minute || time.Since(p.Time) < 0 {
			t.Errorf("timestamp %v is not now", p.Time)
		}
	}
	s.stop(t, srv)
	if _, err := s.pr.Next(); err != io.EOF {
		t.Fatalf("after stop: %v, want EOF", err)
	}
	if got := s.resp.Trailer.Get(pcap.TrailerSent); got != "2" {
		t.Errorf("trailer %s = %q, want 2", pcap.TrailerSent, got)
	}
	if got := s.resp.Trailer.Get(pcap.TrailerDrops); got != "0" {
		t.Errorf("trailer %s = %q, want 0", pcap.TrailerDrops, got)
	}
	if len(tap.state.Load().sessions) != 0 {
		t.Error("the tap still has captures after the only one stopped")
	}
}

// TestTapSlowReaderDrops delivers far more than a capture may hold to a
// reader that does not read: every packet must still go up the stack at
// once, and the end of the stream must account for each one.
func TestTapSlowReaderDrops(t *testing.T) {
	tap, d := newTestTap(t)
	srv := httptest.NewServer(tap)
	// A cleanup, so that it runs after the streams' bodies are closed:
	// Close waits for the handlers.
	t.Cleanup(srv.Close)
	s := openStream(t, srv, "?snaplen=1000")
	const n = 20000 // 20000 x 1020 bytes: 20 MB, five times the queue
	pkt := inbound(bytes.Repeat([]byte{0x45}, 1400))
	start := time.Now()
	for range n {
		tap.DeliverNetworkPacket(header.IPv4ProtocolNumber, pkt)
	}
	pkt.DecRef()
	t.Logf("%d packets delivered in %v with a reader that does not read", n, time.Since(start))
	if d.n != n {
		t.Fatalf("dispatcher got %d packets, want %d", d.n, n)
	}
	s.stop(t, srv)
	got := 0
	for {
		p, err := s.pr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Frame) != 1000 || p.OrigLen != pcap.SLL2HeaderLen+1400 {
			t.Fatalf("frame of %d bytes (orig %d), want 1000 (orig %d): the snap length", len(p.Frame), p.OrigLen, pcap.SLL2HeaderLen+1400)
		}
		got++
	}
	sent, _ := strconv.Atoi(s.resp.Trailer.Get(pcap.TrailerSent))
	dropped, _ := strconv.Atoi(s.resp.Trailer.Get(pcap.TrailerDrops))
	if sent != got || sent+dropped != n || dropped == 0 {
		t.Errorf("read %d, trailers say %d sent and %d dropped, of %d delivered", got, sent, dropped, n)
	}
	t.Logf("%d sent, %d dropped", sent, dropped)
}

func TestTapSessionLimit(t *testing.T) {
	tap, _ := newTestTap(t)
	srv := httptest.NewServer(tap)
	// A cleanup, so that it runs after the streams' bodies are closed:
	// Close waits for the handlers.
	t.Cleanup(srv.Close)
	for range maxSessions {
		openStream(t, srv, "")
	}
	resp, err := http.Get(srv.URL + pcap.StreamPath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("capture %d: %s, want 503", maxSessions+1, resp.Status)
	}
}
