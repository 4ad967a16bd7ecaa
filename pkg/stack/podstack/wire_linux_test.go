package podstack

import (
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/offload"
	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/stack/relay"
	"github.com/cni-usernet/cni-usernet/pkg/stack/wirelink/packetsock"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestLinkReaderServesTheLink builds a stack on one end of a veth the way
// the stack process does (the link's socket read by linkReader, a
// send-only socket for fdbased), in both socket shapes (with the
// virtio-net header of hardware GSO, and without), and talks to it from
// the other end: an echo request to the stack's MAC is answered through
// the send socket, one to another MAC is not, and when the link goes down
// the stack reports that it no longer receives.
func TestLinkReaderServesTheLink(t *testing.T) {
	nettest.RequireRoot(t)
	for _, mode := range []offload.Mode{offload.ModeOff, offload.ModeHardware} {
		t.Run(string(mode), func(t *testing.T) {
			s, netns, peer := readerStack(t, mode)
			if !s.link.ReadsLink() {
				t.Fatal("the stack did not read the link itself although it has a send socket")
			}
			other := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x77}
			if seq, ok := pingOnce(t, peer, other, 1); ok {
				t.Fatalf("echo request %d to another MAC was answered", seq)
			}
			for seq := uint16(2); seq < 5; seq++ {
				if _, ok := pingOnce(t, peer, fuzzMAC, seq); !ok {
					t.Fatalf("no echo reply to request %d within 2s", seq)
				}
			}
			if n := s.WireStats.RxPackets.Load(); n < 3 {
				t.Errorf("the link counted %d received frames, want at least the 3 answered requests", n)
			}
			if err := s.Healthy(); err != nil {
				t.Errorf("Healthy() of a serving stack: %v", err)
			}

			err := netns.Do(func(ns.NetNS) error {
				l, err := netlinksafe.LinkByName("a")
				if err != nil {
					return err
				}
				return netlink.LinkSetDown(l)
			})
			if err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-s.Failed():
				if !strings.Contains(err.Error(), "reading the link") {
					t.Errorf("Failed() = %v, want the link reader's error", err)
				}
				// A deaf stack does not call itself healthy.
				if err := s.Healthy(); err == nil || !strings.Contains(err.Error(), "reader stopped") {
					t.Errorf("Healthy() after the link went down: got %v, want the reader's failure", err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("the stack did not report its link going down within 2s")
			}
		})
	}
}

// readerStack makes a veth a–b in a new namespace and a stack on a (the
// fuzz stack's addresses, no SYN socket: the link's socket carries
// everything), and returns a socket on b to send from.
func readerStack(t *testing.T, mode offload.Mode) (*Stack, ns.NetNS, int) {
	return newReaderStack(t, mode, false)
}

// newReaderStack is readerStack, with the link's fragments read from a
// fragment socket of their own (fragPath) if fragments is set.
func newReaderStack(t *testing.T, mode offload.Mode, fragments bool) (*Stack, ns.NetNS, int) {
	netns := nettest.NewNS(t)
	var link *packetsock.Link
	var peer int
	err := netns.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "a", HardwareAddr: fuzzMAC}, PeerName: "b"}); err != nil {
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
		link, err = packetsock.OpenLink(packetsock.LinkOptions{
			Options:   packetsock.Options{IfName: "a", VnetHdr: mode == offload.ModeHardware},
			Fragments: fragments,
			Send:      true,
			Warn:      func(msg string, err error) { t.Errorf("opening the link: %s: %v", msg, err) },
		})
		if err != nil {
			return err
		}
		peer, err = packetsock.Open(packetsock.Options{IfName: "b"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	tun, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		link.Close() // the stack's once Build succeeds: closed already
		unix.Close(peer)
		unix.Close(tun[1])
	})
	dec := offload.Decision{Requested: mode, Mode: mode}
	if mode == offload.ModeHardware {
		dec.Link = offload.LinkGSO{MaxSize: 65536, MaxSegs: 65535, GSO: true, TSO: true}
	}
	s, err := Build(Options{
		Spec: &podnet.Spec{
			Version: podnet.SpecVersion,
			IfName:  "a",
			MAC:     fuzzMAC.String(),
			MTU:     1500,
			Addrs:   []netip.Prefix{netip.PrefixFrom(fuzzPodIP, 24)},
			Routes:  []podnet.Route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gw: fuzzGw}},
			Neighbors: []podnet.Neighbor{
				{IP: fuzzGw, MAC: "02:00:00:00:00:01"},
			},
		},
		Link:         link,
		Pod:          relay.PodSide{TUN: os.NewFile(uintptr(tun[0]), "tun"), Dialer: refusingDialer{}},
		GSO:          dec,
		WireQueueLen: 64,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, netns, peer
}

// pingOnce sends the fuzz stack's probe (an echo request to the pod IP)
// in a frame to dst and waits up to 2s for the reply.
func pingOnce(t *testing.T, peer int, dst net.HardwareAddr, seq uint16) (uint16, bool) {
	t.Helper()
	frame := fuzzProbe(seq)
	copy(frame[:6], dst) // the Ethernet destination
	if _, err := unix.Write(peer, frame); err != nil {
		t.Fatalf("sending echo request %d: %v", seq, err)
	}
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		fds := []unix.PollFd{{Fd: int32(peer), Events: unix.POLLIN}}
		if n, _ := unix.Poll(fds, 100); n <= 0 {
			continue
		}
		n, err := unix.Read(peer, buf)
		if err != nil {
			continue
		}
		if got, ok := probeReply(buf[:n]); ok && got == seq {
			return seq, true
		}
	}
	return seq, false
}

// TestCloseReleasesTheLinkSockets: Close releases the link's socket and
// the send socket it was given, rather than leaving them to the
// process's exit, which releases them one grace period after another.
func TestCloseReleasesTheLinkSockets(t *testing.T) {
	s, _, _ := readerStack(t, offload.ModeHardware)
	inodes := map[uint64]int{}
	for _, fd := range []int{s.opts.Link.FD, s.opts.Link.TX} {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatalf("fstat %d: %v", fd, err)
		}
		inodes[st.Ino] = fd
	}
	s.Close()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		var st unix.Stat_t
		if unix.Stat("/proc/self/fd/"+e.Name(), &st) != nil {
			continue
		}
		if fd, ok := inodes[st.Ino]; ok && st.Mode&unix.S_IFMT == unix.S_IFSOCK {
			t.Errorf("socket %d (inode %d) still open after Close, as fd %s", fd, st.Ino, e.Name())
		}
	}
	s.Close() // twice is harmless
}
