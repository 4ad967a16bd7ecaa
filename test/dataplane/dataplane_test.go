// Package dataplane holds the root tests of the per-pod stack: real
// namespaces, a veth, the real plugin and real traffic both ways.
package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

const cniVersion = "1.1.0"

func newPod(t *testing.T, extra map[string]any) (*nettest.Env, *nettest.Pod) {
	t.Helper()
	env := nettest.NewEnv(t)
	return env, env.NewPod(env.Conf(cniVersion, extra))
}

func stackStatus(t *testing.T, env *nettest.Env, pod *nettest.Pod) control.Status {
	t.Helper()
	return stackStatusB(t, env, pod)
}

func stackStatusB(t testing.TB, env *nettest.Env, pod *nettest.Pod) control.Status {
	t.Helper()
	att, err := state.Store{Dir: env.Dir + "/state"}.Load(pod.ID, "eth0")
	if err != nil {
		t.Fatalf("loading state of %s: %v", pod.ID, err)
	}
	var st control.Status
	if err := control.FetchStatus(att.ControlSocket, 5*time.Second, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestHTTPBothWays checks that each side sees the other's real address, in
// both directions and both families.
func TestHTTPBothWays(t *testing.T) {
	env, pod := newPod(t, nil)
	nettest.ServeRemoteAddr(t, nettest.Listen(t, pod.NS, "tcp", ":8080"))
	nettest.ServeRemoteAddr(t, nettest.Listen(t, env.Node, "tcp", ":8081"))
	for _, fam := range []int{4, 6} {
		t.Run(fmt.Sprintf("IPv%d", fam), func(t *testing.T) {
			if got, want := nettest.GetPeer(t, env.Node, pod.IP(fam), 8080), pod.Gateway(fam); got != want {
				t.Errorf("node→pod: pod saw client %s, want %s", got, want)
			}
			if got, want := nettest.GetPeer(t, pod.NS, pod.Gateway(fam), 8081), pod.IP(fam); got != want {
				t.Errorf("pod→node: node saw client %s, want %s", got, want)
			}
		})
	}
}

// TestClosedPortRefused checks that a refusal crosses the relay as a
// refusal, quickly, both ways.
func TestClosedPortRefused(t *testing.T) {
	env, pod := newPod(t, nil)
	for _, c := range []struct {
		name string
		from ns.NetNS
		to   netip.Addr
	}{{"node→pod", env.Node, pod.IP(4)}, {"pod→node", pod.NS, pod.Gateway(4)}, {"node→pod v6", env.Node, pod.IP(6)}, {"pod→node v6", pod.NS, pod.Gateway(6)}} {
		start := time.Now()
		_, err := nettest.Dial(c.from, "tcp", nettest.HostPort(c.to, 9), 5*time.Second)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s: dial closed port: got %v, want connection refused", c.name, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: refusal took %s, want under 1s", c.name, d)
		}
	}
}

// TestBulkTransferPerMode moves 256 MiB each way, byte-exact, in every GSO
// mode, and checks the mode actually used and its GSO batch counter.
func TestBulkTransferPerMode(t *testing.T) {
	size := int64(256 << 20)
	if testing.Short() {
		size = 16 << 20
	}
	for _, c := range []struct {
		name     string
		extra    map[string]any
		wantMode string
	}{
		{"hardware", map[string]any{"gso": "hardware"}, "hardware"},
		{"software", map[string]any{"gso": "software"}, "software"},
		{"off", map[string]any{"gso": "off"}, "off"},
		{"auto-on-link-without-offload", map[string]any{"gso": "auto", "podLinkOffloadsOff": true}, "software"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env, pod := newPod(t, c.extra)
			st := stackStatus(t, env, pod)
			if string(st.GSO.Mode) != c.wantMode {
				t.Fatalf("GSO mode: got %s (%s), want %s", st.GSO.Mode, st.GSO.Reason, c.wantMode)
			}
			start := time.Now()
			if err := (nettest.Transfer{Server: pod.NS, Client: env.Node, Addr: pod.IP(4), Port: 5001, Bytes: size}).Run(); err != nil {
				t.Fatalf("node→pod: %v", err)
			}
			in := time.Since(start)
			before := hostVethRx(t, env, pod)
			start = time.Now()
			if err := (nettest.Transfer{Server: pod.NS, Client: env.Node, Addr: pod.IP(4), Port: 5002, Bytes: size, ServerSends: true}).Run(); err != nil {
				t.Fatalf("pod→node: %v", err)
			}
			out := time.Since(start)
			// What the pod's frames looked like on the wire, at the node's
			// end of the veth: bursts passed whole to the veth in hardware
			// mode, segmented by the kernel before it in software mode.
			after := hostVethRx(t, env, pod)
			frame := (after.RxBytes - before.RxBytes) / max(after.RxPackets-before.RxPackets, 1)
			const wireFrame = 1500 + 14 // MTU and Ethernet header
			if c.wantMode == "hardware" && frame <= wireFrame {
				t.Errorf("hardware: pod→node frames of %d bytes on average at the node, want GSO bursts (> %d)", frame, wireFrame)
			}
			if c.wantMode != "hardware" && frame > wireFrame {
				t.Errorf("%s: pod→node frames of %d bytes on average at the node, want MTU-sized frames (≤ %d)", c.wantMode, frame, wireFrame)
			}
			t.Logf("%s: node→pod %.2f Gbit/s, pod→node %.2f Gbit/s", c.name, gbps(size, in), gbps(size, out))
			st = stackStatus(t, env, pod)
			batches := st.Wire.TxGSOBatches
			if c.wantMode == "off" && batches != 0 {
				t.Errorf("GSO batches in off mode: got %d, want 0", batches)
			}
			if c.wantMode != "off" && batches == 0 {
				t.Errorf("GSO batches in %s mode: got 0, want > 0", c.wantMode)
			}
		})
	}
}

