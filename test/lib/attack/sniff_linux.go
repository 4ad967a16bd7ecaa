package attack

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// sniff reads every link with an ETH_P_ALL packet socket (one unbound,
// which sees every link, and one bound to each, promiscuous where the
// link has link-layer addresses) for SniffFor, noting every marker it
// reads.
func (r *runner) sniff() {
	links, err := listLinks()
	if err != nil {
		r.emit(Outcome{Attack: Sniff, Case: "list", Err: err.Error()})
		return
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Index] = l.Name
	}
	type sock struct {
		o  Outcome
		fd int
	}
	var socks []*sock
	open := func(c string, l *link) {
		s := &sock{o: Outcome{Attack: Sniff, Case: c}, fd: -1}
		socks = append(socks, s)
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			s.o.Err = fmt.Sprintf("opening a packet socket: %v", err)
			return
		}
		if l != nil {
			s.o.Link = l.Name
			if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.Index}); err != nil {
				unix.Close(fd)
				s.o.Err = fmt.Sprintf("binding to %s: %v", l.Name, err)
				return
			}
			if l.ethernet() && !l.loopback() {
				mr := unix.PacketMreq{Ifindex: int32(l.Index), Type: unix.PACKET_MR_PROMISC}
				if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, &mr); err != nil {
					s.o.Detail = fmt.Sprintf("not promiscuous: %v", err)
				}
			}
		}
		tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		s.fd = fd
		s.o.Sent = true
	}
	open("all-links", nil)
	for i := range links {
		open(links[i].Name, &links[i])
	}
	r.emit(Outcome{Attack: Sniff, Case: "listening", Sent: true,
		Detail: fmt.Sprintf("%d packet sockets for %s", len(socks), r.s.SniffFor.or(3*time.Second))})
	deadline := time.Now().Add(r.s.SniffFor.or(3 * time.Second))
	var wg sync.WaitGroup
	for _, s := range socks {
		if s.fd < 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer unix.Close(s.fd)
			buf := make([]byte, 65536)
			for time.Now().Before(deadline) {
				n, from, err := unix.Recvfrom(s.fd, buf, 0)
				if err != nil {
					if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
						continue
					}
					s.o.Err = err.Error()
					return
				}
				where := "?"
				if ll, ok := from.(*unix.SockaddrLinklayer); ok {
					where = names[ll.Ifindex]
				}
				for _, m := range Markers(buf[:n], r.s.Marker) {
					if seen := m + "@" + where; !slices.Contains(s.o.Seen, seen) {
						s.o.Seen = append(s.o.Seen, seen)
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, s := range socks {
		slices.Sort(s.o.Seen)
		r.emit(s.o)
	}
}
