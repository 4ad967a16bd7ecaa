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
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/pkg/state"
	"github.com/cni-usernet/cni-usernet/test/nettest"
)

const cniVersion = "1.1.0"

// capturer is a running `cni-usernet capture`.
type capturer struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startCapture runs the capture command on the node (the test's root
// namespace is the node's: the command enters the pod's namespace itself)
// and waits until it captures.
func startCapture(t *testing.T, env *nettest.Env, stdout io.Writer, args ...string) *capturer {
	t.Helper()
	argv := append([]string{"capture", "--state-dir", filepath.Join(env.Dir, "state")}, args...)
	c := &capturer{cmd: exec.Command(filepath.Join(env.BinDir, "cni-usernet"), argv...), stderr: &syncBuffer{}, done: make(chan error, 1)}
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

func ifIndexIn(t *testing.T, pod *nettest.Pod, name string) int {
	t.Helper()
	var idx int
	err := nettest.In(pod.NS, func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		idx = l.Attrs().Index
		return nil
	})
	if err != nil {
		t.Fatalf("looking up %s in the pod: %v", name, err)
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

// TestCaptureHTTP captures one HTTP exchange from the node to a server in
// the pod, streamed into `tcpdump -r -`, and checks that both legs show the
// SYN, the request line and the response with the client's real address
// and port, the wire leg first, and that the pod's own loopback traffic
// stays out.
func TestCaptureHTTP(t *testing.T) {
	env := nettest.NewEnv(t)
	pod := env.NewPod(env.Conf(cniVersion, nil))
	requireSandboxed(t, stackPID(t, env, pod))
	ln := nettest.Listen(t, pod.NS, "tcp", ":8080")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	// The pod's own loopback chatter, which is not the relay's and must
	// not be captured.
	local := nettest.Listen(t, pod.NS, "tcp", "127.0.0.1:9099")
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
	chatter := func() {
		for range 3 {
			c, err := nettest.Dial(pod.NS, "tcp", "127.0.0.1:9099", time.Second)
			if err != nil {
				t.Errorf("pod's loopback: %v", err)
				return
			}
			c.Write([]byte("local chatter"))
			c.Close()
		}
	}

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
	podIP := pod.IP(4)
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

	wireIdx, loIdx := ifIndexIn(t, pod, "eth0"), ifIndexIn(t, pod, "lo")
	client := pod.Gateway(4)
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
		if strings.Contains(p.line, "127.0.0.1") || strings.Contains(p.payload, "local chatter") {
			t.Errorf("the pod's own loopback traffic was captured: %s", p.line)
		}
		if p.ifIndex != wireIdx && p.ifIndex != loIdx && p.ifIndex != -1 {
			// The TUN carries no part of an inbound exchange.
			t.Logf("other interface: %s", p.line)
		}
	}
}