// TestDownloadsThroughAFullWireQueue sends from the pod on eight
// connections at once with bursts of two segments (gsoMaxSegs 2) into a
// wire queue of 64 packets: the queue is full most of the time. A packet
// that finds it full must wait, not be dropped. Dropped, the tail of a
// window is lost with nothing above it for the node to SACK, and
// netstack's recovery then sent one segment per retransmission timeout
// (make bench-quick's nginx 10 MiB hung on it with gso_max_segs 2).
func TestDownloadsThroughAFullWireQueue(t *testing.T) {
	env, pod := newPod(t, map[string]any{"gso": "hardware", "gsoMaxSegs": 2, "wireQueueLen": 64})
	size := int64(32 << 20)
	if testing.Short() {
		size = 8 << 20
	}
	const conns = 8
	errs := make(chan error, conns)
	for i := range conns {
		go func() {
			errs <- (nettest.Transfer{Server: pod.NS, Client: env.Node, Addr: pod.IP(4), Port: 5100 + i,
				Bytes: size, ServerSends: true, Timeout: time.Minute}).Run()
		}()
	}
	for i := range conns {
		if err := <-errs; err != nil {
			t.Errorf("download %d: %v", i, err)
		}
	}
	st := stackStatus(t, env, pod)
	if st.GSO.Link.MaxSegs != 2 {
		t.Errorf("stack's gso_max_segs: got %d, want 2", st.GSO.Link.MaxSegs)
	}
	if st.Wire.TxQueueWaits == 0 {
		t.Errorf("wire queue waits: got 0, want > 0 (the queue never filled: the test checks nothing)")
	}
	if st.Wire.TxQueueDrops != 0 || st.Wire.IPOutgoingErrors != 0 {
		t.Errorf("wire queue drops %d, IP outgoing errors %d: want 0, 0", st.Wire.TxQueueDrops, st.Wire.IPOutgoingErrors)
	}
	t.Logf("wire queue: %d waits; %d TCP retransmits", st.Wire.TxQueueWaits, st.Wire.TCPRetransmits)
}

// hostVethRx reads the counters of the pod's veth on the node's side.
func hostVethRx(t *testing.T, env *nettest.Env, pod *nettest.Pod) netlink.LinkStatistics {
	t.Helper()
	var st netlink.LinkStatistics
	err := env.Node.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(pod.HostVeth())
		if err != nil {
			return err
		}
		st = *l.Attrs().Statistics
		return nil
	})
	if err != nil {
		t.Fatalf("reading the counters of %s: %v", pod.HostVeth(), err)
	}
	return st
}

func gbps(n int64, d time.Duration) float64 { return float64(n*8) / d.Seconds() / 1e9 }

