package hostile

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/stack"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// What a pod must withstand: a flood of floodDuration, a probe
// (a new connection fetching a small page) every probeEvery that must
// answer within probeTimeout, and a download from the pod that must arrive
// byte-exact.
const (
	floodDuration = 15 * time.Second
	probeEvery    = 500 * time.Millisecond
	probeTimeout  = 2 * time.Second
	downloadSize  = 64 << 20
	// The download is paced to end downloadSlack before the flood does,
	// so that all of it crosses the flood.
	downloadSlack = 3 * time.Second
	// downloadGrace is how long after the flood a download may take to
	// finish before it counts as broken.
	downloadGrace = 30 * time.Second
	// recoverWithin is how long after the flood a new connection to the
	// pod may take to succeed (a stack may still be releasing the flood's
	// half-open connections).
	recoverWithin = 20 * time.Second

	// The requirement for cni-usernet, the kernel's behaviour.
	minAnswered     = 0.90
	maxProbeLatency = time.Second

	// Ports in the pods: the flooded HTTP server the probes also use, and
	// the download.
	httpPort     = 8080
	downloadPort = 5001
)

// Address plan: every address is in a namespace the tests create. The
// node namespace's guard (guardNode) drops whatever arrives for anything
// else, so the answers to hping3's random sources go nowhere.
var (
	kernelSubnet = netip.MustParsePrefix("10.199.1.0/24") // ptp pods; cni-usernet's are nettest's Env.Subnet
	// sinkAddrs are node addresses (on its lo) the in-pod flood connects
	// to; sinkRange, around them, is where it draws destinations from:
	// the rest of the range is dropped silently by the guard.
	sinkAddrs = netip.MustParsePrefix("10.199.200.0/28")
	sinkRange = netip.MustParsePrefix("10.199.200.0/26")
)

// sinkPorts are the node's listening ports for the in-pod flood; any
// other port refuses.
var sinkPorts = []int{9000, 9001, 9002, 9003}

// TestSYNFlood measures a SYN flood: `hping3 -S -p 8080 --flood
// --rand-source` from the node namespace at a pod for floodDuration while
// a client fetches a page from the pod every 0.5 s (2 s timeout) and a
// 64 MiB download from the pod runs, first against a pod on the kernel
// veth (ptp: logged, the comparison) and then against a cni-usernet pod
// (asserted: >= 90 % of probes answered, none slower than 1 s, the
// download byte-exact, the stack's RSS under stack.MemoryBound, a new
// connection after the flood). See docs/reliability/hostile.md.
func TestSYNFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("two SYN floods at full speed of 15 s each (about 60 s); run without -short")
	}
	hping := requireHping3(t)
	env, guard, cases := newNodeFloodRig(t)

	var rows []string
	for _, c := range cases {
		t.Run(strings.Fields(c.name)[0], func(t *testing.T) {
			serveHTTP(t, nettest.Listen(t, c.pod.NS, "tcp", ":"+strconv.Itoa(httpPort)), "ok")
			veth := c.pod.HostVeth()
			if veth == "" {
				t.Fatalf("no node-side interface in the %s result %+v", c.name, c.pod.Result)
			}
			var stacks []watchedStack
			if c.att != nil {
				stacks = append(stacks, watchedStack{role: "pod", victim: true, podAttachment: *c.att})
			}
			r := measure(t, env, guard, measurement{
				name:   c.name,
				victim: c.pod,
				veth:   veth,
				stacks: stacks,
				flood:  &hping3Flood{path: hping, node: env.Node, iface: veth, dst: c.pod.IP(4), port: httpPort},
			})
			rows = append(rows, r.row())
			if c.att != nil {
				r.check(t)
			} else {
				r.logComparison(t)
			}
		})
	}
	logTable(t, "SYN flood from the node (hping3 -S --flood --rand-source)", rows)
}

