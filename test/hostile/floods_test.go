package hostile

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// requireHping3 finds hping3 (and timeout, which bounds it), failing the
// test when missing: hack/deps.sh installs it.
func requireHping3(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("hping3")
	if err != nil {
		t.Fatalf("hping3 not found (hack/deps.sh installs it): %v", err)
	}
	if _, err := exec.LookPath("timeout"); err != nil {
		t.Fatalf("timeout (coreutils) not found: %v", err)
	}
	return p
}

// hping3Flood is `hping3 -S -p PORT --flood --rand-source -I IFACE DST`
// run in the node namespace: SYNs from random IPv4 sources as fast as one
// process sends them. With args, those replace `-S -p PORT`.
type hping3Flood struct {
	path  string
	node  ns.NetNS
	iface string
	dst   netip.Addr
	port  int
	args  []string
	unit  string // what one packet is, for the table ("SYN" without args)

	cmd  *exec.Cmd
	out  nettest.LockedBuffer
	done chan error
}

// hpingSent is hping3's summary on SIGINT.
var hpingSent = regexp.MustCompile(`(\d+) packets transmitted`)

func (h *hping3Flood) start(t *testing.T) {
	t.Helper()
	// timeout bounds hping3 even if this test binary dies without its
	// cleanups (a go test -timeout panic); stop sends SIGINT earlier, which
	// timeout passes on, and hping3 prints how many it sent.
	limit := floodDuration + 10*time.Second
	args := []string{"-s", "INT", "-k", "5s", strconv.Itoa(int(limit.Seconds())), h.path}
	args = append(args, h.floodArgs()...)
	args = append(args, "--flood", "--rand-source", "-I", h.iface, h.dst.String())
	h.cmd = exec.Command("timeout", args...)
	h.cmd.Stdout, h.cmd.Stderr = &h.out, &h.out
	// Its own process group from the start (timeout would make one
	// itself, a moment later), so kill reaches hping3 too.
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := nettest.In(h.node, h.cmd.Start); err != nil {
		t.Fatalf("starting %s: %v", h.cmd, err)
	}
	h.done = make(chan error, 1)
	go func() { h.done <- h.cmd.Wait() }()
	t.Cleanup(func() { h.kill() })
	// The node is a namespace, never the machine's: check where it runs.
	if err := sameNetns(h.cmd.Process.Pid, h.node); err != nil {
		h.kill()
		t.Fatalf("hping3: %v", err)
	}
}

func (h *hping3Flood) stop(t *testing.T) floodStats {
	t.Helper()
	h.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-h.done:
	case <-time.After(5 * time.Second):
		h.kill()
		t.Errorf("hping3 did not stop on SIGINT within 5 s; killed; output: %s", h.out.String())
	}
	s := floodStats{what: "hping3 " + strings.Join(h.floodArgs(), " ") + " --flood --rand-source", unit: cmp.Or(h.unit, "SYN")}
	m := hpingSent.FindStringSubmatch(h.out.String())
	if m == nil {
		t.Errorf("hping3 printed no count of packets sent: %q", h.out.String())
		return s
	}
	s.sent, _ = strconv.ParseUint(m[1], 10, 64)
	return s
}

func (h *hping3Flood) floodArgs() []string {
	if h.args != nil {
		return h.args
	}
	return []string{"-S", "-p", strconv.Itoa(h.port)}
}

// kill ends hping3 (and timeout) at once, if still running.
func (h *hping3Flood) kill() {
	if h.cmd == nil || h.cmd.Process == nil {
		return
	}
	select {
	case err := <-h.done:
		h.done <- err // stays readable for stop
		return
	default:
	}
	// timeout and hping3 are the process group timeout leads.
	syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
	h.cmd.Process.Kill()
	select {
	case err := <-h.done:
		h.done <- err
	case <-time.After(5 * time.Second):
	}
}

// sameNetns checks that process pid is in netns.
func sameNetns(pid int, netns ns.NetNS) error {
	var want, got syscall.Stat_t
	if err := syscall.Stat(netns.Path(), &want); err != nil {
		return fmt.Errorf("stat %s: %w", netns.Path(), err)
	}
	p := fmt.Sprintf("/proc/%d/ns/net", pid)
	if err := syscall.Stat(p, &got); err != nil {
		return fmt.Errorf("stat %s: %w", p, err)
	}
	if want.Ino != got.Ino || want.Dev != got.Dev {
		return fmt.Errorf("process %d is in network namespace %d, want the node's %d", pid, got.Ino, want.Ino)
	}
	return nil
}

// connectFlood is an application in pod opening TCP connections as fast
// as it can: non-blocking connects from workers threads, each keeping at
// most open/workers sockets (the oldest closed to make room), to random
// addresses of sinkRange (sinkAddrs are the node's, the rest is dropped
// silently at the node) and ports (one in eight a listening sinkPort, the
// others refused by the node).
type connectFlood struct {
	pod           *nettest.Pod
	workers, open int

	stopc chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex // guards what follows
	tries uint64
	errs  map[string]uint64
}