// TestHalfClose: the client shuts its write side, the server keeps sending,
// and the client receives everything.
func TestHalfClose(t *testing.T) {
	env, pod := newPod(t, nil)
	for _, c := range []struct {
		name         string
		srvNS, cliNS ns.NetNS
		srv          netip.Addr
	}{{"node→pod", pod.NS, env.Node, pod.IP(4)}, {"pod→node", env.Node, pod.NS, pod.Gateway(4)}} {
		t.Run(c.name, func(t *testing.T) {
			ln := nettest.Listen(t, c.srvNS, "tcp", nettest.HostPort(c.srv, 7000))
			reply := bytes.Repeat([]byte("r"), 1<<20)
			go func() {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				defer conn.Close()
				req, _ := io.ReadAll(conn) // until the client's FIN
				conn.Write(req)
				conn.Write(reply)
			}()
			conn, err := nettest.Dial(c.cliNS, "tcp", nettest.HostPort(c.srv, 7000), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			conn.Write([]byte("hello"))
			if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(conn)
			if err != nil {
				t.Fatalf("reading after half-close: %v", err)
			}
			if want := 5 + len(reply); len(got) != want || string(got[:5]) != "hello" {
				t.Fatalf("after half-close got %d bytes (%q...), want %d starting hello", len(got), got[:min(len(got), 8)], want)
			}
		})
	}
}

// TestConcurrentConnections opens 500 connections at once, each exchanging
// data with an echo server in the pod.
func TestConcurrentConnections(t *testing.T) {
	env, pod := newPod(t, nil)
	ln := nettest.Listen(t, pod.NS, "tcp", ":7001")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	const n = 500
	var wg sync.WaitGroup
	errs := make(chan error, n)
	conns := make([]net.Conn, n)
	for i := range n {
		c, err := nettest.Dial(env.Node, "tcp", nettest.HostPort(pod.IP(4), 7001), 10*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns[i] = c
		defer c.Close()
	}
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			msg := bytes.Repeat([]byte{byte(i)}, 4096)
			if _, err := c.Write(msg); err != nil {
				errs <- fmt.Errorf("conn %d write: %w", i, err)
				return
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil {
				errs <- fmt.Errorf("conn %d read: %w", i, err)
				return
			}
			if !bytes.Equal(got, msg) {
				errs <- fmt.Errorf("conn %d: echo differs", i)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := stackStatus(t, env, pod); st.Relay.TCPActive < n {
		t.Errorf("active relays: got %d, want >= %d", st.Relay.TCPActive, n)
	}
}

// udpEcho serves echoes, answering with the sender's address prepended.
func udpEcho(c *net.UDPConn) {
	buf := make([]byte, 65535)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		reply := append([]byte(from.Addr().Unmap().String()+"|"), buf[:n]...)
		c.WriteToUDPAddrPort(reply, from)
	}
}

// TestUDPEcho: datagrams both ways, both families, with the source address
// preserved.
func TestUDPEcho(t *testing.T) {
	env, pod := newPod(t, nil)
	go udpEcho(nettest.ListenUDP(t, pod.NS, ":5353"))
	go udpEcho(nettest.ListenUDP(t, env.Node, ":5354"))
	// Port 53 as DNS uses it: below 1024, the stack's socket for a flow
	// the pod opens binds the remote's port (the sandbox must allow it).
	go udpEcho(nettest.ListenUDP(t, pod.NS, ":53"))
	go udpEcho(nettest.ListenUDP(t, env.Node, ":53"))
	for _, fam := range []int{4, 6} {
		for _, c := range []struct {
			name     string
			from     ns.NetNS
			to       netip.Addr
			port     int
			wantPeer netip.Addr
		}{
			{"node→pod", env.Node, pod.IP(fam), 5353, pod.Gateway(fam)},
			{"pod→node", pod.NS, pod.Gateway(fam), 5354, pod.IP(fam)},
			{"node→pod:53", env.Node, pod.IP(fam), 53, pod.Gateway(fam)},
			{"pod→node:53", pod.NS, pod.Gateway(fam), 53, pod.IP(fam)},
		} {
			t.Run(fmt.Sprintf("%s/IPv%d", c.name, fam), func(t *testing.T) {
				conn, err := nettest.Dial(c.from, "udp", nettest.HostPort(c.to, c.port), time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				for i := range 3 {
					msg := fmt.Sprintf("ping-%d-%s", i, strings.Repeat("x", 1000*i))
					conn.SetDeadline(time.Now().Add(2 * time.Second))
					conn.Write([]byte(msg))
					buf := make([]byte, 65535)
					n, err := conn.Read(buf)
					if err != nil {
						t.Fatalf("datagram %d: %v", i, err)
					}
					if want := c.wantPeer.String() + "|" + msg; string(buf[:n]) != want {
						t.Fatalf("echo %d: got %.40q, want %.40q", i, buf[:n], want)
					}
				}
			})
		}
	}
}

// TestPing: the stack answers pings to the pod IPs, and pings from the pod
// reach the node.
func TestPing(t *testing.T) {
	env, pod := newPod(t, nil)
	nettest.PingBothWays(t, env.Node, pod)
}

// TestLocalTrafficStaysLocal: the pod reaches its own IP and loopback
// without the stack.
func TestLocalTrafficStaysLocal(t *testing.T) {
	env, pod := newPod(t, nil)
	ln := nettest.Listen(t, pod.NS, "tcp", ":7002")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("local"))
			c.Close()
		}
	}()
	before := stackStatus(t, env, pod).Relay.TCPTotal
	for _, addr := range []string{nettest.HostPort(pod.IP(4), 7002), "127.0.0.1:7002"} {
		c, err := nettest.Dial(pod.NS, "tcp", addr, time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		b, _ := io.ReadAll(c)
		c.Close()
		if string(b) != "local" {
			t.Errorf("%s: got %q", addr, b)
		}
	}
	if after := stackStatus(t, env, pod).Relay.TCPTotal; after != before {
		t.Errorf("relayed connections went from %d to %d: local traffic went through the stack", before, after)
	}
}
