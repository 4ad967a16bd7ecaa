package packetsock

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// frame builds an Ethernet frame: IPv4 or IPv6 carrying proto with the
// TCP flags byte set (for TCP), optionally an IPv4 later fragment or with
// IPv4 options.
func frame(v6 bool, proto byte, tcpFlags byte, fragOff uint16, v4Options int) []byte {
	eth := []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00}
	var ip []byte
	if v6 {
		eth[12], eth[13] = 0x86, 0xdd
		ip = make([]byte, 40)
		ip[0] = 0x60
		ip[6] = proto
		ip[7] = 64
	} else {
		ip = make([]byte, 20+v4Options)
		ip[0] = 0x40 | byte(5+v4Options/4)
		binary.BigEndian.PutUint16(ip[6:], fragOff)
		ip[8] = 64
		ip[9] = proto
	}
	l4 := make([]byte, 20)
	l4[12] = 5 << 4
	l4[13] = tcpFlags
	p := append(ip, l4...)
	if v6 {
		binary.BigEndian.PutUint16(p[4:], 20)
	} else {
		binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	}
	return append(eth, p...)
}

// splitLink makes a veth pair a–b in a new namespace, the link's socket,
// the SYN socket and the fragment socket on a, and a socket on b to send
// from.
func splitLink(t *testing.T) (main int, syn *SYNSocket, frag, peer int) {
	nettest.RequireRoot(t)
	netns := nettest.NewNS(t)
	err := netns.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "a"}, PeerName: "b"}); err != nil {
			return err
		}
		for _, n := range []string{"a", "b"} {
			l, err := netlinksafe.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		var err error
		if main, err = Open(Options{IfName: "a"}); err != nil {
			return err
		}
		if syn, err = NewSYNSocket(Options{IfName: "a"}); err != nil {
			return err
		}
		if frag, err = OpenFragments(Options{IfName: "a"}); err != nil {
			syn.Close()
			return err
		}
		if err := Split(main, "a", true, true); err != nil {
			syn.Close()
			unix.Close(frag)
			return err
		}
		peer, err = Open(Options{IfName: "b"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(main); syn.Close(); unix.Close(frag); unix.Close(peer) })
	return main, syn, frag, peer
}

// TestSYNSocketSplitsTheLink: every frame reaches exactly one of the three
// sockets, the SYN socket exactly the new-connection SYNs, the fragment
// socket the IP fragments (a fragmented SYN's first one too); and none
// sees what another sends.
func TestSYNSocketSplitsTheLink(t *testing.T) {
	main, syn, frag, peer := splitLink(t)
	// Whatever the link carried before the split (IPv6 router
	// solicitations and the like) is not under test.
	time.Sleep(50 * time.Millisecond)
	drain(main)
	drain(frag)
	for _, _, ok := syn.Next(); ok; _, _, ok = syn.Next() {
		syn.Release()
	}

	const (
		synF, ackF, synAckF, rstF = 0x02, 0x10, 0x12, 0x04
	)
	cases := []struct {
		name  string
		frame []byte
		class int
	}{
		{"IPv4 SYN", frame(false, unix.IPPROTO_TCP, synF, 0, 0), classSYN},
		{"IPv4 SYN with ECN flags", frame(false, unix.IPPROTO_TCP, synF|0xc0, 0, 0), classSYN},
		{"IPv4 SYN with IP options", frame(false, unix.IPPROTO_TCP, synF, 0, 8), classSYN},
		{"IPv4 SYN, first fragment", frame(false, unix.IPPROTO_TCP, synF, 0x2000, 0), classFragment},
		{"IPv4 SYN, don't fragment", frame(false, unix.IPPROTO_TCP, synF, 0x4000, 0), classSYN},
		{"IPv4 later fragment", frame(false, unix.IPPROTO_TCP, synF, 0x0010, 0), classFragment},
		{"IPv4 last fragment", frame(false, unix.IPPROTO_UDP, 0, 0x0001, 0), classFragment},
		{"IPv4 UDP, first fragment", frame(false, unix.IPPROTO_UDP, 0, 0x2000, 0), classFragment},
		{"IPv4 SYN-ACK", frame(false, unix.IPPROTO_TCP, synAckF, 0, 0), classOther},
		{"IPv4 ACK", frame(false, unix.IPPROTO_TCP, ackF, 0, 0), classOther},
		{"IPv4 RST", frame(false, unix.IPPROTO_TCP, rstF, 0, 0), classOther},
		{"IPv4 UDP", frame(false, unix.IPPROTO_UDP, synF, 0, 0), classOther},
		{"IPv6 SYN", frame(true, unix.IPPROTO_TCP, synF, 0, 0), classSYN},
		{"IPv6 SYN-ACK", frame(true, unix.IPPROTO_TCP, synAckF, 0, 0), classOther},
		{"IPv6 UDP", frame(true, unix.IPPROTO_UDP, synF, 0, 0), classOther},
		{"IPv6 fragment", frame(true, unix.IPPROTO_FRAGMENT, synF, 0, 0), classFragment},
		{"IPv6 hop-by-hop options", frame(true, unix.IPPROTO_HOPOPTS, synF, 0, 0), classOther},
		{"ARP", append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 2, 0x08, 0x06}, make([]byte, 28)...), classOther},
	}
	names := [...]string{classSYN: "SYN socket", classFragment: "fragment socket", classOther: "link's socket"}
	for _, c := range cases {
		if err := unix.Send(peer, c.frame, 0); err != nil {
			t.Fatalf("%s: sending: %v", c.name, err)
		}
		var got [3]bool
		got[classOther], got[classSYN], got[classFragment] = received(t, main, c.frame), receivedRing(t, syn, c.frame), received(t, frag, c.frame)
		for class, g := range got {
			if g != (class == c.class) {
				t.Errorf("%s: reached the SYN socket %v, the fragment socket %v, the link's socket %v; want only the %s",
					c.name, got[classSYN], got[classFragment], got[classOther], names[c.class])
				break
			}
		}
	}

	// What one socket sends, the other must not take as arriving: the
	// pod's own SYNs go out through the link's socket.
	out := frame(false, unix.IPPROTO_TCP, synF, 0, 0)
	if err := unix.Send(main, out, 0); err != nil {
		t.Fatal(err)
	}
	if receivedRing(t, syn, out) {
		t.Error("the SYN socket received a SYN the link's socket sent")
	}
	if !received(t, peer, out) {
		t.Error("the SYN the link's socket sent did not reach the peer")
	}
	answer := frame(false, unix.IPPROTO_TCP, synAckF, 0, 0)
	if err := unix.Send(syn.FD, answer, 0); err != nil {
		t.Fatal(err)
	}
	if received(t, main, answer) {
		t.Error("the link's socket received a frame the SYN socket sent")
	}
	// The stack's own fragments (a large datagram it sends) leave through
	// the link's socket.
	outFrag := frame(false, unix.IPPROTO_UDP, 0, 0x2000, 0)
	if err := unix.Send(main, outFrag, 0); err != nil {
		t.Fatal(err)
	}
	if received(t, frag, outFrag) {
		t.Error("the fragment socket received a fragment the link's socket sent")
	}
}