func (f *connectFlood) start(t *testing.T) {
	t.Helper()
	f.stopc = make(chan struct{})
	f.errs = map[string]uint64{}
	// Bounded even if stop is never called.
	deadline := time.Now().Add(floodDuration + 5*time.Second)
	for w := range f.workers {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			if err := nettest.In(f.pod.NS, func() error { return f.run(w, deadline) }); err != nil {
				f.count("worker: " + err.Error())
			}
		}()
	}
	t.Cleanup(func() { f.halt() })
}

func (f *connectFlood) halt() {
	select {
	case <-f.stopc:
	default:
		close(f.stopc)
	}
	f.wg.Wait()
}

func (f *connectFlood) stop(t *testing.T) floodStats {
	t.Helper()
	f.halt()
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []string
	for e, n := range f.errs {
		errs = append(errs, fmt.Sprintf("%s ×%d", e, n))
	}
	sort.Strings(errs)
	if len(errs) > 0 {
		t.Logf("connect flood: errors: %s", strings.Join(errs, ", "))
	}
	return floodStats{
		what: fmt.Sprintf("non-blocking connects from %d threads to %s, %d open at most", f.workers, sinkRange, f.open),
		sent: f.tries, unit: "connects",
	}
}

func (f *connectFlood) count(err string) {
	f.mu.Lock()
	f.errs[err]++
	f.mu.Unlock()
}

// run is one worker, on a thread in the pod's namespace.
func (f *connectFlood) run(seed int, deadline time.Time) error {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	ring := make([]int, 0, f.open/f.workers)
	next := 0 // the oldest socket once ring is full
	defer func() {
		for _, fd := range ring {
			unix.Close(fd)
		}
	}()
	base := sinkRange.Addr().As4()
	hosts := 1 << (32 - sinkRange.Bits())
	var tries uint64
	defer func() {
		f.mu.Lock()
		f.tries += tries
		f.mu.Unlock()
	}()
	for i := 0; ; i++ {
		if i%256 == 0 {
			select {
			case <-f.stopc:
				return nil
			default:
			}
			if time.Now().After(deadline) {
				return nil
			}
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			f.count("socket: " + err.Error())
			continue
		}
		addr := base
		addr[3] += byte(1 + rng.IntN(hosts-1))
		port := 1024 + rng.IntN(65536-1024)
		if rng.IntN(8) == 0 {
			port = sinkPorts[rng.IntN(len(sinkPorts))]
		}
		tries++
		if err := unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: addr}); err != nil && !errors.Is(err, unix.EINPROGRESS) {
			f.count("connect: " + err.Error())
			unix.Close(fd)
			continue
		}
		if len(ring) < cap(ring) {
			ring = append(ring, fd)
			continue
		}
		unix.Close(ring[next])
		ring[next] = fd
		next = (next + 1) % len(ring)
	}
}

