package packetsock

import (
	"errors"
	"testing"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestOpenLink: OpenLink opens the link's four sockets, and Close closes
// every one of them, twice harmlessly; without the link's socket it fails
// with nothing open and the SYN socket not asked for; a SYN socket that
// cannot be had is done without, and said so.
func TestOpenLink(t *testing.T) {
	nettest.RequireRoot(t)
	netns := nettest.NewNS(t)
	err := netns.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "a"}, PeerName: "b"}); err != nil {
			return err
		}
		l, err := netlinksafe.LinkByName("a")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	open := func(o LinkOptions) (l *Link, err error) {
		netns.Do(func(ns.NetNS) error {
			l, err = OpenLink(o)
			return nil
		})
		return l, err
	}
	noWarn := func(msg string, err error) { t.Errorf("unexpected warning %q: %v", msg, err) }

	l, err := open(LinkOptions{
		Options:   Options{IfName: "a", VnetHdr: true},
		SYN:       func() (*SYNSocket, error) { return NewSYNSocket(Options{IfName: "a"}) },
		Fragments: true,
		Send:      true,
		Warn:      noWarn,
	})
	if err != nil {
		t.Fatalf("OpenLink: %v", err)
	}
	if l.FD <= 0 || l.TX <= 0 || l.SYN == nil || l.Fragments <= 0 {
		t.Fatalf("OpenLink opened %+v, want all four sockets", *l)
	}
	fds := []int{l.FD, l.TX, l.SYN.FD, l.Fragments}
	l.Close()
	for _, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
			t.Errorf("socket %d still open after Close (fcntl: %v)", fd, err)
		}
	}
	l.Close()

	asked := false
	if _, err := open(LinkOptions{
		Options: Options{IfName: "missing0"},
		SYN:     func() (*SYNSocket, error) { asked = true; return nil, errors.New("not wanted") },
		Warn:    noWarn,
	}); err == nil {
		t.Fatal("OpenLink on a missing link: no error")
	}
	if asked {
		t.Error("OpenLink asked for the SYN socket of a link it could not open")
	}

	var warned []string
	l, err = open(LinkOptions{
		Options: Options{IfName: "a"},
		SYN:     func() (*SYNSocket, error) { return nil, errors.New("no ring here") },
		Warn:    func(msg string, err error) { warned = append(warned, msg) },
	})
	if err != nil {
		t.Fatalf("OpenLink without a SYN socket: %v", err)
	}
	defer l.Close()
	if l.SYN != nil || l.TX != 0 || l.Fragments != 0 || len(warned) != 1 {
		t.Errorf("OpenLink without a SYN socket: got %+v and warnings %q, want the link's socket alone and one warning", *l, warned)
	}
}
