// SPDX-License-Identifier: Apache-2.0

package sockmap

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The direct rig's two pods, joined by a veth: the kernel's TCP between
// them stands in for the two stacks, so a connection between them has
// the mirrored four-tuples a connection through two stacks has, and
// what does not take the shortcut still arrives, through TCP.
var (
	podA        = netip.MustParsePrefix("10.251.78.1/30")
	podB        = netip.MustParsePrefix("10.251.78.2/30")
	podA6       = netip.MustParsePrefix("fd00:251:78::1/64")
	podB6       = netip.MustParsePrefix("fd00:251:78::2/64")
	podPrefixes = [2][]netip.Prefix{{podA, podA6}, {podB, podB6}}
)

// pod is a pod of the direct rig: its namespace and cookie.
type pod struct {
	netns  ns.NetNS
	cookie uint64
	addrs  []netip.Addr
}

// directRig is the node's redirect and two pods on a veth.
type directRig struct {
	*rig
	a, b pod
}

// newDirectRig loads the redirect and makes two pods joined by a veth;
// each is put in the redirect by enable (nil: left out).
func newDirectRig(t *testing.T, enableA, enableB func(n *Node, p pod) error) *directRig {
	t.Helper()
	r := newRig(t, false)
	bNS, bCookie := newPodNS(t)
	d := &directRig{rig: r, a: pod{netns: r.netns, cookie: r.cookie}, b: pod{netns: bNS, cookie: bCookie}}
	name := fmt.Sprintf("usn-dt%d", time.Now().UnixNano()%100000)
	if err := r.netns.Do(func(ns.NetNS) error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "b"}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		peer, err := netlink.LinkByName(name + "b")
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(peer, int(bNS.Fd()))
	}); err != nil {
		t.Fatal(err)
	}
	for i, p := range []*pod{&d.a, &d.b} {
		link := name
		if i == 1 {
			link = name + "b"
		}
		if err := p.netns.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(link)
			if err != nil {
				return err
			}
			for _, pfx := range podPrefixes[i] {
				// No DAD: the test must not wait for it.
				a := &netlink.Addr{IPNet: prefixNet(pfx), Flags: unix.IFA_F_NODAD}
				if err := netlink.AddrAdd(l, a); err != nil {
					return err
				}
				p.addrs = append(p.addrs, pfx.Addr())
			}
			return netlink.LinkSetUp(l)
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		p      pod
		enable func(n *Node, p pod) error
	}{{d.a, enableA}, {d.b, enableB}} {
		if c.enable == nil {
			continue
		}
		if err := c.enable(r.node, c.p); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func prefixNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), bits)}
}

func direct(n *Node, p pod) error { return n.EnableDirect(p.cookie, p.addrs) }

func both(n *Node, p pod) error { return n.Enable(p.cookie, true) }

// connect opens a connection from an application of from to one of to,
// at to's address of family (4 or 6); both ends are established (in the
// hashes) when it returns.
func connect(t *testing.T, from, to pod, family int) (client, server *net.TCPConn) {
	t.Helper()
	addr := to.addrs[0]
	if family == 6 {
		addr = to.addrs[1]
	}
	var ln net.Listener
	if err := to.netns.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := from.netns.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		client = c.(*net.TCPConn)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		client.Close()
		t.Fatal(err)
	}
	server = s.(*net.TCPConn)
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func (d *directRig) statsOf(p pod) Stats {
	d.t.Helper()
	s, err := d.node.Stats(p.cookie)
	if err != nil {
		d.t.Fatal(err)
	}
	return s
}

// TestDirectJoinsTwoPods: between two direct pods, IPv4 and IPv6, every
// message each application sends goes to the other application's
// socket, and arrives whole and in order.
func TestDirectJoinsTwoPods(t *testing.T) {
	d := newDirectRig(t, direct, direct)
	for _, family := range []int{4, 6} {
		beforeA, beforeB := d.statsOf(d.a).Direct, d.statsOf(d.b).Direct
		client, server := connect(t, d.a, d.b, family)
		pingPong(t, client, server, 2000, 100)
		if got := d.statsOf(d.a).Direct - beforeA; got != 2000 {
			t.Errorf("IPv%d: pod A sent %d messages straight to pod B's application, want all 2000", family, got)
		}
		if got := d.statsOf(d.b).Direct - beforeB; got != 2000 {
			t.Errorf("IPv%d: pod B answered %d messages straight to pod A's application, want all 2000", family, got)
		}
	}
}

// TestDirectNeedsBothPods: a pod that did not say direct is never joined,
// whatever its peer says: its applications may read with splice, which
// does not see a redirect's queue.
func TestDirectNeedsBothPods(t *testing.T) {
	for name, enableB := range map[string]func(*Node, pod) error{"both": both, "not in the redirect": nil} {
		t.Run(name, func(t *testing.T) {
			d := newDirectRig(t, direct, enableB)
			client, server := connect(t, d.a, d.b, 4)
			pingPong(t, client, server, 200, 64)
			if s := d.statsOf(d.a); s.Direct != 0 {
				t.Errorf("pod A: stats %+v: joined a pod that did not say direct", s)
			}
			if enableB != nil {
				if s := d.statsOf(d.b); s.Direct != 0 {
					t.Errorf("pod B: stats %+v: joined although it did not say direct", s)
				}
			}
		})
	}
}