// sinkNode gives the node namespace the in-pod flood's destinations:
// sinkAddrs on its lo, and listeners on sinkPorts that accept and close.
func sinkNode(t *testing.T, node ns.NetNS) {
	t.Helper()
	err := nettest.In(node, func() error {
		lo, err := netlinksafe.LinkByName("lo")
		if err != nil {
			return err
		}
		for a := sinkAddrs.Addr().Next(); sinkAddrs.Contains(a); a = a.Next() {
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
				return fmt.Errorf("adding %s to lo: %w", a, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("node's sink addresses: %v", err)
	}
	for _, p := range sinkPorts {
		nettest.Serve(nettest.Listen(t, node, "tcp", ":"+strconv.Itoa(p)), func(net.Conn) {})
	}
}

// nodeGuard is the node namespace's drop of everything addressed outside
// the test's own prefixes: the pods' answers to hping3's random sources
// (SYN-ACKs, RSTs) and the in-pod flood's silent destinations.
type nodeGuard struct{ node ns.NetNS }

const guardTable = "hostile_guard"

// guardNode checks that the node namespace has no default route (so
// nothing it forwards can leave it) and installs the guard: an nftables
// rule at prerouting, before routing, dropping and counting IPv4 packets
// to any address outside ours. The table goes with the namespace.
func guardNode(t *testing.T, node ns.NetNS, ours ...netip.Prefix) *nodeGuard {
	t.Helper()
	err := nettest.In(node, func() error {
		routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return fmt.Errorf("listing routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst == nil || r.Dst.IP.IsUnspecified() {
				if ones, _ := maskOf(r.Dst); ones == 0 {
					return fmt.Errorf("node namespace has a default route: %s", r)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("node namespace: %v", err)
	}
	var set []string
	for _, p := range ours {
		set = append(set, p.String())
	}
	script := fmt.Sprintf(`table ip %s {
	chain prerouting {
		type filter hook prerouting priority raw; policy accept;
		ip daddr != { %s } counter drop
	}
}
`, guardTable, strings.Join(set, ", "))
	if out, err := nft(node, script, "-f", "-"); err != nil {
		t.Fatalf("installing the node's guard: %v: %s", err, out)
	}
	g := &nodeGuard{node: node}
	g.dropped(t)
	return g
}

func maskOf(n *net.IPNet) (int, int) {
	if n == nil {
		return 0, 0
	}
	return n.Mask.Size()
}

var nftCounter = regexp.MustCompile(`counter packets (\d+)`)

// dropped is how many packets the guard has dropped.
func (g *nodeGuard) dropped(t *testing.T) uint64 {
	t.Helper()
	out, err := nft(g.node, "", "list", "chain", "ip", guardTable, "prerouting")
	if err != nil {
		t.Fatalf("reading the node's guard: %v: %s", err, out)
	}
	m := nftCounter.FindSubmatch(out)
	if m == nil {
		t.Fatalf("no counter in the node's guard: %s", out)
	}
	n, _ := strconv.ParseUint(string(m[1]), 10, 64)
	return n
}

// nft runs nft in netns with stdin.
func nft(netns ns.NetNS, stdin string, args ...string) ([]byte, error) {
	var out []byte
	err := nettest.In(netns, func() (err error) {
		cmd := exec.Command("nft", args...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err = cmd.CombinedOutput()
		return err
	})
	return out, err
}

// linkStats reads an interface's counters in netns.
func linkStats(t *testing.T, netns ns.NetNS, name string) netlink.LinkStatistics {
	t.Helper()
	var s netlink.LinkStatistics
	err := nettest.In(netns, func() error {
		l, err := netlinksafe.LinkByName(name)
		if err != nil {
			return err
		}
		if l.Attrs().Statistics != nil {
			s = netlink.LinkStatistics(*l.Attrs().Statistics)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading counters of %s: %v", name, err)
	}
	return s
}

// tcpExt reads the TcpExt counters of netns that tell how a kernel met a
// SYN flood (SYN cookies, listen queue overflows); nil if unreadable.
func tcpExt(netns ns.NetNS) map[string]float64 {
	var b []byte
	nettest.In(netns, func() (err error) {
		b, err = os.ReadFile("/proc/thread-self/net/netstat")
		return err
	})
	lines := strings.Split(string(b), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		keys, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(keys) == 0 || keys[0] != "TcpExt:" || len(keys) != len(vals) {
			continue
		}
		m := map[string]float64{}
		for j := 1; j < len(keys); j++ {
			switch keys[j] {
			case "SyncookiesSent", "SyncookiesRecv", "SyncookiesFailed", "ListenOverflows", "ListenDrops", "TCPReqQFullDoCookies", "TCPReqQFullDrop":
				v, _ := strconv.ParseFloat(vals[j], 64)
				m[keys[j]] = v
			}
		}
		return m
	}
	return nil
}

// rawStatus reads a stack's /status as JSON values, so that counters the
// stack grows later show up in the logs without changing the test.
func rawStatus(t *testing.T, att *state.Attachment) map[string]any {
	t.Helper()
	var m map[string]any
	if err := control.FetchStatusInto(att.ControlSocket, 10*time.Second, &m); err != nil {
		t.Errorf("reading stack status: %v", err)
	}
	return m
}

// statusSummary is the link and relay counters of a status.
func statusSummary(st map[string]any) string {
	var parts []string
	for _, k := range []string{"wire", "app", "relay"} {
		b, _ := json.Marshal(st[k])
		parts = append(parts, k+" "+string(b))
	}
	return strings.Join(parts, " ")
}

// flatten turns a status's numbers into dotted keys (spec excluded).
func flatten(st map[string]any) map[string]float64 {
	out := map[string]float64{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case float64:
			out[prefix] = v
		case map[string]any:
			for k, x := range v {
				if prefix == "" && (k == "spec" || k == "pid") {
					continue
				}
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				walk(p, x)
			}
		}
	}
	walk("", st)
	return out
}

// counterDeltas lists the counters that changed, sorted.
func counterDeltas(before, after map[string]float64) []string {
	var out []string
	for k, a := range after {
		b := before[k]
		if a == b {
			continue
		}
		if a > b {
			out = append(out, fmt.Sprintf("%s +%.0f", k, a-b))
		} else {
			out = append(out, fmt.Sprintf("%s %.0f→%.0f", k, b, a))
		}
	}
	sort.Strings(out)
	return out
}

// gsoMode is how the stack's GSO mode was chosen, e.g. "auto → hardware".
func gsoMode(t *testing.T, att *state.Attachment) string {
	t.Helper()
	g, _ := rawStatus(t, att)["gso"].(map[string]any)
	req, _ := g["requested"].(string)
	mode, _ := g["mode"].(string)
	if req == "" || req == mode {
		return mode
	}
	return req + " → " + mode
}
