// Package capture holds the root tests of `cni-usernet capture`: a pod
// attached through the real plugin (its stack sandboxed, the default), a
// real HTTP exchange from the node captured on both legs and read back
// with Debian's tcpdump.
package capture

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

const cniVersion = "1.1.0"

// capturer is a running `cni-usernet capture`.
type capturer struct {
	cmd    *exec.Cmd
	stderr *nettest.LockedBuffer
	done   chan error
}

// startCapture runs the capture command on the node (the test's root
// namespace is the node's: the command enters the pod's namespace itself)
// and waits until it captures.
func startCapture(t *testing.T, env *nettest.Env, stdout io.Writer, args ...string) *capturer {
	t.Helper()
	argv := append([]string{"capture", "--state-dir", filepath.Join(env.Dir, "state")}, args...)
	c := &capturer{cmd: exec.Command(filepath.Join(env.BinDir, "cni-usernet"), argv...), stderr: &nettest.LockedBuffer{}, done: make(chan error, 1)}
	c.cmd.Stdout = stdout
	c.cmd.Stderr = c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.done <- c.cmd.Wait() }()
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		<-c.done
	})
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(c.stderr.String(), "capturing") {
		select {
		case err := <-c.done:
			c.done <- err
			t.Fatalf("capture exited before capturing: %v\n%s", err, c.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("capture not started after 10s:\n%s", c.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

// stop interrupts the capture and waits for it.
func (c *capturer) stop(t *testing.T) string {
	t.Helper()
	c.cmd.Process.Signal(os.Interrupt)
	return c.wait(t)
}

func (c *capturer) wait(t *testing.T) string {
	t.Helper()
	select {
	case err := <-c.done:
		c.done <- err
		if err != nil {
			t.Fatalf("capture: %v\n%s", err, c.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("capture did not end 30s after it was stopped:\n%s", c.stderr.String())
	}
	t.Logf("capture said:\n%s", c.stderr.String())
	return c.stderr.String()
}

// pkt is one packet as tcpdump -nn -e -A prints it.
type pkt struct {
	ifIndex int
	dir     string // In, Out
	src     netip.AddrPort
	dst     netip.AddrPort
	flags   string
	line    string
	payload string
}

// 10:00:00.000000 ?     In  ifindex 2 02:... ethertype IPv4 (0x0800), length 80: 10.199.0.1.42 > 10.199.0.2.8080: Flags [S], ...
var headRE = regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d+ +\S+ +(In|Out|B|M|P) +ifindex (\d+) .*?: (\S+)\.(\d+) > (\S+)\.(\d+): (?:Flags \[([^\]]*)\])?`)
var tsRE = regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d+ `)

// parseTcpdump reads tcpdump -nn -e -A output; lines that are not
// TCP/UDP headers are kept with ifIndex -1.
func parseTcpdump(t *testing.T, out string) []pkt {
	var pkts []pkt
	for _, line := range strings.Split(out, "\n") {
		if tsRE.MatchString(line) {
			p := pkt{ifIndex: -1, line: line}
			if m := headRE.FindStringSubmatch(line); m != nil {
				p.dir = m[1]
				p.ifIndex, _ = strconv.Atoi(m[2])
				p.src = netip.AddrPortFrom(netip.MustParseAddr(m[3]), mustPort(m[4]))
				p.dst = netip.AddrPortFrom(netip.MustParseAddr(m[5]), mustPort(m[6]))
				p.flags = m[7]
			}
			pkts = append(pkts, p)
			continue
		}
		if len(pkts) > 0 {
			pkts[len(pkts)-1].payload += line + "\n"
		}
	}
	return pkts
}

func mustPort(s string) uint16 {
	n, _ := strconv.Atoi(s)
	return uint16(n)
}

func ifIndexIn(t *testing.T, netns ns.NetNS, name string) int {
	t.Helper()
	var idx int
	err := nettest.In(netns, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		idx = l.Attrs().Index
		return nil
	})
	if err != nil {
		t.Fatalf("looking up %s: %v", name, err)
	}
	return idx
}

// curl runs Debian's curl in ns against url and returns its output.
func curl(t *testing.T, netnsPath, url string) string {
	t.Helper()
	out, err := exec.Command("nsenter", "--net="+netnsPath, "curl", "-sS", "--max-time", "10", url).CombinedOutput()
	if err != nil {
		t.Fatalf("curl %s: %v\n%s", url, err, out)
	}
	return string(out)
}

// stackPID reads the attachment's stack process.
func stackPID(t *testing.T, env *nettest.Env, pod *nettest.Pod) int {
	t.Helper()
	a, err := state.Store{Dir: filepath.Join(env.Dir, "state")}.Load(pod.ID, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	return a.StackPID
}

// requireSandboxed fails unless the stack runs under its seccomp filter:
// the capture's wire leg must work from inside it.
func requireSandboxed(t *testing.T, pid int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^Seccomp:\s+2$`).Match(b) {
		t.Fatalf("stack %d is not under a seccomp filter (the sandbox is on by default):\n%s", pid, b)
	}
}

const body = "hello from the pod, captured"

// serveBody answers HTTP on the pod's port 8080 with body until the test
// ends.
func serveBody(t *testing.T, pod *nettest.Pod) {
	ln := nettest.Listen(t, pod.NS, "tcp", ":8080")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// TestCaptureHTTP captures one HTTP exchange from the node to a server in
// the pod, streamed into `tcpdump -r -`, and checks that both legs show the
// SYN, the request line and the response with the client's real address
// and port, the wire leg first, and that the pod's own loopback traffic
// stays out.
func TestCaptureHTTP(t *testing.T) {
	env := nettest.NewEnv(t)
	pod := env.NewPod(env.Conf(cniVersion, nil))
	requireSandboxed(t, stackPID(t, env, pod))
	serveBody(t, pod)
	// The pod's own loopback chatter, which is not the relay's and must
	// not be captured.
	for _, addr := range []string{"127.0.0.1:9099", "[::1]:9099"} {
		local := nettest.Listen(t, pod.NS, "tcp", addr)
		go func() {
			for {
				c, err := local.Accept()
				if err != nil {
					return
				}
				io.Copy(io.Discard, c)
				c.Close()
			}
		}()
	}
	chatter := func() {
		for _, addr := range []string{"127.0.0.1:9099", "[::1]:9099", nettest.HostPort(pod.IP(6), 8080)} {
			c, err := nettest.Dial(pod.NS, "tcp", addr, time.Second)
			if err != nil {
				t.Errorf("pod's loopback: %v", err)
				return
			}
			c.Write([]byte("local chatter"))
			c.Close()
		}
	}
	for _, fam := range []int{4, 6} {
		t.Run(fmt.Sprintf("IPv%d", fam), func(t *testing.T) { checkHTTPCapture(t, env, pod, fam, chatter) })
	}
}

// checkHTTPCapture is TestCaptureHTTP for one address family.
func checkHTTPCapture(t *testing.T, env *nettest.Env, pod *nettest.Pod, fam int, chatter func()) {

	tcpdump := exec.Command("tcpdump", "-nn", "-e", "-A", "-r", "-")
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	tcpdump.Stdin = pr
	var tdOut, tdErr bytes.Buffer
	tcpdump.Stdout, tcpdump.Stderr = &tdOut, &tdErr
	if err := tcpdump.Start(); err != nil {
		t.Fatalf("starting tcpdump (apt install tcpdump; hack/deps.sh): %v", err)
	}
	pr.Close()
	c := startCapture(t, env, pw, "test/"+pod.ID)
	pw.Close()

	chatter()
	podIP := pod.IP(fam)
	got := curl(t, env.Node.Path(), "http://"+nettest.HostPort(podIP, 8080)+"/capture-me")
	if got != body {
		t.Fatalf("curl got %q, want %q", got, body)
	}
	chatter()
	time.Sleep(300 * time.Millisecond)
	summary := c.stop(t)
	if err := tcpdump.Wait(); err != nil {
		t.Fatalf("tcpdump -r -: %v\n%s", err, tdErr.String())
	}
	if !strings.Contains(summary, " 0 packets dropped") {
		t.Errorf("summary does not say 0 packets dropped:\n%s", summary)
	}
	t.Logf("tcpdump -nn -e -A -r -:\n%s", tdOut.String())
	pkts := parseTcpdump(t, tdOut.String())

	wireIdx, loIdx := ifIndexIn(t, env.WireNS(pod), "eth0"), ifIndexIn(t, pod.NS, "lo")
	client := pod.Gateway(fam)
	server := netip.AddrPortFrom(podIP, 8080)
	// The client's port, from the wire SYN; the app leg must show the
	// same address and port.
	var clientPort uint16
	for _, p := range pkts {
		if p.ifIndex == wireIdx && p.dst == server && p.flags == "S" {
			clientPort = p.src.Port()
		}
	}
	if clientPort == 0 {
		t.Fatalf("no SYN to %s on the wire leg (ifindex %d)", server, wireIdx)
	}
	from := netip.AddrPortFrom(client, clientPort)
	find := func(leg string, ifIndex int, want func(pkt) bool) int {
		for i, p := range pkts {
			if p.ifIndex == ifIndex && want(p) {
				return i
			}
		}
		t.Errorf("%s leg (ifindex %d): no packet matching", leg, ifIndex)
		return -1
	}
	for _, leg := range []struct {
		name      string
		idx       int
		inDir     string
		outDir    string
		wantFirst bool
	}{{"wire", wireIdx, "In", "Out", true}, {"app", loIdx, "In", "In", false}} {
		syn := find(leg.name, leg.idx, func(p pkt) bool { return p.src == from && p.dst == server && p.flags == "S" && p.dir == leg.inDir })
		req := find(leg.name, leg.idx, func(p pkt) bool {
			return p.src == from && p.dst == server && strings.Contains(p.payload, "GET /capture-me HTTP/1.1")
		})
		resp := find(leg.name, leg.idx, func(p pkt) bool {
			return p.src == server && p.dst == from && p.dir == leg.outDir && strings.Contains(p.payload, "HTTP/1.1 200 OK")
		})
		bodyAt := find(leg.name, leg.idx, func(p pkt) bool { return p.src == server && p.dst == from && strings.Contains(p.payload, body) })
		if syn < 0 || req < 0 || resp < 0 || bodyAt < 0 {
			continue
		}
		if !(syn < req && req <= resp && resp <= bodyAt) {
			t.Errorf("%s leg: SYN, request, response at %d, %d, %d: out of order", leg.name, syn, req, resp)
		}
		t.Logf("%s leg: SYN %q", leg.name, pkts[syn].line)
	}
	// The relay dials the application only after the wire SYN came in.
	wireSyn := find("wire", wireIdx, func(p pkt) bool { return p.src == from && p.flags == "S" })
	appSyn := find("app", loIdx, func(p pkt) bool { return p.src == from && p.flags == "S" })
	if wireSyn >= 0 && appSyn >= 0 && appSyn < wireSyn {
		t.Errorf("the app leg's SYN (packet %d) comes before the wire leg's (%d): the merge is not in time order", appSyn, wireSyn)
	}
	for _, p := range pkts {
		if strings.Contains(p.line, "127.0.0.1") || strings.Contains(p.line, " ::1.") ||
			(p.src.IsValid() && p.src.Addr() == p.dst.Addr()) || strings.Contains(p.payload, "local chatter") {
			t.Errorf("the pod's own loopback traffic was captured: %s", p.line)
		}
		if p.ifIndex != wireIdx && p.ifIndex != loIdx && p.ifIndex != -1 {
			// The TUN carries no part of an inbound exchange.
			t.Logf("other interface: %s", p.line)
		}
	}
}

// sink accepts connections in the pod and reads them to the end, then
// closes: the client's read of EOF says everything arrived.
func sink(t *testing.T, pod *nettest.Pod, port int) {
	ln := nettest.Listen(t, pod.NS, "tcp", fmt.Sprintf(":%d", port))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
}

// send pushes n bytes from the node to the pod's sink and returns how
// long until the pod had them all.
func send(t *testing.T, env *nettest.Env, to netip.AddrPort, n int64, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	c, err := nettest.Dial(env.Node, "tcp", to.String(), 5*time.Second)
	if err != nil {
		t.Fatalf("dialing %s: %v", to, err)
	}
	defer c.Close()
	c.SetDeadline(start.Add(timeout))
	chunk := bytes.Repeat([]byte("cni-usernet capture slow reader "), 2048)
	for sent := int64(0); sent < n; sent += int64(len(chunk)) {
		if _, err := c.Write(chunk); err != nil {
			t.Fatalf("after %d of %d bytes in %v: %v (the pod's traffic stalled?)", sent, n, time.Since(start), err)
		}
	}
	c.(interface{ CloseWrite() error }).CloseWrite()
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("waiting for the pod to take %d bytes: %v", n, err)
	}
	return time.Since(start)
}

var droppedRE = regexp.MustCompile(`(\d+) packets DROPPED because the reader was too slow .*eth0 \(wire\): (\d+) in the stack`)

// TestCaptureSlowReader captures bulk traffic into a pipe nobody reads:
// the pod's transfer must go on at speed (drops, not waits), and once the
// reader catches up the capture must say how many packets it dropped
// where, and still be a file tcpdump reads.
func TestCaptureSlowReader(t *testing.T) {
	env := nettest.NewEnv(t)
	pod := env.NewPod(env.Conf(cniVersion, nil))
	requireSandboxed(t, stackPID(t, env, pod))
	sink(t, pod, 9000)
	to := netip.AddrPortFrom(pod.IP(4), 9000)
	size := int64(256 << 20)
	if testing.Short() {
		size = 64 << 20
	}
	base := send(t, env, to, size, 60*time.Second)

	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close() })
	c := startCapture(t, env, pw, "test/"+pod.ID)
	pw.Close()
	// Nobody reads pr: the pipe (64 KiB) fills at once, then the
	// command's merge, then the stack's queue and the kernel's socket
	// buffer; from there on packets are dropped.
	captured := send(t, env, to, size, 60*time.Second)
	mbps := func(d time.Duration) float64 { return float64(size) * 8 / d.Seconds() / 1e6 }
	t.Logf("%d MiB node -> pod: %.0f Mbit/s without a capture, %.0f Mbit/s with a capture nobody reads", size>>20, mbps(base), mbps(captured))
	// A stalled data path would not have finished in the deadline at all;
	// this bounds the slowdown the dropping costs.
	if captured > 5*base+2*time.Second {
		t.Errorf("transfer took %v with a stuck capture reader, %v without: the capture holds the pod up", captured, base)
	}
	// The reader comes back.
	t.Logf("%v: interrupting the capture", time.Now().Format(time.StampMilli))
	c.cmd.Process.Signal(os.Interrupt)
	f, err := os.Create(filepath.Join(t.TempDir(), "slow.pcapng"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, pr); err != nil {
		t.Fatal(err)
	}
	f.Close()
	summary := c.wait(t)
	t.Logf("%v: capture ended", time.Now().Format(time.StampMilli))
	m := droppedRE.FindStringSubmatch(summary)
	if m == nil {
		t.Fatalf("the summary does not report packets dropped in the stack:\n%s", summary)
	}
	if n, _ := strconv.Atoi(m[2]); n == 0 {
		t.Errorf("0 wire packets dropped for a reader that never read:\n%s", summary)
	}
	out, err := exec.Command("tcpdump", "-nn", "-r", f.Name()).CombinedOutput()
	if err != nil {
		t.Fatalf("tcpdump -r of the capture: %v\n%.2000s", err, out)
	}
	if n := bytes.Count(out, []byte(fmt.Sprintf(" > %s.%d:", to.Addr(), to.Port()))); n == 0 {
		t.Errorf("the capture holds no packet to %s:\n%.2000s", to, out)
	}
}

// TestCaptureCountLegAndFile captures with -w, -c and each --leg, and
// checks that the file holds exactly the count from the chosen leg only.
func TestCaptureCountLegAndFile(t *testing.T) {
	env := nettest.NewEnv(t)
	pod := env.NewPod(env.Conf(cniVersion, nil))
	serveBody(t, pod)
	url := "http://" + nettest.HostPort(pod.IP(4), 8080) + "/"
	wireIdx, loIdx := ifIndexIn(t, env.WireNS(pod), "eth0"), ifIndexIn(t, pod.NS, "lo")
	for _, tc := range []struct {
		leg  string
		want map[int]bool // interface indexes allowed
	}{{"wire", map[int]bool{wireIdx: true}}, {"app", map[int]bool{loIdx: true}}, {"both", map[int]bool{wireIdx: true, loIdx: true}}} {
		t.Run(tc.leg, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), tc.leg+".pcapng")
			// The container ID's prefix names the pod as well.
			c := startCapture(t, env, io.Discard, "-w", file, "-c", "5", "--leg", tc.leg, pod.ID[:6])
			// Enough traffic for 5 packets on any leg; the capture ends
			// by itself at the count.
			for range 3 {
				curl(t, env.Node.Path(), url)
			}
			summary := c.wait(t)
			if !strings.Contains(summary, "5 packets written, the count reached") {
				t.Errorf("summary does not say the count was reached:\n%s", summary)
			}
			out, err := exec.Command("tcpdump", "-nn", "-e", "-r", file).CombinedOutput()
			if err != nil {
				t.Fatalf("tcpdump -r %s: %v\n%s", file, err, out)
			}
			pkts := parseTcpdump(t, string(out))
			if len(pkts) != 5 {
				t.Fatalf("tcpdump read %d packets, want 5:\n%s", len(pkts), out)
			}
			for _, p := range pkts {
				m := regexp.MustCompile(`ifindex (\d+)`).FindStringSubmatch(p.line)
				if m == nil {
					t.Fatalf("no ifindex in %q", p.line)
				}
				if i, _ := strconv.Atoi(m[1]); !tc.want[i] {
					t.Errorf("--leg %s: packet on ifindex %d: %s", tc.leg, i, p.line)
				}
			}
		})
	}
}

// TestCaptureReaderExits pipes the capture into `tcpdump -c 3`: when
// tcpdump has its packets and exits, the capture must end by itself
// (EPIPE, not a SIGPIPE death) with its summary, and tell the stack to
// stop.
func TestCaptureReaderExits(t *testing.T) {
	env := nettest.NewEnv(t)
	pod := env.NewPod(env.Conf(cniVersion, nil))
	serveBody(t, pod)
	tcpdump := exec.Command("tcpdump", "-nn", "-c", "3", "-r", "-")
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	tcpdump.Stdin = pr
	var tdOut bytes.Buffer
	tcpdump.Stdout, tcpdump.Stderr = &tdOut, &tdOut
	if err := tcpdump.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	c := startCapture(t, env, pw, "test/"+pod.ID)
	pw.Close()
	url := "http://" + nettest.HostPort(pod.IP(4), 8080) + "/"
	deadline := time.Now().Add(20 * time.Second)
	for ended := false; !ended; {
		if time.Now().After(deadline) {
			t.Fatalf("the capture still runs 20s after its reader exited:\n%s", c.stderr.String())
		}
		// Traffic, so that the capture has something to write and
		// finds its reader gone.
		curl(t, env.Node.Path(), url)
		select {
		case err := <-c.done:
			c.done <- err
			ended = true
		case <-time.After(200 * time.Millisecond):
		}
	}
	summary := c.wait(t)
	if err := tcpdump.Wait(); err != nil {
		t.Fatalf("tcpdump -c 3: %v\n%s", err, tdOut.String())
	}
	if n := len(regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d\.\d+ `).FindAllString(tdOut.String(), -1)); n != 3 {
		t.Errorf("tcpdump -c 3 printed %d packets:\n%s", n, tdOut.String())
	}
	if !strings.Contains(summary, "packets written") {
		t.Errorf("no summary after the reader exited:\n%s", summary)
	}
	// The stack's capture ended with the command: its socket takes a new
	// one at once (the limit would refuse a fifth if they leaked).
	for range 5 {
		c := startCapture(t, env, io.Discard, "-c", "1", "test/"+pod.ID)
		curl(t, env.Node.Path(), url)
		c.wait(t)
	}
}

// TestCaptureStackDies kills the pod's stack during a capture: the
// capture must end at once with an error that says so, having written
// what it had.
func TestCaptureStackDies(t *testing.T) {
	env := nettest.NewEnv(t)
	pod := env.NewPod(env.Conf(cniVersion, nil))
	file := filepath.Join(t.TempDir(), "dies.pcapng")
	c := startCapture(t, env, io.Discard, "-w", file, "test/"+pod.ID)
	if err := syscall.Kill(stackPID(t, env, pod), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-c.done:
		c.done <- err
		if err == nil {
			t.Fatalf("capture exited 0 after its stack died:\n%s", c.stderr.String())
		}
		t.Logf("capture: %v\n%s", err, c.stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("capture still runs 10s after its stack died:\n%s", c.stderr.String())
	}
	if !strings.Contains(c.stderr.String(), "the stack stopped or restarted") {
		t.Errorf("the error does not say the stack went away:\n%s", c.stderr.String())
	}
	if out, err := exec.Command("tcpdump", "-nn", "-r", file).CombinedOutput(); err != nil {
		t.Errorf("tcpdump -r of the capture cut short by the stack's death: %v\n%s", err, out)
	}
}
