package stack

import (
	"errors"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/stack/wirelink/packetsock"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestPendingSYN: the SYN socket opened in the background is the
// taker's, is closed when Start gives up before taking it, and a missing
// link is an error at take.
func TestPendingSYN(t *testing.T) {
	nettest.RequireRoot(t)
	n := nettest.NewNS(t)
	err := nettest.In(n, func() error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "d0"}, PeerName: "d1"}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		return netlink.LinkSetUp(v)
	})
	if err != nil {
		t.Fatal(err)
	}
	// The stack's whole process is in the pod's namespace; the test's is
	// not, so the background open enters it.
	open := func(ifName string) *pendingSYN {
		return startPending(func() (s *packetsock.SYNSocket, err error) {
			n.Do(func(ns.NetNS) error {
				s, err = packetsock.NewSYNSocket(packetsock.Options{IfName: ifName})
				return nil
			})
			return s, err
		})
	}

	p := open("d0")
	s, err := p.take()
	if err != nil {
		t.Fatalf("take: %v", err)
	}
	p.discard() // taken: not closed
	if _, err := unix.FcntlInt(uintptr(s.FD), unix.F_GETFD, 0); err != nil {
		t.Fatalf("the taken socket was closed by discard: %v", err)
	}
	s.Close()

	p = open("d0")
	<-p.done
	if p.err != nil {
		t.Fatal(p.err)
	}
	fd := p.s.FD
	p.discard()
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Fatalf("an untaken socket is still open after discard (fcntl: %v)", err)
	}

	p = open("missing0")
	if _, err := p.take(); err == nil {
		t.Fatal("take on a missing link: no error")
	}
	p.discard()
}