// TestDirectOtherPodsAddresses: a direct pod that gives itself the
// addresses of two other pods (CAP_NET_ADMIN in its namespace lets it)
// and opens a connection between them with the very four-tuple of their
// own joined connection reaches neither: the verdict joins a socket only
// from its own pod's address, and only to the socket of the pod that
// owns the remote address.
func TestDirectOtherPodsAddresses(t *testing.T) {
	d := newDirectRig(t, direct, direct)
	evilNS, evil := newPodNS(t)
	evilAddr := netip.MustParseAddr("10.251.79.1")
	if err := d.node.EnableDirect(evil, []netip.Addr{evilAddr}); err != nil {
		t.Fatal(err)
	}
	client, server := connect(t, d.a, d.b, 4)
	pingPong(t, client, server, 10, 64)
	local := client.LocalAddr().(*net.TCPAddr).AddrPort()
	remote := client.RemoteAddr().(*net.TCPAddr).AddrPort()
	var evilClient, evilServer net.Conn
	if err := evilNS.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, a := range []netip.Addr{local.Addr(), remote.Addr()} {
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a, 32))}); err != nil {
				return err
			}
		}
		ln, err := net.Listen("tcp4", remote.String())
		if err != nil {
			return err
		}
		defer ln.Close()
		dl := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(local)}
		if evilClient, err = dl.Dial("tcp4", remote.String()); err != nil {
			return err
		}
		evilServer, err = ln.Accept()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { evilClient.Close(); evilServer.Close() })
	// The impostor writes both ways while the pods talk; each pod reads
	// only what its peer sent, in order.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		junk := bytes.Repeat([]byte{0xff}, 64)
		for {
			select {
			case <-stop:
				return
			default:
			}
			evilClient.Write(junk)
			evilServer.Write(junk)
			io.ReadFull(evilServer, make([]byte, 64))
			io.ReadFull(evilClient, make([]byte, 64))
		}
	}()
	pingPong(t, client, server, 2000, 64)
	close(stop)
	<-done
	if s, err := d.node.Stats(evil); err != nil || s.Direct != 0 {
		t.Errorf("the impostor's stats %+v, %v: want nothing joined", s, err)
	}
}

// TestDirectSlowReader: an application facing another pod's application
// that does not read gets Budget through the shortcut, then TCP's window
// (the stacks') holds it, and the reader then reads every byte in order.
func TestDirectSlowReader(t *testing.T) {
	d := newDirectRig(t, direct, direct)
	client, server := connect(t, d.a, d.b, 4)
	server.SetReadBuffer(256 << 10)
	client.SetWriteBuffer(256 << 10)
	writeToNonReader(t, client, server)
	if s := d.statsOf(d.a); s.Direct == 0 || s.Fallbacks == 0 {
		t.Errorf("pod A: stats %+v: want the shortcut first, then TCP", s)
	}
}

// TestDirectHalfClose: a FIN, which crosses the stacks, arrives after
// the data that took the shortcut, and the other direction still works.
func TestDirectHalfClose(t *testing.T) {
	d := newDirectRig(t, direct, direct)
	client, server := connect(t, d.a, d.b, 4)
	halfClose(t, client, server)
	if s := d.statsOf(d.a); s.Direct == 0 {
		t.Errorf("pod A: stats %+v: nothing took the shortcut", s)
	}
}

// TestDirectReset: a peer that closes with unread data resets the
// connection, as TCP does.
func TestDirectReset(t *testing.T) {
	d := newDirectRig(t, direct, direct)
	client, server := connect(t, d.a, d.b, 4)
	resetByServer(t, client, server)
	if s := d.statsOf(d.a); s.Direct == 0 {
		t.Errorf("pod A: stats %+v: nothing took the shortcut", s)
	}
}