// TestSYNFloodFromPod floods from inside a pod: an application opening
// TCP connections as fast as it can (non-blocking connects, the oldest of
// 4096 closed to make room) to node addresses and ports, a few listening
// (accepted and closed), most refused, many silent (dropped at the node).
// Meanwhile a second pod on the same node is probed every 0.5 s and sends
// a 64 MiB download. For the kernel veth (both pods ptp) it logs; for
// cni-usernet (both pods on it) it asserts that the second pod answers as
// TestSYNFlood asks and that both stacks stay under their bounds.
func TestSYNFloodFromPod(t *testing.T) {
	if testing.Short() {
		t.Skip("two connection floods from a pod of 15 s each (about 50 s); run without -short")
	}
	env := nettest.NewEnv(t)
	env.Subnet6 = ""
	kFlooder, kVictim := env.NewPodWith("ptp", ptpConf(env)), env.NewPodWith("ptp", ptpConf(env))
	conf := env.Conf(cniVersion, nil)
	uFlooder, uVictim := env.NewPod(conf), env.NewPod(conf)
	guard := guardNode(t, env.Node, netip.MustParsePrefix(env.Subnet), kernelSubnet, sinkAddrs)
	sinkNode(t, env.Node)
	attF, attV := loadState(t, env, uFlooder), loadState(t, env, uVictim)

	var rows []string
	for _, c := range []struct {
		name              string
		flooder, victim   *nettest.Pod
		flooderA, victimA *podAttachment
	}{
		{name: "kernel (ptp)", flooder: kFlooder, victim: kVictim},
		{name: "cni-usernet (" + gsoMode(t, attV) + ")", flooder: uFlooder, victim: uVictim,
			// The flooder holds no connection open for long: everything
			// its flood makes is what the bound must cover.
			flooderA: &podAttachment{att: attF},
			victimA:  &podAttachment{att: attV, load: stack.MemoryLoad{BulkTCP: 1}}},
	} {
		t.Run(strings.Fields(c.name)[0], func(t *testing.T) {
			serveHTTP(t, nettest.Listen(t, c.victim.NS, "tcp", ":"+strconv.Itoa(httpPort)), "ok")
			var stacks []watchedStack
			if c.flooderA != nil {
				stacks = append(stacks, watchedStack{role: "flooder", podAttachment: *c.flooderA},
					watchedStack{role: "victim", victim: true, podAttachment: *c.victimA})
			}
			r := measure(t, env, guard, measurement{
				name:    c.name,
				victim:  c.victim,
				veth:    c.flooder.HostVeth(),
				fromPod: true,
				stacks:  stacks,
				flood:   &connectFlood{pod: c.flooder, workers: 2, open: 4096},
				afterFlood: func() string {
					return "flooder " + ownConnect(c.flooder)
				},
			})
			rows = append(rows, r.row())
			if c.flooderA != nil {
				r.check(t)
			} else {
				r.logComparison(t)
			}
		})
	}
	logTable(t, "connection flood from a pod (victim: another pod on the node)", rows)
}

// podAttachment is a cni-usernet pod's state and the load its memory bound
// is computed for.
type podAttachment struct {
	att  *state.Attachment
	load stack.MemoryLoad
}

// watchedStack is a stack whose RSS and counters a measurement records.
type watchedStack struct {
	role   string
	victim bool // the stack of the measurement's victim
	podAttachment
}

// flooder is a flood a measurement runs for floodDuration.
type flooder interface {
	// start begins the flood; stop ends it and says what it sent.
	start(t *testing.T)
	stop(t *testing.T) floodStats
}

type floodStats struct {
	what string // the flood, for the table
	sent uint64 // packets or connection attempts, as counted by the sender
	unit string
}

// measurement is one configuration of a flood test.
type measurement struct {
	name   string
	victim *nettest.Pod // probed, and sends the download
	veth   string       // node-side veth whose counters measure the flood
	// fromPod: the flood comes from the pod behind veth (the node side
	// receives it) rather than from the node.
	fromPod bool
	// afterFlood, if set, is one more thing to look at after the flood;
	// what it says is logged and ends the table's last column.
	afterFlood func() string
	stacks     []watchedStack
	flood      flooder
}

