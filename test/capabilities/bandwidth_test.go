package capabilities

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// The pod's annotations, in bits per second:
// kubernetes.io/ingress-bandwidth: 10M, kubernetes.io/egress-bandwidth: 50M.
const (
	ingressRate = 10_000_000
	egressRate  = 50_000_000
)

// iperf3Result is the part of iperf3's --json output the test reads: the
// per-second intervals of this side and, with --get-server-output, of the
// server.
type iperf3Result struct {
	Intervals []struct {
		Sum struct {
			BitsPerSecond float64 `json:"bits_per_second"`
			Seconds       float64 `json:"seconds"`
		} `json:"sum"`
	} `json:"intervals"`
	Server *iperf3Result `json:"server_output_json"`
	Error  string        `json:"error"`
}

func (r *iperf3Result) rates() []float64 {
	var out []float64
	for _, i := range r.Intervals {
		if i.Sum.Seconds > 0.5 {
			out = append(out, i.Sum.BitsPerSecond)
		}
	}
	return out
}

// iperf3 runs a client in from against the server at addr for seconds,
// reversed (the server sends) or not, and returns the receiver's
// per-second rates.
func iperf3(t *testing.T, from ns.NetNS, addr string, seconds int, reverse bool) []float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds+60)*time.Second)
	defer cancel()
	args := []string{"iperf3", "-c", addr, "-t", fmt.Sprint(seconds), "-i", "1", "--json"}
	if reverse {
		args = append(args, "-R")
	} else {
		args = append(args, "--get-server-output")
	}
	var r iperf3Result
	for attempt := 1; ; attempt++ {
		out, err := nsExec(ctx, from, args...)
		r = iperf3Result{}
		jerr := json.Unmarshal([]byte(out), &r)
		if jerr == nil && r.Error == "" {
			break
		}
		// The server may still be closing the previous test's control
		// connection when the next one starts, or still be taking in what
		// the previous client had queued (at 10 Mbit/s, a full socket
		// buffer drains for seconds after the client has gone): "the
		// server is busy running a test". Between two tests iperf3's
		// server closes its listener and opens a new one: a connection in
		// that gap is refused by a kernel, and reset after its handshake
		// by the stack's mirrored listener, which completed it before
		// the application's listener was gone: "unable to connect".
		if attempt < 10 && (strings.Contains(r.Error, "control message") || strings.Contains(r.Error, "server is busy") || strings.Contains(r.Error, "unable to connect")) {
			t.Logf("%s: %s; again", strings.Join(args, " "), r.Error)
			time.Sleep(time.Second)
			continue
		}
		t.Fatalf("%s: %v %v %s\n%s", strings.Join(args, " "), err, jerr, r.Error, out)
	}
	if reverse {
		return r.rates()
	}
	if r.Server == nil {
		t.Fatalf("%s: no server output", strings.Join(args, " "))
	}
	return r.Server.rates()
}

// TestBandwidth: standalone, cni-usernet shapes the pod's traffic on both
// ends of its veth (tbf on the node end for what reaches the pod, tbf on
// the pod end, in the stack's namespace, for what the pod sends);
// chained behind ptp, the bandwidth plugin before cni-usernet does it on
// the node side (tbf on the veth, tbf on an ifb). Whatever the pod's own
// stack does, iperf3 from another node measures each direction within
// ±10 % of the annotation once the runtime's burst is spent. DEL leaves
// nothing.
func TestBandwidth(t *testing.T) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("needs iperf3")
	}
	if testing.Short() {
		// The runtime's burst (512 MiB) is spent only by a stack at full
		// speed: a race-built one in gso off is still in it when the
		// measurement starts, and so reads far above the annotation. make
		// test measures it in its second, full-size pass.
		t.Skip("measures shaping after the runtime's 512 MiB burst: needs the full-size run, not -short")
	}
	// The pod's stack sends what bandwidth shapes on the ifb: as 64 KiB
	// GSO packets (hardware), as segments it cut itself (software), or one
	// frame per system call (off).
	for _, gso := range []string{"hardware", "software", "off"} {
		t.Run("gso="+gso, func(t *testing.T) { testBandwidth(t, labOptions{GSO: gso}) })
	}
	// Behind ptp, as behind flannel's bridge: bandwidth finds the veth ptp
	// made before cni-usernet moves its pod end.
	t.Run("chained", func(t *testing.T) { testBandwidth(t, labOptions{Chained: true}) })
}