// TestDirectCapture: a capture of either pod sends its joined
// connections through TCP, where the capture sees them, without
// reordering what was in flight; a new connection does not join.
func TestDirectCapture(t *testing.T) {
	d := newDirectRig(t, direct, direct)
	client, server := connect(t, d.a, d.b, 4)
	stop := make(chan struct{})
	sent := make(chan int64, 1)
	go func() {
		n, _ := stream(client, stop)
		client.CloseWrite()
		sent <- n
	}()
	got := make(chan int64, 1)
	go func() { got <- readAll(t, server) }()
	time.Sleep(100 * time.Millisecond)
	if err := d.node.SetCapture(d.b.cookie, true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	if n, g := <-sent, <-got; g != n {
		t.Fatalf("read %d bytes, want the %d sent", g, n)
	}
	if s := d.statsOf(d.a); s.Direct == 0 || s.Fallbacks == 0 {
		t.Errorf("pod A: stats %+v: want the shortcut, then TCP once B was captured", s)
	}
	before := d.statsOf(d.a).Direct
	c2, s2 := connect(t, d.a, d.b, 4)
	pingPong(t, c2, s2, 50, 64)
	if after := d.statsOf(d.a).Direct; after != before {
		t.Errorf("%d messages joined to a pod being captured, want none", after-before)
	}
}

// TestDirectSocketsStay: an application's socket of a direct pod that
// went back to TCP stays in the hashes while it is open: the other
// pod's verdict may still join it, and leaving would drop what it
// queues.
func TestDirectSocketsStay(t *testing.T) {
	d := newDirectRig(t, direct, direct)
	client, server := connect(t, d.a, d.b, 4)
	// Over the budget to a reader that does not read yet: the client
	// goes through TCP.
	const n = 3 * Budget
	wrote := make(chan error, 1)
	go func() {
		_, err := client.Write(make([]byte, n))
		wrote <- err
	}()
	time.Sleep(300 * time.Millisecond)
	if _, err := io.ReadFull(server, make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if s := d.statsOf(d.a); s.Fallbacks == 0 {
		t.Fatalf("pod A: stats %+v: the client never went through TCP", s)
	}
	// Past the grace a socket waits before it leaves, with RTT
	// callbacks on the client all along.
	for end := time.Now().Add(leaveGrace + 500*time.Millisecond); time.Now().Before(end); {
		exchange(t, client, server)
		time.Sleep(50 * time.Millisecond)
	}
	if inSocks, _ := d.where(client); !inSocks {
		t.Fatal("the client left the hashes; its peer may still join it")
	}
	// And its peer does: the answer goes straight back.
	before := d.statsOf(d.b).Direct
	exchange(t, server, client)
	if after := d.statsOf(d.b).Direct; after == before {
		t.Error("pod B's answer did not take the shortcut")
	}
}

// TestDisableForgetsAddresses: taking a direct pod out forgets its
// addresses, not another pod's that holds one of them now.
func TestDisableForgetsAddresses(t *testing.T) {
	d := newDirectRig(t, direct, direct)
	newer := d.b.cookie + 1<<40 // a namespace that took over pod A's IPv6 address
	if err := d.node.EnableDirect(newer, d.a.addrs[1:]); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.node.Disable(newer) })
	if err := d.node.Disable(d.a.cookie); err != nil {
		t.Fatal(err)
	}
	owner := func(a netip.Addr) (uint64, bool) {
		var c uint64
		err := d.node.owners.Lookup(ownerKey(a), &c)
		return c, err == nil
	}
	if c, ok := owner(d.a.addrs[0]); ok {
		t.Errorf("pod A's IPv4 address still names netns cookie %d", c)
	}
	if c, ok := owner(d.a.addrs[1]); !ok || c != newer {
		t.Errorf("the reused IPv6 address names %d (%v), want the newer pod's %d", c, ok, newer)
	}
	if c, ok := owner(d.b.addrs[0]); !ok || c != d.b.cookie {
		t.Errorf("pod B's address names %d (%v), want pod B's %d", c, ok, d.b.cookie)
	}
	// A's connections no longer join; they keep working.
	client, server := connect(t, d.a, d.b, 4)
	pingPong(t, client, server, 100, 64)
	if s := d.statsOf(d.b); s.Direct != 0 {
		t.Errorf("pod B: stats %+v: joined a pod taken out", s)
	}
}

// TestLayoutNeedsTCPSockCounts: a kernel whose BTF does not say where
// tcp_sock keeps what a socket received and read cannot order a join,
// and is refused: its pods keep the loopback TCP.
func TestLayoutNeedsTCPSockCounts(t *testing.T) {
	u32 := &btf.Int{Name: "u32", Size: 4}
	ptr := &btf.Pointer{Target: &btf.Void{}}
	var b btf.Builder
	for _, typ := range []btf.Type{
		&btf.Struct{Name: "sock", Size: 16, Members: []btf.Member{{Name: "sk_user_data", Type: ptr, Offset: 64}}},
		&btf.Struct{Name: "sk_psock", Size: 8, Members: []btf.Member{{Name: "msg_tot_len", Type: u32, Offset: 0}}},
		&btf.Struct{Name: "tcp_sock", Size: 8, Members: []btf.Member{{Name: "rcv_nxt", Type: u32, Offset: 0}, {Name: "copied_seq", Type: u32, Offset: 32}}},
		&btf.Func{Name: "bpf_rdonly_cast", Type: &btf.FuncProto{Return: ptr}, Linkage: btf.GlobalFunc},
	} {
		if _, err := b.Add(typ); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := b.Marshal(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := btf.LoadSpecFromReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := layoutIn(spec); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "bytes_received") {
		t.Fatalf("layout of a kernel without tcp_sock's bytes_received: got %v, want ErrUnsupported naming it", err)
	}
}
