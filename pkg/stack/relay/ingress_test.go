package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// countingDialer stands in for the applications: it counts the dials and
// refuses them.
type countingDialer struct{ tcp, udp atomic.Int64 }

var errTestDialer = errors.New("test dialer refuses")

func (d *countingDialer) DialTCP(context.Context, netip.AddrPort, netip.AddrPort) (*net.TCPConn, error) {
	d.tcp.Add(1)
	return nil, errTestDialer
}

func (d *countingDialer) DialUDP(netip.AddrPort, netip.AddrPort) (*net.UDPConn, error) {
	d.udp.Add(1)
	return nil, errTestDialer
}

// acceptingRelay makes rig's relay enforce e and accept from rig's
// listener as a mirror, dialling d.
func acceptingRelay(t *testing.T, rig *cookieRig, e *enforce.Enforcer, d Dialer) *Relay {
	t.Helper()
	r := rig.r
	r.opts = Options{Policy: e}
	r.opts.setDefaults()
	r.pod.Dialer = d
	m := &mirrored{ep: rig.ln, wq: rig.lnWQ, done: make(chan struct{})}
	r.wg.Add(1)
	go r.tcp.mirror.acceptInbound(m)
	t.Cleanup(func() {
		close(m.done)
		r.wg.Wait()
		r.cancel()
	})
	return r
}

// cookieHandshake has the client at sport begin a handshake with the
// fast path's cookie and returns the ACK that completes it.
func cookieHandshake(t *testing.T, rig *cookieRig, sport uint16, isn uint32) []byte {
	t.Helper()
	mss := []byte{tcpOptionMSS, 4, 0x05, 0xb4}
	if !rig.r.AnswerSYN(withSourcePort(rig, rig.segment(isn, 0, header.TCPFlagSyn, mss), sport), "\x02\x00\x00\x00\x00\x09") {
		t.Fatal("the fast path did not answer the SYN")
	}
	synAck := rig.read(t)
	ipLen, _, _, _ := tcpHeaderAt(synAck)
	cookie := header.TCP(synAck[ipLen:]).SequenceNumber()
	return withSourcePort(rig, rig.segment(isn+1, cookie+1, header.TCPFlagAck, nil), sport)
}

// withSourcePort is p, a segment rig.segment made, from port sport.
func withSourcePort(rig *cookieRig, p []byte, sport uint16) []byte {
	ipLen, src, dst, _ := tcpHeaderAt(p)
	t := p[ipLen:]
	binary.BigEndian.PutUint16(t[0:2], sport)
	binary.BigEndian.PutUint16(t[16:18], 0)
	binary.BigEndian.PutUint16(t[16:18], transportChecksum(src, dst, protoTCP, t))
	return p
}

func denyAll(gen uint64) *policy.PodPolicy {
	return &policy.PodPolicy{Version: policy.FormatVersion, Generation: gen,
		Ingress: policy.Direction{Isolated: true, Policies: []string{"test/in"}}}
}

// TestCookieHandshakeTakesIngressVerdict: a handshake completed by an ACK
// carrying a valid SYN cookie gets the ingress verdict before the
// application is dialled. The client's SYN was answered while the policy
// let it in; the policy then denies it, and its ACK completes the
// handshake in the mirrored listener: the application is never dialled,
// the client gets nothing back (no RST, no FIN), the denial is counted.
// An allowed client's cookie handshake still reaches the application.
func TestCookieHandshakeTakesIngressVerdict(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		t.Run(name, func(t *testing.T) {
			rig := newCookieRig(t, v6)
			e, err := enforce.NewEnforcer(&policy.PodPolicy{Version: policy.FormatVersion, Generation: 1})
			if err != nil {
				t.Fatal(err)
			}
			apps := new(countingDialer)
			r := acceptingRelay(t, rig, e, apps)

			ack := cookieHandshake(t, rig, 40000, 1000000)
			if err := e.Set(denyAll(2)); err != nil {
				t.Fatal(err)
			}
			rig.inject(ack)
			deadline := time.Now().Add(5 * time.Second)
			for e.Status().Denied.Ingress["test/in"] == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("no ingress denial counted for the cookie handshake (cookies completed: %d, dials: %d)",
						rig.s.Stats().TCP.ListenOverflowSynCookieRcvd.Value(), apps.tcp.Load())
				}
				time.Sleep(5 * time.Millisecond)
			}
			for rig.s.Stats().TCP.CurrentEstablished.Value() != 0 {
				if time.Now().After(deadline) {
					t.Fatal("the denied connection is still established in netstack")
				}
				time.Sleep(5 * time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if pkt := rig.link.ReadContext(ctx); pkt != nil {
				p := pkt.ToView().AsSlice()
				pkt.DecRef()
				ipLen, _, _, _ := tcpHeaderAt(p)
				t.Fatalf("the denied client got a packet: flags %s", header.TCP(p[ipLen:]).Flags())
			}
			if n := apps.tcp.Load(); n != 0 {
				t.Fatalf("the application was dialled %d times for a denied peer", n)
			}
			if n := e.Status().Denied.Ingress["test/in"]; n != 1 {
				t.Errorf("ingress denials: got %d, want 1", n)
			}
			if n := r.stats.TCPActive.Load(); n != 0 {
				t.Errorf("TCPActive: got %d, want 0", n)
			}
			if d := e.Status().RecentDenials; len(d) != 1 || d[0].Direction != "ingress" || d[0].Protocol != "TCP" ||
				d[0].Peer != rig.client || d[0].Port != 80 || d[0].Local != rig.pod || d[0].Policies != "test/in" || d[0].Generation != 2 {
				t.Errorf("recorded denials: got %+v, want the client's TCP to %s:80 under test/in, generation 2", d, rig.pod)
			}

			// The same client allowed: its cookie handshake is relayed.
			allow := denyAll(3)
			allow.Ingress.Rules = []policy.Rule{{Policy: "test/in", Peers: []policy.Peer{{CIDR: netip.PrefixFrom(rig.client, rig.client.BitLen())}}}}
			if err := e.Set(allow); err != nil {
				t.Fatal(err)
			}
			rig.inject(cookieHandshake(t, rig, 40001, 2000000))
			for apps.tcp.Load() == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the allowed client's connection never reached the application")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if n := e.Status().Denied.Ingress["test/in"]; n != 1 {
				t.Errorf("ingress denials after the allowed client: got %d, want 1", n)
			}
		})
	}
}
