package attack

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// target is one packet an attack sends: UDP or a TCP SYN from src to dst.
type target struct {
	name     string // "udp4", "syn6"
	proto    uint8
	src, dst netip.AddrPort
}

var (
	protoUDP = uint8(header.UDPProtocolNumber)
	protoTCP = uint8(header.TCPProtocolNumber)
)

// targets are the packets from src to dst's ports, per family both have.
func targets(src, dst Pair, udpPort, tcpPort uint16) []target {
	var ts []target
	for _, fam := range []int{4, 6} {
		s, d := src.of(fam), dst.of(fam)
		if !s.IsValid() || !d.IsValid() {
			continue
		}
		if udpPort != 0 {
			ts = append(ts, target{fmt.Sprintf("udp%d", fam), protoUDP, netip.AddrPortFrom(s, 0), netip.AddrPortFrom(d, udpPort)})
		}
		if tcpPort != 0 {
			ts = append(ts, target{fmt.Sprintf("syn%d", fam), protoTCP, netip.AddrPortFrom(s, 0), netip.AddrPortFrom(d, tcpPort)})
		}
	}
	return ts
}

// fresh is t from a source port no other case of the run uses, so that an
// answer (or its absence) belongs to this one case: the pod's own stack
// relays the node's answers into the pod's kernel over loopback, where a
// packet socket on lo reads them too.
func (r *runner) fresh(t target) target {
	if r.ports == nil {
		r.ports = map[uint16]bool{}
	}
	for {
		p := uint16(40000 + rand.IntN(20000))
		if !r.ports[p] {
			r.ports[p] = true
			t.src = netip.AddrPortFrom(t.src.Addr(), p)
			return t
		}
	}
}

func (t target) packet(payload []byte) []byte {
	if t.proto == protoTCP {
		return SYNPacket(t.src, t.dst, payload)
	}
	return UDPPacket(t.src, t.dst, payload)
}

// via says which ways sendAll sends each target.
type via struct {
	links       bool // a packet socket on every link
	rawSocket   bool // a raw IP socket with the IP header written here
	transparent bool // a transparent socket bound to the source address
}

// batch is what sending attacks leave to finish once their packets had
// time to be answered (Spec.Wait, one wait for all the run's senders):
// outcomes to complete and emit, and what to close.
type batch struct {
	pending []Outcome
	// answerOn and sentAs are, by index in pending, the socket an answer
	// would come to and the packet it would answer.
	answerOn map[int]*linkSock
	sentAs   map[int]target
	// results are the transparent connections', by index in pending,
	// filled once wg is done.
	results map[int]*connResult
	wg      sync.WaitGroup
	closers []func()
}

// connResult is what a transparent socket came to.
type connResult struct {
	sent    bool
	reached []string
	err     error
}

func newBatch() *batch {
	return &batch{answerOn: map[int]*linkSock{}, sentAs: map[int]target{}, results: map[int]*connResult{}}
}

// add appends an outcome, with the socket that would read its answer.
func (b *batch) add(o Outcome, s *linkSock, t target) {
	if s != nil {
		b.answerOn[len(b.pending)] = s
		b.sentAs[len(b.pending)] = t
	}
	b.pending = append(b.pending, o)
}

// finish completes the outcomes with what came back, emits them and
// closes what the batch holds.
func (b *batch) finish(emit func(Outcome)) {
	b.wg.Wait()
	for i, o := range b.pending {
		if res := b.results[i]; res != nil {
			o.Sent, o.Reached = res.sent, res.reached
			if res.err != nil {
				o.Err = res.err.Error()
			}
		}
		if s := b.answerOn[i]; s != nil && o.Sent {
			t := b.sentAs[i]
			if a := s.answer(t.proto, t.src, t.dst); a != "" {
				o.Reached = append(o.Reached, fmt.Sprintf("read back an answer (%s) from %s on %s", a, t.dst, s.link.Name))
			}
		}
		emit(o)
	}
	for _, c := range b.closers {
		c()
	}
}

// flush waits once for the answers to every batch sent so far and
// finishes them.
func (r *runner) flush() {
	if len(r.batches) == 0 {
		return
	}
	time.Sleep(r.s.Wait.or(time.Second))
	for _, b := range r.batches {
		b.finish(r.emit)
	}
	r.batches = nil
}