// received reads fd for up to 200 ms and reports whether want came.
func received(t *testing.T, fd int, want []byte) bool {
	t.Helper()
	deadline := time.Now().Add(200 * time.Millisecond)
	buf := make([]byte, 2048)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, int(left.Milliseconds())+1); err != nil || n == 0 {
			if err == unix.EINTR {
				continue
			}
			return false
		}
		n, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
		if err != nil {
			continue
		}
		if string(buf[:n]) == string(want) {
			return true
		}
	}
}

// receivedRing is received for the SYN socket's ring.
func receivedRing(t *testing.T, s *SYNSocket, want []byte) bool {
	t.Helper()
	deadline := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(deadline) {
		frame, cut, ok := s.Next()
		if !ok {
			time.Sleep(time.Millisecond)
			continue
		}
		got := string(frame) == string(want) && !cut
		s.Release()
		if got {
			return true
		}
	}
	return false
}

// TestSYNRingCutsSYNWithData: a SYN larger than a ring frame arrives cut
// short and says so; the ring wraps around.
func TestSYNRingCutsSYNWithData(t *testing.T) {
	_, syn, _, peer := splitLink(t)
	big := append(frame(false, unix.IPPROTO_TCP, 0x02, 0, 0), make([]byte, 1000)...)
	binary.BigEndian.PutUint16(big[14+2:], uint16(len(big)-14))
	small := frame(false, unix.IPPROTO_TCP, 0x02, 0, 0)
	// More than the ring holds, read as they come: the reader wraps.
	for i := range syn.frames + 10 {
		f := small
		if i%1000 == 0 {
			f = big
		}
		if err := unix.Send(peer, f, 0); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Second)
		for {
			got, cut, ok := syn.Next()
			if ok {
				if len(f) == len(big) {
					if !cut || len(got) >= len(big) || string(got) != string(big[:len(got)]) {
						t.Fatalf("frame %d: a %d-byte SYN came as %d bytes, cut %v", i, len(big), len(got), cut)
					}
				} else if cut || string(got) != string(small) {
					t.Fatalf("frame %d: got %d bytes, cut %v; want the %d-byte SYN whole", i, len(got), cut, len(small))
				}
				syn.Release()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("frame %d never reached the ring", i)
			}
			time.Sleep(10 * time.Microsecond)
		}
	}
}

// drain discards what fd has queued.
func drain(fd int) {
	buf := make([]byte, 1)
	for {
		if _, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT|unix.MSG_TRUNC); err != nil {
			return
		}
	}
}