// result is what a measurement saw.
type result struct {
	name     string
	flood    floodStats
	elapsed  time.Duration
	probes   []probe
	download error
	dlTime   time.Duration
	recover  error
	recovery time.Duration
	after    string // afterFlood's
	// vethFrames is what the node-side veth carried in the flood's
	// direction: transmitted towards the pod, or received from it.
	vethFrames uint64
	peaks      []stackPeak
	// victimCounters is how much each of the victim stack's status
	// counters grew during the flood (flatten's names); nil for a pod on
	// the kernel.
	victimCounters map[string]float64
}

type stackPeak struct {
	role            string
	rss, hwm, bound int64
}

type probe struct {
	at      time.Duration // since the flood started
	latency time.Duration
	err     error
}

// linkNS is where pod's link to the node is: the stack's own namespace for
// a cni-usernet pod, the pod's for one on the kernel veth.
func linkNS(env *nettest.Env, pod *nettest.Pod) ns.NetNS {
	if strings.Contains(string(pod.Conf), `"ptp"`) {
		return pod.NS
	}
	return env.WireNS(pod)
}

// measure runs m.flood for floodDuration from the node's namespace or a
// pod while probing m.victim and downloading from it.
func measure(t *testing.T, env *nettest.Env, guard *nodeGuard, m measurement) *result {
	t.Helper()
	r := &result{name: m.name}
	dst := m.victim.IP(4)
	if err := getProbe(env.Node, dst); err != nil {
		t.Fatalf("%s: probe before the flood: %v", m.name, err)
	}

	// Before: counters, RSS sampling, the download's connection.
	type sampled struct {
		watchedStack
		before, atEnd map[string]any
		rss           *rssSampler
	}
	var stacks []sampled
	for _, s := range m.stacks {
		st := sampled{watchedStack: s, before: rawStatus(t, s.att), rss: sampleRSS(s.att.StackPID, 50*time.Millisecond)}
		defer st.rss.stop()
		stacks = append(stacks, st)
	}
	linkBefore := linkStats(t, env.Node, m.veth)
	podLinkBefore := linkStats(t, linkNS(env, m.victim), "eth0")
	netstatBefore := tcpExt(m.victim.NS)
	guardBefore := guard.dropped(t)

	dl := startDownload(t, m.victim.NS, env.Node, dst, downloadPort, downloadSize,
		floodDuration-downloadSlack, time.Now().Add(floodDuration+downloadGrace))

	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		t.Logf("%s: machine load before the flood (other work shares it): %s", m.name, strings.TrimSpace(string(b)))
	}
	start := time.Now()
	m.flood.start(t)
	probes := runProbes(env.Node, dst, start)
	time.Sleep(time.Until(start.Add(floodDuration)))
	r.flood = m.flood.stop(t)
	r.elapsed = time.Since(start)
	for i := range stacks {
		stacks[i].atEnd = rawStatus(t, stacks[i].att)
	}
	linkAfter := linkStats(t, env.Node, m.veth)
	podLinkAfter := linkStats(t, linkNS(env, m.victim), "eth0")
	netstatAfter := tcpExt(m.victim.NS)
	guardAfter := guard.dropped(t)
	r.probes = probes()

	dlRes := <-dl
	r.download, r.dlTime = dlRes.err, dlRes.took

	recStart := time.Now()
	r.recover = retry(recoverWithin, func() error { return getProbe(env.Node, dst) })
	r.recovery = time.Since(recStart)
	if m.afterFlood != nil {
		r.after = m.afterFlood()
	}

	// What the flood did, by the counters.
	r.vethFrames = linkAfter.TxPackets - linkBefore.TxPackets
	if m.fromPod {
		r.vethFrames = linkAfter.RxPackets - linkBefore.RxPackets
	}
	secs := r.elapsed.Seconds()
	t.Logf("%s: %s: %d %s in %s (%.0f/s by the sender)", m.name, r.flood.what, r.flood.sent, r.flood.unit, r.elapsed.Round(time.Millisecond), float64(r.flood.sent)/secs)
	tx := linkAfter.TxPackets - linkBefore.TxPackets
	t.Logf("%s: node-side veth %s: tx %d frames (%.0f/s), tx_dropped %d; rx %d (%.0f/s)", m.name, m.veth,
		tx, float64(tx)/secs, linkAfter.TxDropped-linkBefore.TxDropped,
		linkAfter.RxPackets-linkBefore.RxPackets, float64(linkAfter.RxPackets-linkBefore.RxPackets)/secs)
	t.Logf("%s: victim's eth0: rx %d frames, rx_dropped %d; tx %d", m.name,
		podLinkAfter.RxPackets-podLinkBefore.RxPackets, podLinkAfter.RxDropped-podLinkBefore.RxDropped,
		podLinkAfter.TxPackets-podLinkBefore.TxPackets)
	t.Logf("%s: answers to addresses outside the test dropped by the node's guard: %d", m.name, guardAfter-guardBefore)
	if d := counterDeltas(netstatBefore, netstatAfter); len(d) > 0 {
		t.Logf("%s: victim namespace's TcpExt: %s", m.name, strings.Join(d, ", "))
	}
	for _, s := range stacks {
		after := rawStatus(t, s.att) // after the download and the recovery
		peak := s.rss.stop()
		hwm, _ := procStatusBytes(s.att.StackPID, "VmHWM")
		bound := rssBoundFor(s.load)
		r.peaks = append(r.peaks, stackPeak{role: s.role, rss: peak, hwm: hwm, bound: bound})
		t.Logf("%s: %s stack: peak RSS %.1f MiB (VmHWM %.1f MiB), bound %.1f MiB", m.name, s.role, mib(peak), mib(hwm), mib(bound))
		t.Logf("%s: %s stack status before:        %s", m.name, s.role, statusSummary(s.before))
		t.Logf("%s: %s stack status at flood end:  %s", m.name, s.role, statusSummary(s.atEnd))
		t.Logf("%s: %s stack status after recovery: %s", m.name, s.role, statusSummary(after))
		t.Logf("%s: %s stack counters changed during the flood: %s", m.name, s.role, strings.Join(counterDeltas(flatten(s.before), flatten(s.atEnd)), ", "))
		if s.victim {
			logShed(t, m.name, podLinkAfter.RxPackets-podLinkBefore.RxPackets, flatten(s.before), flatten(s.atEnd))
			b := flatten(s.before)
			r.victimCounters = map[string]float64{}
			for k, a := range flatten(s.atEnd) {
				r.victimCounters[k] = a - b[k]
			}
		}
	}
	var errs []string
	for _, p := range r.probes {
		if p.err != nil {
			errs = append(errs, fmt.Sprintf("at %.2fs after %s: %v", p.at.Seconds(), p.latency.Round(time.Millisecond), p.err))
		}
	}
	if len(errs) > 5 {
		errs = append(errs[:5], fmt.Sprintf("and %d more", len(errs)-5))
	}
	for _, e := range errs {
		t.Logf("%s: probe failed %s", m.name, e)
	}
	if r.after != "" {
		t.Logf("%s: after the flood: %s", m.name, r.after)
	}
	t.Logf("%s", r.row())
	return r
}

