// SPDX-License-Identifier: Apache-2.0

package hostile

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/test/lib/attack"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestWireOwnSource sends the pod, from the node's side of its veth, TCP
// SYNs whose source is the pod's own address (IPv4 and IPv6) to a port
// its application listens on: a forgery nothing on the network sends
// legitimately, which a kernel drops as a martian. The pod's stack must
// drop them before netstack, count them (rxOwnSource in its status), and
// the application must see no connection. The pod enforces no policy, so
// the drop is the stack's own, not a denial. The control: a connection
// from the node reaches the application.
func TestWireOwnSource(t *testing.T) {
	nettest.RequireRoot(t)
	env := nettest.NewEnv(t)
	pod := env.NewPod(env.Conf(cniVersion, nil))
	att := loadState(t, env, pod)
	const port = 7100
	ln := nettest.Listen(t, pod.NS, "tcp", ":7100")
	accepted := make(chan net.Addr, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c.RemoteAddr()
			c.Close()
		}
	}()
	fd, f := floodSocket(t, env, pod, att)
	before := status(t, att).Wire.RxOwnSource

	const perFamily = 3
	for _, fam := range []int{4, 6} {
		self := pod.IP(fam)
		for i := range perFamily {
			syn := attack.SYNPacket(netip.AddrPortFrom(self, uint16(40000+10*fam+i)), netip.AddrPortFrom(self, port), nil)
			if _, err := unix.Write(fd, attack.Frame(f.dstMAC, f.srcMAC, attack.EtherType(syn), syn)); err != nil {
				t.Fatalf("sending a SYN from %s to the pod: %v", self, err)
			}
		}
	}
	select {
	case from := <-accepted:
		t.Errorf("the pod's application accepted a connection from %s after SYNs from the pod's own addresses came from the wire: want none", from)
	case <-time.After(2 * time.Second):
	}
	if got := status(t, att).Wire.RxOwnSource - before; got != 2*perFamily {
		t.Errorf("rxOwnSource rose by %d, want %d", got, 2*perFamily)
	}

	c, err := nettest.Dial(env.Node, "tcp", nettest.HostPort(pod.IP(4), port), 2*time.Second)
	if err != nil {
		t.Fatalf("control: connecting from the node: %v", err)
	}
	c.Close()
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("control: the application did not see the node's connection")
	}
}
