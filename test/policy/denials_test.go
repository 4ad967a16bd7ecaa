package policy

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// findDenial is the first recent denial in the stack's status that
// matches want in its direction, protocol, peer, port and policies.
func (r *rig) findDenial(t *testing.T, want policy.Denial) (policy.Denial, bool) {
	t.Helper()
	for _, d := range r.status(t).Policy.RecentDenials {
		if d.Direction == want.Direction && d.Protocol == want.Protocol && d.Peer == want.Peer && d.Port == want.Port && d.Policies == want.Policies {
			return d, true
		}
	}
	return policy.Denial{}, false
}

// denialRow is a row of `cni-usernet denials -json`.
type denialRow struct {
	Pod         string `json:"pod"`
	ContainerID string `json:"containerID"`
	policy.Denial
}

// TestDenialsSeen: each denied connection and flow is in the stack's
// status with what was denied and where, in its log, and in
// `cni-usernet denials` with its pod.
func TestDenialsSeen(t *testing.T) {
	r := newRig(t)
	p := r.ingressOnly()
	p.Egress = policy.Direction{Isolated: true, Policies: []string{"test/out"}}
	r.push(t, p)
	start := time.Now()
	wantTCP(t, "peer in", r.allowed.NS, r.pod.IP(4), tcpPort, false)
	wantUDP(t, "peer in", r.allowed.NS, r.pod.IP(6), udpPort, false)
	wantTCP(t, "pod out", r.pod.NS, r.allowed.IP(4), tcpPort2, false)
	gen := r.status(t).Policy.Generation
	for _, want := range []policy.Denial{
		{Direction: "ingress", Protocol: "TCP", Peer: r.allowed.IP(4), Port: tcpPort, Local: r.pod.IP(4), Policies: "test/in"},
		{Direction: "ingress", Protocol: "UDP", Peer: r.allowed.IP(6), Port: udpPort, Local: r.pod.IP(6), Policies: "test/in"},
		{Direction: "egress", Protocol: "TCP", Peer: r.allowed.IP(4), Port: tcpPort2, Local: r.pod.IP(4), Policies: "test/out"},
	} {
		d, ok := r.findDenial(t, want)
		if !ok {
			t.Errorf("no %s %s denial of %s port %d in the status: %+v", want.Direction, want.Protocol, want.Peer, want.Port, r.status(t).Policy.RecentDenials)
			continue
		}
		if d.Local != want.Local || d.Reason != "no rule admits" || d.Generation != gen || d.Time.Before(start.Add(-time.Second)) || d.Time.After(time.Now()) {
			t.Errorf("%s %s denial: got %+v, want local %s, no rule admits, generation %d, now", want.Direction, want.Protocol, d, want.Local, gen)
		}
	}

	log, err := os.ReadFile(r.att.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "network policy denied") || !strings.Contains(string(log), r.allowed.IP(4).String()) {
		t.Errorf("the stack's log has no denial of %s:\n%s", r.allowed.IP(4), log)
	}

	bin := filepath.Join(r.env.BinDir, "cni-usernet")
	stateDir := filepath.Join(r.env.Dir, "state")
	out, err := exec.Command(bin, "denials", "--state-dir", stateDir, "-json").Output()
	if err != nil {
		t.Fatalf("cni-usernet denials -json: %v", err)
	}
	var rows []denialRow
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("cni-usernet denials -json: %v\n%s", err, out)
	}
	pod := "test/" + r.pod.ID
	if !slices.ContainsFunc(rows, func(d denialRow) bool {
		return d.Pod == pod && d.ContainerID == r.pod.ID && d.Direction == "ingress" && d.Peer == r.allowed.IP(4) && d.Port == tcpPort
	}) {
		t.Errorf("cni-usernet denials -json lists no ingress denial of %s for %s:\n%s", r.allowed.IP(4), pod, out)
	}
	for i := 1; i < len(rows); i++ {
		if rows[i].Time.Before(rows[i-1].Time) {
			t.Errorf("cni-usernet denials -json: row %d before row %d", i, i-1)
		}
	}
	out, err = exec.Command(bin, "denials", "--state-dir", stateDir, "--pod", pod).Output()
	if err != nil {
		t.Fatalf("cni-usernet denials: %v", err)
	}
	line := fmt.Sprintf("%s  EGRESS", pod)
	if !strings.HasPrefix(string(out), "TIME ") || !strings.Contains(string(out), line) || !strings.Contains(string(out), r.allowed.IP(6).String()) {
		t.Errorf("cni-usernet denials: no line with %q and %s:\n%s", line, r.allowed.IP(6), out)
	}
}

// rawTCP opens a raw TCP socket in netns: it receives every TCP segment
// for the namespace's addresses and sends segments the test builds, under
// an IP header the kernel adds.
func rawTCP(t *testing.T, netns ns.NetNS) int {
	t.Helper()
	var fd int
	err := nettest.In(netns, func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	// The socket sees every TCP segment to the peer, a flood's SYN-ACKs
	// among them: with the default buffer those fill it and the one
	// segment a test waits for is dropped before it is read.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20); err != nil {
		t.Fatal(err)
	}
	return fd
}

// drain discards what fd has queued, so that a wait that follows reads
// what came after it.
func drain(fd int) {
	buf := make([]byte, 2048)
	for {
		if _, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT); err != nil {
			return
		}
	}
}