// logShed says where the frames that reached the victim's eth0 during the
// flood went: read by the stack (wire rxPackets), counted by the stack as
// dropped or shed (any wire counter so named), or neither, i.e. dropped
// before the stack read them (the AF_PACKET socket's receive buffer) and
// not in its status.
func logShed(t *testing.T, name string, eth0Rx uint64, before, after map[string]float64) {
	t.Helper()
	read := after["wire.rxPackets"] - before["wire.rxPackets"]
	var counted float64
	var which []string
	for k, a := range after {
		field, ok := strings.CutPrefix(k, "wire.")
		// camelCase names: "droppedPackets", "rxShed"; not "tcpEstablished".
		if !ok || strings.Contains(strings.ToLower(field), "tx") ||
			!(strings.Contains(strings.ToLower(field), "drop") || strings.HasPrefix(field, "shed") || strings.Contains(field, "Shed")) {
			continue
		}
		if d := a - before[k]; d > 0 {
			counted += d
			which = append(which, fmt.Sprintf("%s +%.0f", k, d))
		}
	}
	unaccounted := float64(eth0Rx) - read - counted
	t.Logf("%s: of %d frames that reached the pod's eth0 during the flood the stack read %.0f (%.0f%%), counted %.0f as dropped or shed %v; %.0f (%.0f%%) are in no stack counter (dropped before the stack read them)",
		name, eth0Rx, read, 100*read/max(1, float64(eth0Rx)), counted, which, max(0, unaccounted), 100*max(0, unaccounted)/max(1, float64(eth0Rx)))
}

