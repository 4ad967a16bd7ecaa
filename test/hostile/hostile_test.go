// Package hostile holds the root tests of a pod stack under hostile
// traffic: paced floods from the node's side of its veth (a SYN flood, a
// UDP flood to many ports, IPv4 fragments that never reassemble and random
// frames) while a bulk transfer runs; a SYN flood at full speed from the
// node (hping3) and a connection flood from inside a pod, each measured
// beside the kernel veth (docs/reliability/hostile.md); and the hostile pod
// itself (TestWire, with test/lib/attack): a root process with a container's
// capabilities, with and without CAP_NET_ADMIN, cannot reach past its
// policies, spoof, poison the node's neighbour table, create or move links
// that lead anywhere, reach other namespaces, or read denied traffic
// (docs/security.md).
package hostile

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/stack"
	"github.com/cni-usernet/cni-usernet/pkg/stack/relay"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

const cniVersion = "1.1.0"

// spoofRange is where the flood's source addresses come from (RFC 2544's
// benchmarking range). The node namespace blackholes it, so the pod's
// SYN-ACKs and ICMP errors to those sources vanish without an answer, as
// they would for a real spoofing attacker.
var spoofRange = netip.MustParsePrefix("198.18.0.0/15")

// TestHostileTraffic floods pod A's stack (10,000 frames/s for 40 s: what a
// stack keeps up with on a 2-core machine that other work shares; beyond,
// the kernel drops the excess at the stack's socket, legitimate packets
// included, see docs/reliability/hostile.md) from the node namespace while a
// 256 MiB transfer to pod A runs, and checks that the transfer is
// byte-exact, that pod B and an established connection to pod A keep
// working, that a new connection to pod A works after the flood, that pod
// A's stack RSS stays under its documented bound, and that the stack's
// counters show it received the flood.
func TestHostileTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("hostile traffic takes about 45 s; run without -short")
	}
	env := nettest.NewEnv(t)
	conf := env.Conf(cniVersion, nil)
	podA, podB := env.NewPod(conf), env.NewPod(conf)
	attA := loadState(t, env, podA)

	serveHTTP(t, nettest.Listen(t, podA.NS, "tcp", ":8080"), "A")
	serveHTTP(t, nettest.Listen(t, podB.NS, "tcp", ":8080"), "B")
	echo := nettest.Listen(t, podA.NS, "tcp", ":7001")
	nettest.Serve(echo, nettest.Echo)
	established, err := nettest.Dial(env.Node, "tcp", nettest.HostPort(podA.IP(4), 7001), 5*time.Second)
	if err != nil {
		t.Fatalf("dialling pod A's echo server: %v", err)
	}
	defer established.Close()
	checkEcho(t, established, "before the flood")
	blackhole(t, env.Node, spoofRange)

	fd, f := floodSocket(t, env, podA, attA)
	before := status(t, attA)

	cpu0 := nettest.StackCPU(attA.StackPID)
	rss := sampleRSS(attA.StackPID, 50*time.Millisecond)
	defer rss.stop()

	// The transfer starts first and is paced to last about as long as the
	// flood, which starts right after it.
	opts := floodOptions{PerKind: 100_000, UDPPorts: 10_000, Rate: 10_000}
	floodTime := time.Duration(4*opts.PerKind/opts.Rate) * time.Second
	const size = 256 << 20
	transferDone := make(chan error, 1)
	transferStart := time.Now()
	go func() {
		transferDone <- nettest.Transfer{Server: podA.NS, Client: env.Node, Addr: podA.IP(4), Port: 5001,
			Bytes: size, Rate: size / int64(floodTime.Seconds())}.Run()
	}()
	time.Sleep(500 * time.Millisecond)
	stopFlood := make(chan struct{})
	type floodResult struct {
		c   floodCounts
		err error
	}
	floodDone := make(chan floodResult, 1)
	go func() {
		c, err := flood(fd, f, opts, stopFlood)
		floodDone <- floodResult{c, err}
	}()
	defer close(stopFlood)

	// Pod B and pod A's established connection, probed during the flood.
	var probeErrs []error
	var probes atomic.Int64
	var probeMu sync.Mutex
	probeCtx, stopProbes := context.WithCancel(context.Background())
	var probeWG sync.WaitGroup
	probeWG.Add(1)
	go func() {
		defer probeWG.Done()
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-probeCtx.Done():
				return
			case <-tick.C:
			}
			probes.Add(1)
			err := getBody(env.Node, podB.IP(4), 8080, "B")
			if err == nil {
				err = echoOnce(established)
			}
			if err != nil {
				probeMu.Lock()
				probeErrs = append(probeErrs, fmt.Errorf("probe %d at %s: %w", probes.Load(), time.Now().Format("15:04:05.000"), err))
				probeMu.Unlock()
			}
		}
	}()

	if err := <-transferDone; err != nil {
		t.Errorf("transfer during the flood: %v", err)
	}
	transferTime := time.Since(transferStart)
	fr := <-floodDone
	stopProbes()
	probeWG.Wait()
	if fr.err != nil {
		t.Fatalf("flood: %v", fr.err)
	}
	t.Logf("flood: %d SYN, %d UDP to %d ports, %d fragments, %d random frames in %s; paced transfer of %d MiB took %s",
		fr.c.SYN, fr.c.UDP, fr.c.UDPPorts, fr.c.Fragments, fr.c.Garbage, fr.c.Duration.Round(time.Millisecond), size>>20, transferTime.Round(time.Millisecond))
	for _, err := range probeErrs {
		t.Errorf("during the flood: %v", err)
	}
	if probes.Load() < 5 {
		t.Errorf("probes during the flood: got %d, want >= 5", probes.Load())
	}

	// After the flood: the old connection, and a new one (the stack may
	// still be releasing the flood's half-open connections, so the client
	// retries as a kernel's connect would).
	checkEcho(t, established, "after the flood")
	if err := retry(20*time.Second, func() error { return getBody(env.Node, podA.IP(4), 8080, "A") }); err != nil {
		t.Errorf("new connection to pod A after the flood: %v", err)
	}
	if err := getBody(env.Node, podB.IP(4), 8080, "B"); err != nil {
		t.Errorf("pod B after the flood: %v", err)
	}

	after := status(t, attA)
	peak := rss.stop()
	t.Logf("stack CPU during the test: %s", nettest.StackCPU(attA.StackPID)-cpu0)
	checkCounters(t, before, after, fr.c)
	bound := rssBound(t, attA)
	t.Logf("stack RSS: peak %.1f MiB, bound %.1f MiB", mib(peak), mib(bound))
	if peak > bound {
		t.Errorf("stack RSS peak: got %.1f MiB, want <= %.1f MiB", mib(peak), mib(bound))
	}
	if peak == 0 {
		t.Errorf("stack RSS never sampled (pid %d)", attA.StackPID)
	}
}

