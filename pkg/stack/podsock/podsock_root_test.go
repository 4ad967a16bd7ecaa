package podsock_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/stack/podsock"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestDiagListsListeners: the sock_diag dump names every listening TCP
// socket with its address, port and whether an IPv6 one takes IPv4 too,
// and nothing that only connects.
func TestDiagListsListeners(t *testing.T) {
	nettest.RequireRoot(t)
	n := nettest.NewNS(t)
	err := nettest.In(n, func() error {
		d, err := podsock.OpenDiag()
		if err != nil {
			return err
		}
		defer d.Close()
		var lc net.ListenConfig
		l4, err := lc.Listen(context.Background(), "tcp4", "0.0.0.0:7001")
		if err != nil {
			return err
		}
		defer l4.Close()
		l6, err := lc.Listen(context.Background(), "tcp6", "[::]:7002") // Go sets IPV6_V6ONLY for "tcp6"
		if err != nil {
			return err
		}
		defer l6.Close()
		dual, err := lc.Listen(context.Background(), "tcp", ":7003") // dual-stack
		if err != nil {
			return err
		}
		defer dual.Close()
		lo, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:7004")
		if err != nil {
			return err
		}
		defer lo.Close()
		got, err := d.Listeners()
		if err != nil {
			return err
		}
		want := []podsock.Listener{
			{Addr: netip.MustParseAddrPort("0.0.0.0:7001")},
			{Addr: netip.MustParseAddrPort("[::]:7002"), V6Only: true},
			{Addr: netip.MustParseAddrPort("[::]:7003")},
			{Addr: netip.MustParseAddrPort("127.0.0.1:7004")},
		}
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("listeners: got %v, want %+v among them", got, w)
			}
		}
		if len(got) != len(want) {
			t.Errorf("listeners: got %d %v, want %d", len(got), got, len(want))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestTransparentDial: a transparent socket bound to an address the
// namespace does not own reaches a local listener, which sees that
// address as its peer; a closed port is refused.
func TestTransparentDial(t *testing.T) {
	nettest.RequireRoot(t)
	n := nettest.NewNS(t)
	err := nettest.In(n, func() error {
		l, err := net.Listen("tcp4", "127.0.0.1:7101")
		if err != nil {
			return err
		}
		defer l.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		from := netip.MustParseAddrPort("127.9.9.9:4242")
		c, err := podsock.DialTCP(ctx, from, netip.MustParseAddrPort("127.0.0.1:7101"))
		if err != nil {
			return err
		}
		defer c.Close()
		a, err := l.Accept()
		if err != nil {
			return err
		}
		defer a.Close()
		if got := podsock.AddrPort(a.RemoteAddr()); got != from {
			t.Errorf("listener's peer: got %s, want %s", got, from)
		}
		c.Write([]byte("x"))
		b := make([]byte, 1)
		if _, err := io.ReadFull(a, b); err != nil {
			return err
		}
		_, err = podsock.DialTCP(ctx, netip.MustParseAddrPort("127.9.9.9:4243"), netip.MustParseAddrPort("127.0.0.1:7102"))
		if !podsock.Refused(err) {
			t.Errorf("dial to a closed port: got %v, want connection refused", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