// check asserts what a pod under a SYN flood must keep: the probes (>= 90 %
// answered, none slower than 1 s), the download byte-exact, memory within
// the bound, the pod answering afterwards (docs/reliability/hostile.md
// gives the slowest probes of runs under the node's full-speed flood).
func (r *result) check(t *testing.T) {
	t.Helper()
	probes, others := r.problems()
	for _, p := range append(probes, others...) {
		t.Error(p)
	}
}

// problems lists how the result falls short of check's requirements
// (the kernel's behaviour), the probes' apart: none for a pod that passes.
func (r *result) problems() (probes, out []string) {
	n, ok := len(r.probes), r.answered()
	if want := int(math.Ceil(minAnswered * float64(n))); ok < want {
		probes = append(probes, fmt.Sprintf("probes answered during the flood: got %d of %d, want >= %d", ok, n, want))
	}
	if s, timedOut := r.slowest(); timedOut || s > maxProbeLatency {
		probes = append(probes, fmt.Sprintf("slowest probe: got %s, want <= %s", r.slowestString(), maxProbeLatency))
	}
	if r.download != nil {
		out = append(out, fmt.Sprintf("%d MiB download from the pod during the flood: %v", downloadSize>>20, r.download))
	}
	if r.recover != nil {
		out = append(out, fmt.Sprintf("new connection to the pod after the flood (retried for %s): %v", recoverWithin, r.recover))
	}
	for _, p := range r.peaks {
		if p.rss == 0 {
			out = append(out, fmt.Sprintf("%s stack RSS never sampled", p.role))
		}
		if p.rss > p.bound {
			out = append(out, fmt.Sprintf("%s stack peak RSS: got %.1f MiB, want <= %.1f MiB (stack.MemoryBound)", p.role, mib(p.rss), mib(p.bound)))
		}
	}
	return probes, out
}

// logComparison says whether a comparison run (the kernel's) meets what
// check asks of cni-usernet, without failing the test.
func (r *result) logComparison(t *testing.T) {
	t.Helper()
	if probes, others := r.problems(); len(probes)+len(others) > 0 {
		p := append(probes, others...)
		t.Logf("%s would fail the cni-usernet assertions (logged, not asserted): %s", r.name, strings.Join(p, "; "))
		return
	}
	t.Logf("%s meets the cni-usernet assertions (logged, not asserted)", r.name)
}

func (r *result) answered() int {
	n := 0
	for _, p := range r.probes {
		if p.err == nil {
			n++
		}
	}
	return n
}

// slowest is the longest probe, and whether it failed rather than answered.
func (r *result) slowest() (time.Duration, bool) {
	var d time.Duration
	failed := false
	for _, p := range r.probes {
		if p.err != nil {
			failed = true
		}
		d = max(d, p.latency)
	}
	return d, failed
}

func (r *result) slowestString() string {
	d, failed := r.slowest()
	if failed {
		var slowestOK time.Duration
		for _, p := range r.probes {
			if p.err == nil {
				slowestOK = max(slowestOK, p.latency)
			}
		}
		if r.answered() == 0 {
			return "timeout (none answered)"
		}
		return fmt.Sprintf("timeout (slowest answer %s)", slowestOK.Round(time.Millisecond))
	}
	return d.Round(time.Millisecond).String()
}