// checkCounters checks that the stack read the flood: the wire leg's
// received frames grew by at least half of what was sent (what the stack
// cannot read in time the kernel drops at its socket; the transfer only
// adds to the count), the relay and the mirrored listener saw at least half
// of the SYNs, the relay half of the UDP datagrams, and its limits held.
func checkCounters(t *testing.T, before, after control.Status, c floodCounts) {
	t.Helper()
	rx := after.Wire.RxPackets - before.Wire.RxPackets
	t.Logf("wire rx %d frames (flood %d)", rx, c.total())
	t.Logf("relay before %+v", before.Relay)
	t.Logf("relay after  %+v", after.Relay)
	if want := uint64(c.total()) / 2; rx < want {
		t.Errorf("wire frames received during the flood: got %d, want >= %d (half of %d sent)", rx, want, c.total())
	}
	// SYNs to the listening port meet the wire leg's mirror of the
	// listener (SYN cookies once its backlog is full, from the link's fast
	// path while it is), the others the relay's forwarder.
	syns := after.Relay.TCPSyns - before.Relay.TCPSyns + int64(after.Wire.SynCookiesSent-before.Wire.SynCookiesSent) +
		after.Relay.TCPCookieFast - before.Relay.TCPCookieFast
	if want := int64(c.SYN) / 2; syns < want {
		t.Errorf("SYNs the relay and the mirrored listener saw: got %d, want >= %d", syns, want)
	}
	udp := (after.Relay.UDPTotal + after.Relay.UDPLimitHit) - (before.Relay.UDPTotal + before.Relay.UDPLimitHit)
	if want := int64(c.UDP) / 2; udp < want {
		t.Errorf("UDP datagrams that opened or were refused a flow: got %d, want >= %d", udp, want)
	}
	if a, limit := after.Relay.UDPActive, int64(relay.DefaultMaxUDPUnreplied); a > limit {
		t.Errorf("UDP flows after the flood: got %d, want <= %d (none was answered)", a, limit)
	}
	if p, limit := after.Relay.TCPPending, int64(2*relay.DefaultMaxPendingInbound); p > limit {
		t.Errorf("pending inbound connections after the flood: got %d, want <= %d", p, limit)
	}
}

func loadState(t *testing.T, env *nettest.Env, pod *nettest.Pod) *state.Attachment {
	t.Helper()
	att, err := state.Store{Dir: env.Dir + "/state"}.Load(pod.ID, "eth0")
	if err != nil {
		t.Fatalf("loading state of %s: %v", pod.ID, err)
	}
	return att
}

func status(t *testing.T, att *state.Attachment) control.Status {
	t.Helper()
	var st control.Status
	if err := control.FetchStatus(att.ControlSocket, 10*time.Second, &st); err != nil {
		t.Fatalf("reading stack status: %v", err)
	}
	return st
}