// sendAll sends every target every way, leaving a batch to finish.
func (r *runner) sendAll(attack string, ts []target, how via) {
	if len(ts) == 0 {
		r.emit(Outcome{Attack: attack, Case: "none", Err: "no addresses and ports to send to in the spec"})
		return
	}
	b := newBatch()
	r.batches = append(r.batches, b)
	if how.links {
		links, err := listLinks()
		if err != nil {
			r.emit(Outcome{Attack: attack, Case: "links", Err: err.Error()})
		}
		for _, l := range links {
			s, err := openLinkSock(l)
			if err != nil {
				for _, t := range ts {
					b.add(Outcome{Attack: attack, Case: l.Name + "/" + t.name, Link: l.Name, Src: t.src, Dst: t.dst, Err: err.Error()}, nil, t)
				}
				continue
			}
			b.closers = append(b.closers, s.Close)
			s.resolve(r.s.Self, r.s.NodeAddr)
			for _, t := range ts {
				t := r.fresh(t)
				o := Outcome{Attack: attack, Case: l.Name + "/" + t.name, Link: l.Name, Src: t.src, Dst: t.dst}
				o.Marker = r.marker(attack, o.Case)
				if err := s.send(t.packet([]byte(o.Marker))); err != nil {
					o.Err = err.Error()
				} else {
					o.Sent = true
					o.Detail = fmt.Sprintf("via %s to %s", l, s.gw)
				}
				b.add(o, s, t)
			}
		}
	}
	if how.rawSocket {
		for _, t := range ts {
			t := r.fresh(t)
			o := Outcome{Attack: attack, Case: "rawsock/" + t.name, Src: t.src, Dst: t.dst}
			o.Marker = r.marker(attack, o.Case)
			if err := sendRawIP(t.packet([]byte(o.Marker)), t.dst.Addr()); err != nil {
				o.Err = err.Error()
			} else {
				o.Sent = true
			}
			b.add(o, nil, t)
		}
	}
	if how.transparent {
		// Connections wait for an answer while the rest is sent and read.
		for _, t := range ts {
			t := r.fresh(t)
			o := Outcome{Attack: attack, Case: "transparent/" + t.name, Src: t.src, Dst: t.dst}
			o.Marker = r.marker(attack, o.Case)
			res := &connResult{}
			b.results[len(b.pending)] = res
			b.add(o, nil, t)
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				res.sent, res.reached, res.err = sendTransparent(t, []byte(o.Marker), r.s.Wait.or(time.Second))
			}()
		}
	}
}

// sendRawIP sends a whole IP packet through a raw socket (IPPROTO_RAW:
// IP_HDRINCL for IPv4; IPV6_HDRINCL asked for IPv6), so that its source
// is whatever the packet says.
func sendRawIP(pkt []byte, dst netip.Addr) error {
	fam, level, opt := unix.AF_INET6, unix.IPPROTO_IPV6, unix.IPV6_HDRINCL
	var to unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.As16()}
	if dst.Is4() {
		fam, level, opt = unix.AF_INET, unix.IPPROTO_IP, unix.IP_HDRINCL
		to = &unix.SockaddrInet4{Addr: dst.As4()}
	}
	fd, err := unix.Socket(fam, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return fmt.Errorf("opening a raw socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, level, opt, 1); err != nil {
		return fmt.Errorf("asking for the header to be ours: %w", err)
	}
	if err := unix.Sendto(fd, pkt, 0, to); err != nil {
		return fmt.Errorf("sending: %w", err)
	}
	return nil
}

// sendTransparent sends from a transparent socket bound to t's source (an
// address the pod does not have): a datagram, or a connection that, once
// established, carries payload.
func sendTransparent(t target, payload []byte, wait time.Duration) (sent bool, reached []string, err error) {
	fam, level, opt := unix.AF_INET, unix.SOL_IP, unix.IP_TRANSPARENT
	sa := func(ap netip.AddrPort) unix.Sockaddr {
		return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	}
	if t.src.Addr().Is6() {
		fam, level, opt = unix.AF_INET6, unix.SOL_IPV6, unix.IPV6_TRANSPARENT
		sa = func(ap netip.AddrPort) unix.Sockaddr {
			return &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
		}
	}
	typ := unix.SOCK_DGRAM
	if t.proto == protoTCP {
		typ = unix.SOCK_STREAM
	}
	fd, err := unix.Socket(fam, typ|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return false, nil, fmt.Errorf("opening a socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, level, opt, 1); err != nil {
		return false, nil, fmt.Errorf("making the socket transparent: %w", err)
	}
	if err := unix.Bind(fd, sa(t.src)); err != nil {
		return false, nil, fmt.Errorf("binding to %s: %w", t.src, err)
	}
	if t.proto == protoUDP {
		if err := unix.Sendto(fd, payload, 0, sa(t.dst)); err != nil {
			return false, nil, fmt.Errorf("sending: %w", err)
		}
		return true, nil, nil
	}
	if err := unix.Connect(fd, sa(t.dst)); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return false, nil, fmt.Errorf("connecting: %w", err)
	}
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	n, err := unix.Poll(pfd, int(wait/time.Millisecond))
	if err != nil {
		return true, nil, fmt.Errorf("waiting for the connection: %w", err)
	}
	if n == 0 {
		return true, nil, nil // no answer: what the design wants
	}
	if soErr, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); soErr != 0 {
		return true, nil, fmt.Errorf("connecting: %w", unix.Errno(soErr))
	}
	reached = []string{fmt.Sprintf("connected to %s from %s", t.dst, t.src)}
	if _, err := unix.Write(fd, payload); err != nil {
		return true, reached, fmt.Errorf("writing on the connection: %w", err)
	}
	// Let the payload leave before the close resets the connection.
	time.Sleep(100 * time.Millisecond)
	return true, reached, nil
}

func (r *runner) egress() {
	r.sendAll(Egress, targets(r.s.Self, r.s.Victim, r.s.VictimUDP, r.s.VictimTCP), via{links: true, rawSocket: true})
}

func (r *runner) spoof() {
	r.sendAll(Spoof, targets(r.s.Peer, r.s.Guarded, r.s.GuardedUDP, r.s.GuardedTCP), via{links: true, rawSocket: true, transparent: true})
}

func (r *runner) node() {
	r.sendAll(Node, targets(r.s.Self, r.s.NodeAddr, r.s.NodeUDP, r.s.NodeTCP), via{links: true, rawSocket: true})
}