// row is the result as a line of the table in docs/reliability/hostile.md.
func (r *result) row() string {
	dl := fmt.Sprintf("byte-exact (%.1f s)", r.dlTime.Seconds())
	if r.download != nil {
		dl = "**broken**: " + r.download.Error()
	}
	after := fmt.Sprintf("answers after %.1f s", r.recovery.Seconds())
	if r.recovery < 300*time.Millisecond {
		after = "answers at once"
	}
	if r.recover != nil {
		after = fmt.Sprintf("**no answer for %s**", recoverWithin)
	}
	if r.after != "" {
		after += "; " + r.after
	}
	rss := "—"
	if len(r.peaks) > 0 {
		var parts []string
		for _, p := range r.peaks {
			parts = append(parts, fmt.Sprintf("%s %.0f MiB (bound %.0f)", p.role, mib(p.rss), mib(p.bound)))
		}
		rss = strings.Join(parts, ", ")
	}
	secs := r.elapsed.Seconds()
	return fmt.Sprintf("| %s | %.0f %s/s sent, %.0f frames/s on the veth | %d / %d | %s | %s | %s | %s |",
		r.name, float64(r.flood.sent)/secs, r.flood.unit, float64(r.vethFrames)/secs,
		r.answered(), len(r.probes), r.slowestString(), dl, rss, after)
}

func logTable(t *testing.T, title string, rows []string) {
	t.Logf("%s, %s each, probes every %s (timeout %s), %d MiB download:\n"+
		"| attached by | flood | probes answered | slowest probe | download | peak stack RSS | pod afterwards |\n"+
		"|---|---|---|---|---|---|---|\n%s",
		title, floodDuration, probeEvery, probeTimeout, downloadSize>>20, strings.Join(rows, "\n"))
}

// runProbes fetches a page from dst every probeEvery until floodDuration
// after start, each probe a new connection on its own (a slow one does not
// delay the next), and returns a function that waits for them all.
func runProbes(node ns.NetNS, dst netip.Addr, start time.Time) func() []probe {
	n := int(floodDuration / probeEvery)
	probes := make([]probe, n)
	var wg sync.WaitGroup
	for i := range n {
		// Offset by half an interval: the first probe finds the flood
		// running, the last one ends before it stops.
		at := probeEvery/2 + time.Duration(i)*probeEvery
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(start.Add(at)))
			t0 := time.Now()
			err := getProbe(node, dst)
			probes[i] = probe{at: t0.Sub(start), latency: time.Since(t0), err: err}
		}()
	}
	return func() []probe { wg.Wait(); return probes }
}

// getProbe is `curl -m 2 http://dst:8080/`: a new connection, the whole
// exchange within probeTimeout.
func getProbe(node ns.NetNS, dst netip.Addr) error {
	c := &http.Client{
		Timeout: probeTimeout,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var conn net.Conn
				err := nettest.In(node, func() (err error) {
					var d net.Dialer
					conn, err = d.DialContext(ctx, network, addr)
					return err
				})
				return conn, err
			},
		},
	}
	resp, err := c.Get("http://" + nettest.HostPort(dst, httpPort) + "/")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading body: %w", err)
	}
	if string(b) != "ok" {
		return fmt.Errorf("body: got %q, want %q", b, "ok")
	}
	return nil
}

type downloadResult struct {
	err  error
	took time.Duration
}

