package hostile

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cni-usernet/cni-usernet/pkg/stack"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// fragFloodArgs make hping3 send first fragments that never complete
// (more-fragments set, offset 0): UDP headers without data, the smallest
// fragment there is, each from a random source, so each one opens a
// reassembly of its own. Per byte on the wire that is the most
// reassembly state a sender can make a receiver hold.
var fragFloodArgs = []string{"--udp", "-p", "9", "-x", "-d", "0"}

// Bounds on the stack's memory under the fragment flood.
const (
	// fragSettleWithin is how long after the flood the memory may take to
	// come back: the reassembly timeout (30 s, the kernel's ipfrag_time),
	// then the stack's idle-memory release, which waits for the link to
	// be quiet for two of its 15 s windows.
	fragSettleWithin = 90 * time.Second
	// fragReleaseSlack is what the stack may keep after the flood above
	// what it held before: what the Go runtime and netstack keep for
	// reuse (the reassembly map's buckets, pools' victim caches).
	fragReleaseSlack = 6 << 20
)

// TestFragmentFlood is a flood of fragments that never complete: `hping3 --udp -x -d 0
// --flood --rand-source` (first fragments that never complete, each from
// its own source) from the node namespace at a pod for floodDuration while
// a client fetches a page from the pod every 0.5 s and a 64 MiB download
// from the pod runs; first against a pod on the kernel veth (its
// namespace's reassembly memory from /proc/net/sockstat, logged), then
// against a cni-usernet pod, asserting that the stack's RSS grows by no
// more than stack.ReassemblyBound (and the download's buffers), that it comes back to within
// fragReleaseSlack of where it was once the reassemblies have timed out,
// that the download is byte-exact, that the pod answers afterwards, that
// every probe is answered, and that the flood never queued with them:
// every fragment the stack read came through its fragment socket, none
// through the link's socket, which dropped nothing (the fragment
// socket's own drops are the flood's excess). The probes' latencies are
// reported beside the kernel's, not asserted.
func TestFragmentFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("two fragment floods at full speed of 15 s each, and the time the memory takes to come back (about 3 min); run without -short")
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
			// What the flood makes the pod hold: the kernel's reassembly
			// queues in the pod's namespace, or the stack process.
			what, read := "reassembly memory (sockstat FRAG)", func() (int64, error) { return kernelFragMemory(c.pod.NS) }
			slack := int64(0) // the kernel frees its queues at the timeout
			var stacks []watchedStack
			if c.att != nil {
				pid := c.att.att.StackPID
				what, read = "stack RSS", func() (int64, error) { return vmRSS(pid) }
				slack = fragReleaseSlack
				stacks = append(stacks, watchedStack{role: "pod", victim: true, podAttachment: *c.att})
			}
			before, err := read()
			if err != nil {
				t.Fatalf("reading %s: %v", what, err)
			}
			peak := sampleMemory(read, 50*time.Millisecond)
			defer peak.stop()
			r := measure(t, env, guard, measurement{
				name:   c.name,
				victim: c.pod,
				veth:   veth,
				stacks: stacks,
				flood:  &hping3Flood{path: hping, node: env.Node, iface: veth, dst: c.pod.IP(4), args: fragFloodArgs, unit: "fragment"},
			})
			m := memoryResult{what: what, before: before, peak: peak.stop()}
			m.after, m.settled = settle(read, before+slack, fragSettleWithin)
			t.Logf("%s: %s: before %.1f MiB, peak %.1f MiB, after %.1f MiB (%s)", c.name, what, mib(m.before), mib(m.peak), mib(m.after), m.settledString())
			rows = append(rows, r.fragRow(m))
			probes, others := r.problems()
			t.Logf("%s: probes (reported, not asserted): %d of %d answered, slowest %s; %s", c.name, r.answered(), len(r.probes), r.slowestString(), strings.Join(probes, "; "))
			if c.att == nil {
				if len(others) > 0 {
					t.Logf("%s would fail the cni-usernet assertions (logged, not asserted): %s", c.name, strings.Join(others, "; "))
				}
				return
			}
			for _, p := range others {
				t.Error(p)
			}
			if r.answered() < len(r.probes) {
				t.Errorf("probes answered during the fragment flood: got %d of %d, want all", r.answered(), len(r.probes))
			}
			// Where the flood queued: the fragment socket, and nothing of
			// it the link's socket, which the probes and the download use.
			w := func(k string) float64 { return r.victimCounters["wire."+k] }
			t.Logf("%s: during the flood the stack read %.0f fragments (%.0f through the link's socket), the kernel dropped %.0f at the fragment socket and %.0f at the link's socket; the fragment path stopped at its budget %.0f times",
				c.name, w("rxFragments"), w("rxFragmentsShared"), w("fragSocketDrops"), w("socketDrops"), w("fragmentTurns"))
			if w("rxFragments") == 0 {
				t.Errorf("the stack read no fragment during the flood (status counters %v)", r.victimCounters)
			}
			if n := w("rxFragmentsShared"); n != 0 {
				t.Errorf("%.0f of the flood's %.0f fragments the stack read came through the link's socket, queued with the probes; want none", n, w("rxFragments"))
			}
			if n := w("socketDrops"); n != 0 {
				t.Errorf("the link's socket dropped %.0f frames during the fragment flood, want none: the flood belongs to the fragment socket", n)
			}
			// The download may fill its buffers meanwhile (MemoryBound's
			// share of one bulk connection), and the garbage collector's
			// headroom doubles what it holds live as it doubles the
			// fragments' (ReassemblyBound counts theirs): with the
			// download's share counted once, one run grew by 29.8 MiB
			// against 28. Without the stack's fragment copies the
			// same flood grew it by about 100 MiB.
			download := stack.MemoryBound(stack.MemoryLoad{BulkTCP: 1}) - stack.MemoryBound(stack.MemoryLoad{})
			if grew, bound := m.peak-m.before, int64(stack.ReassemblyBound)+2*download; grew > bound {
				t.Errorf("stack RSS grew under the fragment flood by %.1f MiB (%.1f → %.1f), want <= %.1f MiB (stack.ReassemblyBound %.0f MiB + twice the download's buffers %.0f MiB, for the collector's headroom)",
					mib(grew), mib(m.before), mib(m.peak), mib(bound), mib(stack.ReassemblyBound), mib(download))
			}
			if m.settled < 0 {
				t.Errorf("stack RSS %.0f s after the fragment flood: got %.1f MiB, want <= %.1f MiB (%.1f before the flood)", fragSettleWithin.Seconds(), mib(m.after), mib(m.before+fragReleaseSlack), mib(m.before))
			}
		})
	}
	t.Logf("fragment flood from the node (hping3 %s --flood --rand-source), %s each, probes every %s (timeout %s), %d MiB download:\n"+
		"| attached by | flood | probes answered | slowest probe | download | memory before | peak | after |\n"+
		"|---|---|---|---|---|---|---|---|\n%s",
		strings.Join(fragFloodArgs, " "), floodDuration, probeEvery, probeTimeout, downloadSize>>20, strings.Join(rows, "\n"))
}

