package tap

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/pcap"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

const (
	// maxSessions bounds the captures one stack serves at once, and with
	// sessionQueueBytes the memory they can hold: 4 x 4 MiB.
	maxSessions = 4
	// sessionQueueBytes is how much a capture may hold for a reader that
	// is behind: about 3 ms of a 10 Gbit/s link, or 2700 full-size frames.
	// Beyond it packets are dropped and counted, never waited for.
	sessionQueueBytes = 4 << 20
	// sessionQueuePackets bounds the queue's length for small packets.
	sessionQueuePackets = 8192
)

// Tap is a link endpoint that hands copies of the packets crossing it to
// the captures in progress (gVisor's sniffer endpoint, made safe to leave
// in the data path: it never blocks and never fails a packet). While
// nobody captures, it costs one atomic load per received packet and per
// written batch: the load that finds no capture also yields the
// dispatcher above, which nested.Endpoint would read under a read lock
// (two atomic read-modify-writes per packet).
type Tap struct {
	nested.Endpoint
	// state is all the data path reads: the dispatcher above and the
	// captures in progress. Replaced whole (copy on write) under mu.
	state atomic.Pointer[tapState]
	// mu guards up, sessions and nextID, and serialises changes to state.
	mu       sync.Mutex
	up       tcpipstack.NetworkDispatcher
	sessions map[uint64]*session
	nextID   uint64
}

// tapState is what the data path needs, read with one atomic load.
type tapState struct {
	// up receives the packets the tap passes on; nil: detached.
	up tcpipstack.NetworkDispatcher
	// sessions are the captures in progress; empty when there are none.
	sessions []*session
}

var (
	_ tcpipstack.LinkEndpoint      = (*Tap)(nil)
	_ tcpipstack.NetworkDispatcher = (*Tap)(nil)
)

// NewTap wraps child.
func NewTap(child tcpipstack.LinkEndpoint) *Tap {
	t := &Tap{sessions: make(map[uint64]*session)}
	t.Endpoint.Init(child, t)
	t.state.Store(&tapState{})
	return t
}

// Attach implements tcpipstack.LinkEndpoint: the dispatcher is published for
// the data path before the child can deliver to the tap.
func (t *Tap) Attach(d tcpipstack.NetworkDispatcher) {
	t.mu.Lock()
	t.up = d
	t.publishLocked()
	t.mu.Unlock()
	t.Endpoint.Attach(d)
}

// DeliverNetworkPacket copies the packet to the captures, then passes it on.
func (t *Tap) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *tcpipstack.PacketBuffer) {
	st := t.state.Load()
	if len(st.sessions) > 0 {
		t.record(st.sessions, false, proto, pkt)
	}
	if st.up != nil {
		st.up.DeliverNetworkPacket(proto, pkt)
	}
}

// WritePackets copies the batch to the captures, then writes it.
func (t *Tap) WritePackets(pkts tcpipstack.PacketBufferList) (int, tcpip.Error) {
	if st := t.state.Load(); len(st.sessions) > 0 {
		for _, pkt := range pkts.AsSlice() {
			t.record(st.sessions, true, pkt.NetworkProtocolNumber, pkt)
		}
	}
	return t.Endpoint.WritePackets(pkts)
}

// record builds the packet's SLL2 frame once, for every capture that has
// room for it; a capture that has none counts a drop, and when none has,
// the packet is not even copied: a reader that fell behind costs the data
// path little more than an idle tap.
func (t *Tap) record(ss []*session, out bool, proto tcpip.NetworkProtocolNumber, pkt *tcpipstack.PacketBuffer) {
	lh := pkt.LinkHeader().Slice()
	skip := 0
	if len(lh) == header.EthernetMinimumSize {
		skip = len(lh)
	}
	dataLen := pkt.Size() - skip
	snap, room := 0, 0
	var ok [maxSessions]bool
	for i, s := range ss {
		if ok[i] = s.hasRoom(pcap.SLL2HeaderLen + dataLen); ok[i] {
			snap = max(snap, s.snapLen)
			room++
		} else {
			s.dropped.Add(1)
		}
	}
	if room == 0 {
		return
	}
	now := time.Now()
	ethertype, hatype := uint16(proto), uint16(pcap.ARPHRDNone)
	var addr []byte
	pktType := uint8(pcap.PacketHost)
	if skip > 0 {
		eth := header.Ethernet(lh)
		ethertype, hatype = uint16(eth.Type()), pcap.ARPHRDEther
		src := eth.SourceAddress()
		addr = []byte(string(src))
		switch dst := eth.DestinationAddress(); {
		case out:
		case dst == header.EthernetBroadcastAddress:
			pktType = pcap.PacketBroadcast
		case header.IsMulticastEthernetAddress(dst):
			pktType = pcap.PacketMulticast
		case dst != t.LinkAddress():
			pktType = pcap.PacketOtherHost
		}
	}
	if out {
		pktType = pcap.PacketOutgoing
	}
	frame := make([]byte, pcap.SLL2HeaderLen+min(dataLen, snap-pcap.SLL2HeaderLen))
	pcap.SLL2(frame, ethertype, 0, hatype, pktType, addr)
	rest := frame[pcap.SLL2HeaderLen:]
	for _, v := range pkt.AsSlices() {
		if skip > 0 {
			d := min(skip, len(v))
			v, skip = v[d:], skip-d
		}
		n := copy(rest, v)
		rest = rest[n:]
		if len(rest) == 0 {
			break
		}
	}
	p := pcap.Packet{Time: now, Frame: frame, OrigLen: pcap.SLL2HeaderLen + dataLen}
	for i, s := range ss {
		if ok[i] {
			s.offer(p)
		}
	}
}