// startDownload connects from cliNS to a server in srvNS that sends n
// bytes paced over pace, and checks in the background that they arrive
// complete and in order (SHA-256 of what was sent and of what arrived).
// Both ends give up at deadline.
func startDownload(t *testing.T, srvNS, cliNS ns.NetNS, addr netip.Addr, port int, n int64, pace time.Duration, deadline time.Time) <-chan downloadResult {
	t.Helper()
	ln := nettest.Listen(t, srvNS, "tcp", nettest.HostPort(addr, port))
	sent := make(chan [32]byte, 1)
	go func() {
		defer close(sent)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(deadline)
		block := make([]byte, 1<<20)
		rng := rand.New(rand.NewPCG(13, 13))
		for i := range block {
			block[i] = byte(rng.Uint32())
		}
		h := sha256.New()
		start := time.Now()
		rate := float64(n) / pace.Seconds()
		for off := int64(0); off < n; {
			if ahead := time.Duration(float64(off)/rate*float64(time.Second)) - time.Since(start); ahead > 0 {
				time.Sleep(ahead)
			}
			// Chunks of 256 KiB: smooth pacing, changing content.
			chunk := block[off%int64(len(block)):][:min(256<<10, n-off)]
			if _, err := c.Write(chunk); err != nil {
				return
			}
			h.Write(chunk)
			off += int64(len(chunk))
		}
		c.(*net.TCPConn).CloseWrite()
		sent <- [32]byte(h.Sum(nil))
		io.Copy(io.Discard, c) // until the client closes
	}()
	c, err := nettest.Dial(cliNS, "tcp", nettest.HostPort(addr, port), 5*time.Second)
	if err != nil {
		t.Fatalf("connecting the download: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	done := make(chan downloadResult, 1)
	go func() {
		defer c.Close()
		start := time.Now()
		c.SetDeadline(deadline)
		h := sha256.New()
		got, err := io.Copy(h, c)
		took := time.Since(start)
		if err != nil {
			done <- downloadResult{fmt.Errorf("after %d of %d bytes: %w", got, n, err), took}
			return
		}
		want, ok := <-sent
		switch {
		case !ok:
			done <- downloadResult{fmt.Errorf("the pod's sender failed after %d bytes arrived", got), took}
		case got != n:
			done <- downloadResult{fmt.Errorf("got %d bytes, want %d", got, n), took}
		case [32]byte(h.Sum(nil)) != want:
			done <- downloadResult{fmt.Errorf("SHA-256 of the %d bytes received differs from what was sent", got), took}
		default:
			done <- downloadResult{nil, took}
		}
	}()
	return done
}

// ownConnect is how soon the flooding pod's own new connection to a
// listening node port succeeds after its flood (logged, not asserted: a
// pod that floods may slow itself).
func ownConnect(pod *nettest.Pod) string {
	dst := nettest.HostPort(sinkAddrs.Addr().Next(), sinkPorts[0])
	start := time.Now()
	err := retry(recoverWithin, func() error {
		c, err := nettest.Dial(pod.NS, "tcp", dst, probeTimeout)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err != nil {
		return fmt.Sprintf("**cannot connect to %s for %s**: %v", dst, recoverWithin, err)
	}
	if d := time.Since(start); d >= 300*time.Millisecond {
		return fmt.Sprintf("connects to the node after %.1f s", d.Seconds())
	}
	return "connects to the node at once"
}

// ptpConf is the standard ptp plugin on host-local IPAM in kernelSubnet:
// the kernel veth the tests compare with.
func ptpConf(env *nettest.Env) []byte {
	env.T.Helper()
	b, err := json.Marshal(map[string]any{
		"cniVersion": cniVersion,
		"name":       "kernel-test",
		"type":       "ptp",
		"ipMasq":     false,
		"mtu":        1500,
		"ipam":       env.HostLocal(map[string]any{"subnet": kernelSubnet.String()}),
	})
	if err != nil {
		env.T.Fatal(err)
	}
	return b
}

// floodCase is one pod a flood from the node runs against: on the kernel
// veth (att nil: the comparison, logged) or on cni-usernet (asserted).
type floodCase struct {
	name string
	pod  *nettest.Pod
	att  *podAttachment
}

// newNodeFloodRig is the rig of the floods from the node namespace: a
// node, a pod on the kernel veth (ptp) and a cni-usernet pod, IPv4 only
// (hping3 floods IPv4), and the node's guard that drops the answers to
// hping3's random sources. The cases come kernel first.
func newNodeFloodRig(t *testing.T) (*nettest.Env, *nodeGuard, []floodCase) {
	t.Helper()
	env := nettest.NewEnv(t)
	env.Subnet6 = ""
	kernel := env.NewPodWith("ptp", ptpConf(env))
	usernet := env.NewPod(env.Conf(cniVersion, nil))
	guard := guardNode(t, env.Node, netip.MustParsePrefix(env.Subnet), kernelSubnet)
	attU := loadState(t, env, usernet)
	return env, guard, []floodCase{
		{"kernel (ptp)", kernel, nil},
		{"cni-usernet (" + gsoMode(t, attU) + ")", usernet, &podAttachment{att: attU, load: stack.MemoryLoad{BulkTCP: 1}}},
	}
}