func testBandwidth(t *testing.T, o labOptions) {
	l := newLab(t, o)
	p := l.add("shaped", map[string]any{"bandwidth": map[string]any{
		"ingressRate": ingressRate, "ingressBurst": runtimeBurst,
		"egressRate": egressRate, "egressBurst": runtimeBurst,
	}})
	ifb := l.shaping(t, p)
	if err := l.check(p); err != nil {
		t.Errorf("CHECK: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := exec.CommandContext(ctx, "nsenter", "--net="+p.netns.Path(), "iperf3", "-s", "-J", "-p", "5201")
	var srvOut nettest.LockedBuffer
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		srv.Wait()
	})
	// Waits for the listener in the pod's kernel: a probe connection would
	// count as a client to iperf3's server.
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := nsExec(ctx, p.netns, "ss", "-Hltn", "sport = :5201")
		if strings.Contains(out, "5201") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("iperf3 server in the pod not listening:\n%s", srvOut.String())
		}
		time.Sleep(200 * time.Millisecond)
	}

	for _, dir := range []struct {
		name    string
		reverse bool
		target  float64
	}{
		{"ingress (to the pod)", false, ingressRate},
		{"egress (from the pod)", true, egressRate},
	} {
		// The runtime's burst (512 MiB) is spent in about a second at the
		// gigabits the other modes send; one frame per system call sends
		// it at a few hundred Mbit/s.
		seconds := 15
		if o.GSO == "off" && dir.reverse {
			seconds = 50
		}
		rates := iperf3(t, l.other, p.ip, seconds, dir.reverse)
		mean, burst, err := nettest.SteadyRate(rates, dir.target)
		if err != nil {
			t.Errorf("%s: %v", dir.name, err)
			continue
		}
		ratio := mean / dir.target
		t.Logf("%s: %.2f Mbit/s steady (%.3f of the annotation's %.0f Mbit/s) over %d s; the burst took %d s, %.0f MB",
			dir.name, mean/1e6, ratio, dir.target/1e6, len(rates)-len(burst)-1, len(burst), burstMbits(burst)/8)
		if ratio < 0.9 || ratio > 1.1 {
			t.Errorf("%s: %.2f Mbit/s, want %.0f ± 10 %% (per second: %v)", dir.name, mean/1e6, dir.target/1e6, rates)
		}
	}

	if err := l.del(p); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	nettest.In(l.env.Node, func() error {
		if _, err := netlink.LinkByName(ifb); ifb != "" && err == nil {
			t.Errorf("DEL left the ifb %s", ifb)
		}
		return nil
	})
}

func burstMbits(rates []float64) float64 {
	s := 0.0
	for _, r := range rates {
		s += r
	}
	return s / 1e6
}

// shaping checks the qdiscs made for p. Standalone, cni-usernet's: a
// tbf on the node end of its veth (what reaches the pod) and one on the
// pod end in the stack's namespace (what the pod sends); it returns "".
// Chained, the bandwidth plugin's: a tbf on the node end, an ingress
// qdisc redirecting to an ifb with a tbf; it returns the ifb's name.
func (l *lab) shaping(t *testing.T, p *pod) string {
	t.Helper()
	ifb := ""
	tbf := func(netns ns.NetNS, dev string) {
		nettest.In(netns, func() error {
			link, err := netlink.LinkByName(dev)
			if err != nil {
				t.Errorf("link %q: %v", dev, err)
				return nil
			}
			qs, _ := netlink.QdiscList(link)
			var kinds []string
			for _, q := range qs {
				kinds = append(kinds, q.Type())
			}
			if !strings.Contains(strings.Join(kinds, " "), "tbf") {
				t.Errorf("%s: qdiscs %v, want a tbf", dev, kinds)
			}
			return nil
		})
	}
	tbf(l.env.Node, p.host)
	if !l.chained {
		tbf(l.env.WireNS(&nettest.Pod{ID: p.id}), "eth0")
		return ""
	}
	nettest.In(l.env.Node, func() error {
		links, _ := netlink.LinkList()
		for _, k := range links {
			if k.Type() == "ifb" {
				ifb = k.Attrs().Name
			}
		}
		return nil
	})
	if ifb == "" {
		t.Fatal("no ifb on the node: egress is not shaped")
	}
	tbf(l.env.Node, ifb)
	return ifb
}
