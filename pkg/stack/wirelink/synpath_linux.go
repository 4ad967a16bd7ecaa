package wirelink

import (
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/tap"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirelink/packetsock"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/rawfile"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	tcpipstack "gvisor.dev/gvisor/pkg/tcpip/stack"
)

// synPath serves the link's SYN socket (packetsock.NewSYNSocket): the
// new-connection SYNs, and nothing else, read from its receive ring in
// batches of up to synBatch. A SYN the gate lets through becomes a packet
// buffer for netstack, as the link's own reader would make it. Under a
// flood (the gate's pressure, or beyond its cap) the SYNs are answered
// here instead, straight from the frame:
// the cookie SYN-ACK is built in a frame kept for it and the batch's
// answers go out in one sendmmsg on the same socket, without a packet
// buffer, netstack's NIC or its queue (docs/reliability/hostile.md has
// the cost per SYN).
type synPath struct {
	// pollLoop waits for SYNs on Go's netpoller and serves the ring
	// (serveRing); the ring needs no recvmmsg.
	pollLoop
	sock *packetsock.SYNSocket
	mac  tcpip.LinkAddress
	gate *gate
	tap  *tap.Tap
	// answer builds the cookie SYN-ACK for a SYN's IP packet into buf
	// (relay.SYNCookieAnswer); count reports what was sent
	// (relay.CountFastCookies).
	answer func(buf, ipPacket []byte) ([]byte, tcpip.NetworkProtocolNumber, bool)
	count  func(sent, failed int)
	// rxChecksumValidated is fdbased's RXChecksumOffload: the link's
	// frames are trusted the same way whichever socket read them.
	rxChecksumValidated bool

	out  [synBatch][]byte
	outN [synBatch]int
	outH [synBatch]rawfile.MMsgHdr
	outV [synBatch]unix.Iovec
}

// synBatch is how many SYNs are read before their answers go out in one
// system call.
const synBatch = 64

// synAnswerFrame holds an Ethernet header and the largest cookie SYN-ACK
// (IPv6, 40 + 24 bytes).
const synAnswerFrame = header.EthernetMinimumSize + 64

func newSYNPath(sock *packetsock.SYNSocket, mac tcpip.LinkAddress) (*synPath, error) {
	p := &synPath{sock: sock, mac: mac}
	if err := p.open(sock.FD, "SYN socket", "SYN socket: waiting for SYNs"); err != nil {
		return nil, err
	}
	p.serve = p.serveRing
	for k := range synBatch {
		p.out[k] = make([]byte, synAnswerFrame)
		p.outV[k] = rawfile.IovecFromBytes(p.out[k])
	}
	return p, nil
}

// serveRing is the loop's serve (pollLoop): it serves the ring until it
// is empty, then waits for the socket to become readable again, without
// a turn's budget. Woken (or started) with an empty ring, it takes the
// error that woke it, if that is what did.
func (p *synPath) serveRing(uintptr) bool {
	if !p.sock.Ready() {
		p.err = p.sock.Err()
		return p.err != nil
	}
	for p.sock.Ready() {
		p.serveBatch()
	}
	return false
}

// serveBatch handles up to synBatch SYNs from the ring and sends their
// answers in one system call.
func (p *synPath) serveBatch() {
	now := time.Now()
	answers := 0
	for range synBatch {
		frame, cut, ok := p.sock.Next()
		if !ok {
			break
		}
		if p.handle(now, frame, cut, answers) {
			answers++
		}
		p.sock.Release()
	}
	if answers > 0 {
		p.send(answers)
	}
}

// handle decides for one SYN frame and reports whether it left an answer
// in p.out[slot]. A frame cut short by the ring (a SYN carrying more than
// a ring frame holds) can be answered with a cookie, which needs only its
// headers, but not handed to netstack: it is shed instead (Linux's Fast
// Open client, the one sender of SYNs with data, retransmits its SYN
// without the data).
func (p *synPath) handle(now time.Time, frame []byte, cut bool, slot int) bool {
	if len(frame) < header.EthernetMinimumSize {
		return false
	}
	eth := header.Ethernet(frame)
	// As fdbased: frames for another host are not ours.
	if dst := eth.DestinationAddress(); dst != p.mac && dst[0]&1 == 0 {
		return false
	}
	p.tap.RecordFrame(false, frame)
	p.gate.stats.RxPackets.Add(1)
	p.gate.stats.RxBytes.Add(uint64(len(frame))) // as the link counts: the frame
	proto := eth.Type()
	ip := frame[header.EthernetMinimumSize:]
	if fromOwnAddr(p.gate, proto, frameHeaders(ip)) {
		return false
	}
	if m := p.gate.policy.For(policy.Ingress); m != nil && !admitIngress(m, proto, frameHeaders(ip)) {
		return false
	}
	var answer func() bool
	if p.answer != nil {
		answer = func() bool {
			buf := p.out[slot]
			a, _, ok := p.answer(buf[header.EthernetMinimumSize:header.EthernetMinimumSize], ip)
			if !ok {
				return false
			}
			header.Ethernet(buf).Encode(&header.EthernetFields{SrcAddr: p.mac, DstAddr: eth.SourceAddress(), Type: proto})
			p.outN[slot] = header.EthernetMinimumSize + len(a)
			return true
		}
	}
	verdict := p.gate.syn.admit(now, answer)
	if verdict == synPass && cut {
		verdict = synShed
	}
	if p.gate.stats.turnedAway(verdict) {
		// Only a successful answer makes the verdict synCookied.
		return verdict == synCookied
	}
	pkt := tcpipstack.NewPacketBuffer(tcpipstack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
	pkt.LinkHeader().Consume(header.EthernetMinimumSize)
	pkt.NetworkProtocolNumber = proto
	pkt.RXChecksumValidated = p.rxChecksumValidated
	// Counted above and admitted: past the link's own gate, to netstack.
	p.gate.Endpoint.DeliverNetworkPacket(proto, pkt)
	pkt.DecRef()
	return false
}

// send writes the first n answers; what the socket refuses (its buffer
// full) is dropped and counted: the client retransmits its SYN.
func (p *synPath) send(n int) {
	for k := range n {
		p.outV[k].SetLen(p.outN[k])
		p.outH[k] = rawfile.MMsgHdr{}
		p.outH[k].Msg.Iov = &p.outV[k]
		p.outH[k].Msg.SetIovlen(1)
		p.tap.RecordFrame(true, p.out[k][:p.outN[k]])
	}
	sent := 0
	for sent < n {
		m, errno := rawfile.NonBlockingSendMMsg(p.sock.FD, p.outH[sent:n])
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 || m <= 0 {
			break // counted as failed below; the clients retransmit
		}
		sent += m
	}
	p.count(sent, n-sent)
}