func sendSegment(fd int, src, dst netip.Addr, sport, dport uint16, seq, ack uint32, flags header.TCPFlags) error {
	b := make([]byte, header.TCPMinimumSize)
	h := header.TCP(b)
	h.Encode(&header.TCPFields{SrcPort: sport, DstPort: dport, SeqNum: seq, AckNum: ack, DataOffset: header.TCPMinimumSize,
		Flags: flags, WindowSize: 64240})
	sum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, tcpip.AddrFrom4(src.As4()), tcpip.AddrFrom4(dst.As4()), uint16(len(b)))
	h.SetChecksum(^h.CalculateChecksum(sum))
	return unix.Sendto(fd, b, 0, &unix.SockaddrInet4{Addr: dst.As4()})
}

// awaitSegment returns the first segment from from:fport to port dport
// that reaches fd within wait.
func awaitSegment(fd int, from netip.Addr, fport, dport uint16, wait time.Duration) (header.TCP, bool) {
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); {
		n, sa, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			continue // the receive timeout: look at the clock
		}
		a, ok := sa.(*unix.SockaddrInet4)
		if !ok || netip.AddrFrom4(a.Addr) != from || n < header.IPv4MinimumSize {
			continue
		}
		seg := header.TCP(buf[header.IPv4(buf[:n]).HeaderLength():n])
		if len(seg) >= header.TCPMinimumSize && seg.SourcePort() == fport && seg.DestinationPort() == dport {
			return append(header.TCP(nil), seg...), true
		}
	}
	return nil, false
}

// TestCookieHandshakeDenied: a peer whose handshake completes through a
// SYN cookie after the policy came to deny it (its SYN was answered while
// it was let in) never reaches the application and gets nothing back.
// The peer floods the mirrored listener's backlog with half-open
// handshakes first, from its own address (its kernel's RSTs to the
// SYN-ACKs dropped), so that the stack answers with cookies.
func TestCookieHandshakeDenied(t *testing.T) {
	r := newRig(t)
	const port = 7070
	peer, pod := r.allowed.IP(4), r.pod.IP(4)
	r.push(t, r.ingressOnly(policy.Rule{Policy: "test/in", Peers: []policy.Peer{{CIDR: hostCIDR(peer)}}}))

	var (
		mu       sync.Mutex
		accepted []netip.AddrPort
	)
	ln := nettest.Listen(t, r.pod.NS, "tcp4", fmt.Sprint(":", port))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, c.RemoteAddr().(*net.TCPAddr).AddrPort())
			mu.Unlock()
			c.Close()
		}
	}()
	// A first connection has the stack mirror the new listener.
	mirrored := r.status(t).Relay.TCPMirrored
	if err := tcpEcho(r.allowed.NS, pod, tcpPort, allowWait); err != nil {
		t.Fatal(err)
	}
	if c, err := nettest.Dial(r.allowed.NS, "tcp4", nettest.HostPort(pod, port), allowWait); err == nil {
		c.Close()
	}
	for deadline := time.Now().Add(5 * time.Second); r.status(t).Relay.TCPMirrored <= mirrored; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stack did not mirror the new listener")
		}
	}

	script := fmt.Sprintf("table inet noreset { chain out { type filter hook output priority 0; ip daddr %s tcp flags rst drop; }; }", pod)
	cmd := exec.Command("nsenter", "--net="+r.allowed.NS.Path(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dropping the peer's RSTs: %v: %s", err, out)
	}
	fd := rawTCP(t, r.allowed.NS)
	for i := range 1200 {
		if err := sendSegment(fd, peer, pod, uint16(30000+i), port, uint32(i)<<20, 0, header.TCPFlagSyn); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st := r.status(t)
		if st.Wire.SynCookiesSent > 0 || st.Relay.TCPCookieFast > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the listener's backlog never overflowed into SYN cookies (wire %+v)", st.Wire)
		}
	}

	const sport, isn = 45000, 777000
	var (
		synAck header.TCP
		ok     bool
	)
	// A SYN-ACK can still be lost on a loaded machine (the peer's kernel
	// queue, not the policy): the peer resends its SYN as a client would.
	for try := 0; try < 3 && !ok; try++ {
		drain(fd)
		if err := sendSegment(fd, peer, pod, sport, port, isn, 0, header.TCPFlagSyn); err != nil {
			t.Fatal(err)
		}
		synAck, ok = awaitSegment(fd, pod, port, sport, allowWait)
	}
	if !ok || synAck.Flags() != header.TCPFlagSyn|header.TCPFlagAck || synAck.AckNumber() != isn+1 {
		st := r.status(t)
		t.Fatalf("no SYN-ACK for the peer's SYN: %v (wire %+v, relay %+v)", synAck, st.Wire, st.Relay)
	}
	denied := r.status(t).Policy.Denied.Ingress["test/in"]
	validBefore := r.status(t).Wire.SynCookiesValid
	r.push(t, r.ingressOnly())
	if err := sendSegment(fd, peer, pod, sport, port, isn+1, synAck.SequenceNumber()+1, header.TCPFlagAck); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); r.status(t).Policy.Denied.Ingress["test/in"] == denied; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no denial of the completed handshake (completed with a cookie: %d)", r.status(t).Wire.SynCookiesValid-validBefore)
		}
	}
	if got, ok := awaitSegment(fd, pod, port, sport, blockWait); ok {
		t.Errorf("the denied peer got a segment back: %s", got.Flags())
	}
	if n := r.status(t).Wire.SynCookiesValid - validBefore; n != 1 {
		t.Errorf("handshakes completed with a cookie: got %d, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if i := slices.Index(accepted, netip.AddrPortFrom(peer, sport)); i >= 0 {
		t.Errorf("the application accepted the denied peer's connection (%v)", accepted)
	}
	if d, ok := r.findDenial(t, policy.Denial{Direction: "ingress", Protocol: "TCP", Peer: peer, Port: port, Policies: "test/in"}); !ok || d.Local != pod {
		t.Errorf("the denial's record: got %+v (found %v)", d, ok)
	}
}