// memoryResult is what a fragment flood made the pod hold.
type memoryResult struct {
	what                string
	before, peak, after int64
	// settled is how long after the flood the memory came back within
	// fragReleaseSlack of before; negative if it did not.
	settled time.Duration
}

func (m memoryResult) settledString() string {
	if m.settled < 0 {
		return fmt.Sprintf("**still %.1f MiB after %.0f s**", mib(m.after), fragSettleWithin.Seconds())
	}
	return fmt.Sprintf("back after %.0f s", m.settled.Seconds())
}

// fragRow is the result as a line of the fragment flood's table.
func (r *result) fragRow(m memoryResult) string {
	dl := fmt.Sprintf("byte-exact (%.1f s)", r.dlTime.Seconds())
	if r.download != nil {
		dl = "**broken**: " + r.download.Error()
	}
	secs := r.elapsed.Seconds()
	return fmt.Sprintf("| %s | %.0f %s/s sent, %.0f frames/s on the veth | %d / %d | %s | %s | %s %.1f MiB | %.1f MiB | %.1f MiB, %s |",
		r.name, float64(r.flood.sent)/secs, r.flood.unit, float64(r.vethFrames)/secs,
		r.answered(), len(r.probes), r.slowestString(), dl, m.what, mib(m.before), mib(m.peak), mib(m.after), m.settledString())
}

// settle reads the memory every second until it is at most target or
// within has passed, and returns the last reading and how long it took
// (negative if it never came down).
func settle(read func() (int64, error), target int64, within time.Duration) (int64, time.Duration) {
	start := time.Now()
	var v int64
	for {
		v, _ = read()
		if v <= target {
			return v, time.Since(start)
		}
		if time.Since(start) > within {
			return v, -1
		}
		time.Sleep(time.Second)
	}
}

// memorySampler records the largest of read's values.
type memorySampler struct {
	peak atomic.Int64
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func sampleMemory(read func() (int64, error), every time.Duration) *memorySampler {
	s := &memorySampler{done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if v, err := read(); err == nil && v > s.peak.Load() {
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

func (s *memorySampler) stop() int64 {
	s.once.Do(func() { close(s.done) })
	s.wg.Wait()
	return s.peak.Load()
}

// kernelFragMemory is the memory netns's kernel holds in IPv4 and IPv6
// reassembly queues (sockstat's FRAG and FRAG6 "memory", in bytes: the
// sum the kernel compares with ipfrag_high_thresh).
func kernelFragMemory(netns ns.NetNS) (int64, error) {
	var total int64
	err := nettest.In(netns, func() error {
		for _, f := range []string{"/proc/thread-self/net/sockstat", "/proc/thread-self/net/sockstat6"} {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			for _, line := range strings.Split(string(b), "\n") {
				fields := strings.Fields(line)
				if len(fields) == 0 || (fields[0] != "FRAG:" && fields[0] != "FRAG6:") {
					continue
				}
				for i := 1; i+1 < len(fields); i += 2 {
					if fields[i] == "memory" {
						n, err := strconv.ParseInt(fields[i+1], 10, 64)
						if err != nil {
							return fmt.Errorf("%s: %q: %w", f, line, err)
						}
						total += n
					}
				}
			}
		}
		return nil
	})
	return total, err
}
