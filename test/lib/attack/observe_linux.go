package attack

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Recorder is a victim's applications: UDP and TCP servers that note
// every marker they receive, and answer (UDP with the datagram, TCP with
// what it read), so that an attacker who reaches them can read the answer
// back.
type Recorder struct {
	base string

	mu      sync.Mutex // guards what follows
	seen    map[string]string
	closers []io.Closer
}

// NewRecorder records the markers that begin with base.
func NewRecorder(base string) *Recorder {
	return &Recorder{base: base, seen: map[string]string{}}
}

func (r *Recorder) note(b []byte, how string) {
	ms := Markers(b, r.base)
	if len(ms) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range ms {
		if _, ok := r.seen[m]; !ok {
			r.seen[m] = how
		}
	}
}

// ListenUDP serves UDP on addr ("[::]:5001" takes IPv4 too) in the calling
// thread's network namespace.
func (r *Recorder) ListenUDP(addr string) error {
	c, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("listening on udp %s: %w", addr, err)
	}
	r.mu.Lock()
	r.closers = append(r.closers, c)
	r.mu.Unlock()
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			r.note(buf[:n], fmt.Sprintf("udp %s from %s", c.LocalAddr(), from))
			c.WriteTo(buf[:n], from)
		}
	}()
	return nil
}

// ListenTCP serves TCP on addr in the calling thread's network namespace:
// each connection is read for a few seconds and echoed.
func (r *Recorder) ListenTCP(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on tcp %s: %w", addr, err)
	}
	r.mu.Lock()
	r.closers = append(r.closers, ln)
	r.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				how := fmt.Sprintf("tcp %s from %s", ln.Addr(), c.RemoteAddr())
				c.SetDeadline(time.Now().Add(3 * time.Second))
				buf := make([]byte, 65536)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						r.note(buf[:n], how)
						c.Write(buf[:n])
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return nil
}

// Saw says whether the marker arrived, and how.
func (r *Recorder) Saw(marker string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	how, ok := r.seen[marker]
	return how, ok
}

// Seen is every marker that arrived, and how.
func (r *Recorder) Seen() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]string, len(r.seen))
	for k, v := range r.seen {
		out[k] = v
	}
	return out
}

// Close stops the servers.
func (r *Recorder) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.closers {
		c.Close()
	}
	r.closers = nil
}

// watched is one frame a Watch kept.
type watched struct {
	// out: the node sent it into the link (towards the pod).
	out     bool
	seg     Segment
	markers []string
}

// maxWatched bounds what a Watch keeps.
const maxWatched = 1 << 16

// Watch reads a link from the node's side (the node's end of a pod's
// veth), keeping the frames that carry a marker and the TCP and UDP
// headers of what the node sends into it: whether an attacker's packet
// was delivered to a victim, or answered by the node, is read there, below
// any filter the node or the victim's stack may apply.
type Watch struct {
	Link string
	base string
	fd   int

	mu     sync.Mutex // guards kept
	kept   []watched
	closed chan struct{}
	done   chan struct{}
}

// NewWatch opens a Watch on the link with the index in the calling
// thread's network namespace.
func NewWatch(name string, index int, base string) (*Watch, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return nil, fmt.Errorf("opening a packet socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding to %s: %w", name, err)
	}
	tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	// A burst of the pod's own traffic must not push an attack's frame
	// out of the queue before it is read.
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
	w := &Watch{Link: name, base: base, fd: fd, closed: make(chan struct{}), done: make(chan struct{})}
	go w.read()
	return w, nil
}

func (w *Watch) read() {
	defer close(w.done)
	buf := make([]byte, 65536)
	for {
		select {
		case <-w.closed:
			return
		default:
		}
		n, from, err := unix.Recvfrom(w.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		ll, _ := from.(*unix.SockaddrLinklayer)
		if ll == nil || n < header.EthernetMinimumSize {
			continue
		}
		eth := header.Ethernet(buf[:n])
		seg, ok := Parse(uint16(eth.Type()), buf[header.EthernetMinimumSize:n])
		if !ok {
			continue
		}
		k := watched{out: ll.Pkttype == unix.PACKET_OUTGOING, markers: Markers(buf[:n], w.base)}
		if len(k.markers) == 0 && !k.out {
			continue
		}
		seg.Payload = nil
		k.seg = seg
		w.mu.Lock()
		if len(w.kept) < maxWatched {
			w.kept = append(w.kept, k)
		}
		w.mu.Unlock()
	}
}

// Delivered says whether the node sent a frame carrying the marker into
// the link, i.e. towards the pod on its other end.
func (w *Watch) Delivered(marker string) bool { return w.has(true, marker) }

// Received says whether a frame carrying the marker came out of the link
// from the pod (it reached the node's side, which may still drop it).
func (w *Watch) Received(marker string) bool { return w.has(false, marker) }

func (w *Watch) has(out bool, marker string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range w.kept {
		if k.out == out {
			for _, m := range k.markers {
				if m == marker {
					return true
				}
			}
		}
	}
	return false
}

// Answered says whether the node sent into the link an answer to a packet
// of proto from src to dst (Segment.IsAnswer).
func (w *Watch) Answered(proto uint8, src, dst netip.AddrPort) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range w.kept {
		if k.out && k.seg.IsAnswer(proto, src, dst) {
			return true
		}
	}
	return false
}

// SYNTo says whether the node sent into the link a SYN to dst from
// source port sport, and from which address: a stack that relays an
// application's connection dials anew from the application's port, and
// its SYN does not carry what the application's did.
func (w *Watch) SYNTo(dst netip.AddrPort, sport uint16) (netip.AddrPort, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range w.kept {
		if k.out && k.seg.Dst == dst && k.seg.Src.Port() == sport && k.seg.Kind() == "SYN" {
			return k.seg.Src, true
		}
	}
	return netip.AddrPort{}, false
}

// Close stops reading.
func (w *Watch) Close() {
	select {
	case <-w.closed:
		return
	default:
	}
	close(w.closed)
	<-w.done
	unix.Close(w.fd)
}