// session is one capture in progress.
type session struct {
	id      uint64
	snapLen int
	// ch holds the packets for the reader; queued counts their bytes.
	// Never closed: the data path may still hold the session for one
	// packet after it ended, and its offer must find a queue, not panic.
	ch      chan pcap.Packet
	queued  atomic.Int64
	dropped atomic.Uint64
	// stop is closed when the capture is asked to end cleanly.
	stop     chan struct{}
	stopOnce sync.Once
}

// hasRoom reports whether a frame of n bytes (before the snap length)
// would fit in the queue now. Only a hint: offer decides.
func (s *session) hasRoom(n int) bool {
	return s.queued.Load()+int64(min(n, s.snapLen)) <= sessionQueueBytes && len(s.ch) < cap(s.ch)
}

// offer queues p or, when the reader is behind, drops and counts it.
func (s *session) offer(p pcap.Packet) {
	if len(p.Frame) > s.snapLen {
		p.Frame = p.Frame[:s.snapLen]
	}
	n := int64(len(p.Frame))
	if s.queued.Add(n) > sessionQueueBytes {
		s.queued.Add(-n)
		s.dropped.Add(1)
		return
	}
	select {
	case s.ch <- p:
	default:
		s.queued.Add(-n)
		s.dropped.Add(1)
	}
}

func (t *Tap) start(snapLen int) (*session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.sessions) >= maxSessions {
		return nil, fmt.Errorf("%d captures already running on this pod, the most one stack serves", len(t.sessions))
	}
	t.nextID++
	s := &session{id: t.nextID, snapLen: snapLen, ch: make(chan pcap.Packet, sessionQueuePackets), stop: make(chan struct{})}
	t.sessions[s.id] = s
	t.publishLocked()
	return s, nil
}

func (t *Tap) end(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sessions, s.id)
	t.publishLocked()
}

// publishLocked hands the data path a fresh state (copy on write: the
// data path reads it without a lock).
func (t *Tap) publishLocked() {
	st := &tapState{up: t.up}
	for _, s := range t.sessions {
		st.sessions = append(st.sessions, s)
	}
	t.state.Store(st)
}

// ServeHTTP serves the control socket's capture endpoints:
//
//	GET  /capture[?snaplen=N]  the wire leg as a pcap stream (LINUX_SLL2),
//	                           until the client goes away or asks to stop;
//	                           trailers say how many packets were sent
//	                           and how many dropped for a slow reader
//	POST /capture/stop?id=ID   end capture ID cleanly (its Capture-Id)
func (t *Tap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == pcap.StreamPath:
		t.serveStream(w, r)
	case r.Method == http.MethodPost && r.URL.Path == pcap.StopPath:
		id, _ := strconv.ParseUint(r.URL.Query().Get(pcap.SessionIDForm), 10, 64)
		t.mu.Lock()
		s := t.sessions[id]
		t.mu.Unlock()
		if s == nil {
			http.Error(w, "no such capture", http.StatusNotFound)
			return
		}
		s.stopOnce.Do(func() { close(s.stop) })
		fmt.Fprintln(w, "stopping")
	default:
		http.NotFound(w, r)
	}
}

func (t *Tap) serveStream(w http.ResponseWriter, r *http.Request) {
	snap := pcap.DefaultSnapLen
	if v := r.URL.Query().Get(pcap.SnapLenQuery); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= pcap.SLL2HeaderLen || n > pcap.DefaultSnapLen {
			http.Error(w, fmt.Sprintf("snaplen %q: want %d..%d", v, pcap.SLL2HeaderLen+1, pcap.DefaultSnapLen), http.StatusBadRequest)
			return
		}
		snap = n
	}
	s, err := t.start(snap)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	ended := false
	defer func() {
		if !ended {
			t.end(s)
		}
	}()
	flusher, _ := w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "application/vnd.tcpdump.pcap")
	h.Set("Trailer", pcap.TrailerSent+", "+pcap.TrailerDrops)
	h.Set(pcap.HeaderID, strconv.FormatUint(s.id, 10))
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	flush := func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	}
	if pcap.WritePcapHeader(bw, snap) != nil || flush() != nil {
		return
	}
	var sent uint64
	write := func(p pcap.Packet) error {
		s.queued.Add(-int64(len(p.Frame)))
		sent++
		if err := pcap.WritePcapRecord(bw, &p); err != nil {
			return err
		}
		if len(s.ch) == 0 {
			return flush()
		}
		return nil
	}
	for {
		select {
		case p := <-s.ch:
			if write(p) != nil {
				return
			}
			continue
		case <-s.stop:
		case <-r.Context().Done():
			return
		}
		break
	}
	// Asked to stop: no new packets, then what is queued, then the counts.
	t.end(s)
	ended = true
	for len(s.ch) > 0 {
		if write(<-s.ch) != nil {
			return
		}
	}
	if flush() != nil {
		return
	}
	h.Set(pcap.TrailerSent, strconv.FormatUint(sent, 10))
	h.Set(pcap.TrailerDrops, strconv.FormatUint(s.dropped.Load(), 10))
}

// RecordFrame hands the captures a copy of an Ethernet frame that crossed
// the link without passing the tap (podstack's SYN path reads and answers
// SYNs on a socket of its own): out, sent; otherwise arrived. Costs one
// atomic load while nobody captures.
func (t *Tap) RecordFrame(out bool, frame []byte) {
	st := t.state.Load()
	if len(st.sessions) == 0 || len(frame) < header.EthernetMinimumSize {
		return
	}
	pkt := tcpipstack.NewPacketBuffer(tcpipstack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
	defer pkt.DecRef()
	pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	t.record(st.sessions, out, header.Ethernet(frame).Type(), pkt)
}