// rssBound is the documented bound for the stack's configuration with
// one bulk connection (the transfer); the pod answers none of the flood's
// UDP.
func rssBound(t *testing.T, att *state.Attachment) int64 {
	t.Helper()
	return rssBoundFor(stack.MemoryLoad{BulkTCP: 1})
}

// rssBoundFor is the documented bound for the stack under load (the
// relay's default limits: the tests' conflists leave them).
func rssBoundFor(load stack.MemoryLoad) int64 {
	b := stack.MemoryBound(load)
	if raceEnabled {
		// The race detector's shadow memory and bookkeeping cost 5-10x
		// the program's own (Go's race detector documentation).
		b *= 10
	}
	return b
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// floodSocket opens the sending socket on the node's side of pod's veth
// and prepares the frames' addresses.
func floodSocket(t *testing.T, env *nettest.Env, pod *nettest.Pod, att *state.Attachment) (int, *framer) {
	t.Helper()
	var podMAC net.HardwareAddr
	err := nettest.In(env.WireNS(pod), func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		podMAC = l.Attrs().HardwareAddr
		return nil
	})
	if err != nil {
		t.Fatalf("reading pod's eth0: %v", err)
	}
	var fd int
	var hostMAC net.HardwareAddr
	err = nettest.In(env.Node, func() error {
		l, err := netlink.LinkByName(att.HostVeth)
		if err != nil {
			return err
		}
		hostMAC = l.Attrs().HardwareAddr
		fd, err = openPacketSocket(l.Attrs().Index)
		return err
	})
	if err != nil {
		t.Fatalf("opening the flood socket on %s: %v", att.HostVeth, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd, &framer{
		dstMAC:  podMAC,
		srcMAC:  hostMAC,
		dst:     tcpip.AddrFrom4(pod.IP(4).As4()),
		spoof:   spoofRange,
		synPort: 8080,
		rng:     rand.New(rand.NewPCG(1, 2)),
	}
}

// blackhole makes the node namespace drop traffic to prefix silently.
func blackhole(t *testing.T, node ns.NetNS, prefix netip.Prefix) {
	t.Helper()
	route := &netlink.Route{
		Dst:  &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), 32)},
		Type: unix.RTN_BLACKHOLE,
	}
	if err := nettest.In(node, func() error { return netlink.RouteAdd(route) }); err != nil {
		t.Fatalf("blackholing %s in the node namespace: %v", prefix, err)
	}
}

// rssSampler records the peak VmRSS of a process.
type rssSampler struct {
	peak atomic.Int64
	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

func sampleRSS(pid int, every time.Duration) *rssSampler {
	s := &rssSampler{done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if v, err := vmRSS(pid); err == nil && v > s.peak.Load() {
				s.peak.Store(v)
			}
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// stop ends sampling and returns the peak.
func (s *rssSampler) stop() int64 {
	s.once.Do(func() { close(s.done) })
	s.wg.Wait()
	return s.peak.Load()
}

// vmRSS reads /proc/PID/status's VmRSS in bytes.
func vmRSS(pid int) (int64, error) { return procStatusBytes(pid, "VmRSS") }

// procStatusBytes reads a size (VmRSS, VmHWM) from /proc/PID/status in
// bytes.
func procStatusBytes(pid int, key string) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing %s %q: %w", key, rest, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", key, pid)
}

func serveHTTP(t *testing.T, ln net.Listener, body string) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, body)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// getBody GETs / from netns and checks the body.
func getBody(from ns.NetNS, to netip.Addr, port int, want string) error {
	c := nettest.HTTPClient(from, 5*time.Second)
	resp, err := c.Get("http://" + nettest.HostPort(to, port) + "/")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading body: %w", err)
	}
	if string(b) != want {
		return fmt.Errorf("body: got %q, want %q", b, want)
	}
	return nil
}

func retry(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var echoSeq atomic.Int64

// echoOnce sends a numbered message and reads until its echo comes back,
// skipping echoes of earlier messages whose reads timed out.
func echoOnce(c net.Conn) error {
	msg := []byte(fmt.Sprintf("echo %08d", echoSeq.Add(1)))
	// Long enough for two retransmissions of a segment the kernel dropped
	// at a busy stack's socket.
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(msg); err != nil {
		return fmt.Errorf("established connection write: %w", err)
	}
	got := make([]byte, len(msg))
	for {
		if _, err := io.ReadFull(c, got); err != nil {
			return fmt.Errorf("established connection read: %w", err)
		}
		if string(got) == string(msg) {
			return nil
		}
		if !strings.HasPrefix(string(got), "echo ") || string(got) > string(msg) {
			return fmt.Errorf("established connection echoed %q, want %q", got, msg)
		}
	}
}

func checkEcho(t *testing.T, c net.Conn, when string) {
	t.Helper()
	if err := echoOnce(c); err != nil {
		t.Fatalf("%s: %v", when, err)
	}
}
