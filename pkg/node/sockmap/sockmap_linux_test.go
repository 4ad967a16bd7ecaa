package sockmap

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
)

// rig is the node's redirect loaded under a pin root of the test's own,
// and a network namespace standing in for a pod.
type rig struct {
	t      *testing.T
	root   string
	node   *Node
	netns  ns.NetNS
	cookie uint64
}

func newRig(t *testing.T, enable bool) *rig {
	return newRigBoth(t, enable, false)
}

func newRigBoth(t *testing.T, enable, both bool) *rig {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs")
	}
	root := filepath.Join("/sys/fs/bpf", fmt.Sprintf("cni-usernet-test-%d", os.Getpid()))
	// A load that fails halfway leaves the root behind; this removes it
	// (after the unload below, which checks its own error).
	t.Cleanup(func() { os.RemoveAll(root) })
	node, err := Load(root, filepath.Join(t.TempDir(), "lock"))
	if errors.Is(err, ErrUnsupported) {
		// A kernel with what Check looks for (the newest of the needs)
		// has the helpers too: a program it refuses is the verifier
		// refusing a program of ours, not a kernel that cannot.
		if _, cerr := Check(); cerr == nil && strings.Contains(err.Error(), "loading the ") {
			t.Fatalf("the kernel passes Check but refuses a program: %v", err)
		}
		t.Skipf("this kernel cannot: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		node.Close()
		if err := Unload(root); err != nil {
			t.Errorf("unloading: %v", err)
		}
	})
	netns, cookie := newPodNS(t)
	r := &rig{t: t, root: root, node: node, netns: netns, cookie: cookie}
	if enable {
		if err := node.Enable(cookie, both); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// newPodNS is a network namespace standing in for a pod, lo up, and its
// cookie.
func newPodNS(t *testing.T) (ns.NetNS, uint64) {
	t.Helper()
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		netns.Close()
		testutils.UnmountNS(netns)
	})
	if err := netns.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		t.Fatal(err)
	}
	cookie, err := NetnsCookie(netns.Path())
	if err != nil {
		t.Fatal(err)
	}
	return netns, cookie
}

// markStack gives a socket the stack's relay mark.
func markStack(network, address string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, podnet.StackSocketMark)
	}); err != nil {
		return err
	}
	return serr
}

// pair opens a listener and a connection to it in the pod's namespace:
// the client is an application's socket, the server the stack's.
func (r *rig) pair(network, addr string) (client, server *net.TCPConn) {
	return r.pairOf(network, addr, true)
}

// appPair is a connection between two of the pod's applications.
func (r *rig) appPair(network, addr string) (client, server *net.TCPConn) {
	return r.pairOf(network, addr, false)
}

func (r *rig) pairOf(network, addr string, stackServer bool) (client, server *net.TCPConn) {
	r.t.Helper()
	err := r.netns.Do(func(ns.NetNS) error {
		var lc net.ListenConfig
		if stackServer {
			lc.Control = markStack
		}
		ln, err := lc.Listen(context.Background(), network, addr)
		if err != nil {
			return err
		}
		defer ln.Close()
		dial, to := network, ln.Addr().String()
		if network == "tcp" {
			// A dual-stack listener's IPv4 peer: its socket is IPv6,
			// the address mapped, the peer's IPv4.
			dial, to = "tcp4", fmt.Sprintf("127.0.0.1:%d", ln.Addr().(*net.TCPAddr).Port)
		}
		c, err := net.Dial(dial, to)
		if err != nil {
			return err
		}
		s, err := ln.Accept()
		if err != nil {
			c.Close()
			return err
		}
		client, server = c.(*net.TCPConn), s.(*net.TCPConn)
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func (r *rig) stats() Stats {
	r.t.Helper()
	s, err := r.node.Stats(r.cookie)
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

// pingPong sends n numbered messages each way, one round trip at a time,
// and checks every answer is the one sent.
func pingPong(t *testing.T, client, server net.Conn, n, size int) {
	t.Helper()
	errs := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for range n {
			if _, err := io.ReadFull(server, buf); err != nil {
				errs <- err
				return
			}
			if _, err := server.Write(buf); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	out, in := make([]byte, size), make([]byte, size)
	for i := range n {
		binary.LittleEndian.PutUint64(out, uint64(i))
		if _, err := client.Write(out); err != nil {
			t.Fatalf("round trip %d: %v", i, err)
		}
		if _, err := io.ReadFull(client, in); err != nil {
			t.Fatalf("round trip %d: %v", i, err)
		}
		if !bytes.Equal(in, out) {
			t.Fatalf("round trip %d: got %x, want %x", i, in[:8], out[:8])
		}
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// TestRedirectKeepsOrder: what an application sends to the stack, IPv4,
// IPv6, and IPv4 to a dual-stack socket, goes through the redirect, what the stack answers through
// TCP, and both arrive whole and in order.
func TestRedirectKeepsOrder(t *testing.T) {
	r := newRig(t, true)
	for _, c := range []struct{ network, addr string }{{"tcp4", "127.0.0.1:0"}, {"tcp6", "[::1]:0"}, {"tcp", ":0"}} {
		before := r.stats().Redirected
		client, server := r.pair(c.network, c.addr)
		pingPong(t, client, server, 2000, 100)
		s := r.stats()
		if got := s.Redirected - before; got != 2000 {
			t.Errorf("%s: %d messages redirected, want the application's 2000, not the stack's", c.network, got)
		}
		if s.Sockets < 2 {
			t.Errorf("%s: %d sockets in the hash, want the pair", c.network, s.Sockets)
		}
	}
}

// TestBothWays: with the pod's word that its applications never read
// with splice, the stack's answers are redirected too, and a reader
// that does not read bounds the stack as it bounds an application.
func TestBothWays(t *testing.T) {
	r := newRigBoth(t, true, true)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	pingPong(t, client, server, 2000, 100)
	if s := r.stats(); s.Redirected != 4000 {
		t.Fatalf("stats %+v: want all 4000 messages redirected, both ways", s)
	}
	// The stack (server) writes to an application (client) that does not
	// read.
	writeToNonReader(t, server, client)
	// Two applications still keep TCP.
	before := r.stats().Redirected
	c2, s2 := r.appPair("tcp4", "127.0.0.1:0")
	pingPong(t, c2, s2, 100, 64)
	if after := r.stats().Redirected; after != before {
		t.Errorf("%d messages between applications redirected", after-before)
	}
}

// TestPodsWithTheSameTuples: two pods whose connections have the same
// addresses and ports (each pod's own loopback) share the node's socket
// hash without meeting: each pod's messages reach only its own stack.
func TestPodsWithTheSameTuples(t *testing.T) {
	r := newRig(t, true)
	otherNS, other := newPodNS(t)
	if err := r.node.Enable(other, false); err != nil {
		t.Fatal(err)
	}
	fixedPair := func(netns ns.NetNS) (client, server net.Conn) {
		t.Helper()
		err := netns.Do(func(ns.NetNS) error {
			lc := net.ListenConfig{Control: markStack}
			ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:7000")
			if err != nil {
				return err
			}
			defer ln.Close()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7001}}
			if client, err = d.Dial("tcp4", "127.0.0.1:7000"); err != nil {
				return err
			}
			server, err = ln.Accept()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close(); server.Close() })
		return client, server
	}
	c1, s1 := fixedPair(r.netns)
	c2, s2 := fixedPair(otherNS)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pingPong(t, c2, s2, 1000, 64)
	}()
	pingPong(t, c1, s1, 1000, 100)
	<-done
	for _, cookie := range []uint64{r.cookie, other} {
		if s, err := r.node.Stats(cookie); err != nil || s.Redirected != 1000 {
			t.Errorf("pod %d: stats %+v, %v: want its application's 1000 messages redirected", cookie, s, err)
		}
	}
}

// TestPodCapKeepsOthers: a pod that opens connections without end fills
// only its own share of the node's socket hash; its sockets beyond are
// left out (and keep TCP), and another pod's still redirect.
func TestPodCapKeepsOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("opens MaxSocketsPerPod sockets")
	}
	r := newRig(t, true)
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	err := r.netns.Do(func(ns.NetNS) error {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		for range MaxSocketsPerPod/2 + 8 {
			c, err := net.Dial("tcp4", ln.Addr().String())
			if err != nil {
				return err
			}
			s, err := ln.Accept()
			if err != nil {
				c.Close()
				return err
			}
			conns = append(conns, c, s)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if s := r.stats(); s.Sockets != MaxSocketsPerPod || s.Refused == 0 {
		t.Fatalf("stats %+v: want the pod at its cap of %d sockets, the rest refused", s, MaxSocketsPerPod)
	}
	otherNS, other := newPodNS(t)
	if err := r.node.Enable(other, false); err != nil {
		t.Fatal(err)
	}
	o := &rig{t: t, root: r.root, node: r.node, netns: otherNS, cookie: other}
	client, server := o.pair("tcp4", "127.0.0.1:0")
	pingPong(t, client, server, 100, 64)
	if s := o.stats(); s.Redirected != 100 {
		t.Errorf("the other pod: stats %+v, want its application's 100 messages redirected", s)
	}
}

// TestApplicationsKeepTCP: a connection between two of the pod's
// applications is never redirected: either may read with splice, which
// does not see a redirect's queue.
func TestApplicationsKeepTCP(t *testing.T) {
	r := newRig(t, true)
	client, server := r.appPair("tcp4", "127.0.0.1:0")
	pingPong(t, client, server, 200, 100)
	if s := r.stats(); s.Redirected != 0 {
		t.Fatalf("stats %+v: messages between applications redirected", s)
	}
}

// TestStackToSpliceReader: an application that reads the stack's
// answers with splice (Go's io.Copy from a TCP connection into a pipe)
// gets every byte: the stack's side is never redirected.
func TestStackToSpliceReader(t *testing.T) {
	r := newRig(t, true)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(pw, client) // splice(2) from the socket
		pw.Close()
		done <- err
	}()
	msg := bytes.Repeat([]byte("answer "), 10000)
	if _, err := server.Write(msg); err != nil {
		t.Fatal(err)
	}
	server.CloseWrite()
	got, err := io.ReadAll(pr)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("spliced %d bytes, %v; want the %d sent", len(got), err, len(msg))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestNotEnabledKeepsTCP: a namespace not enabled (the per-pod opt-out)
// keeps the loopback TCP.
func TestNotEnabledKeepsTCP(t *testing.T) {
	r := newRig(t, false)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	pingPong(t, client, server, 200, 100)
	if _, err := r.node.Stats(r.cookie); !IsNotEnabled(err) {
		t.Fatalf("stats of a namespace never enabled: got %v, want not enabled", err)
	}
}

// stream writes numbered 8-byte words (each its offset) until stop is
// closed or a write fails; it returns how many bytes it wrote. A write
// may end anywhere in a word: the next one starts with the word's rest.
func stream(w net.Conn, stop <-chan struct{}) (int64, error) {
	buf := make([]byte, 64<<10+8)
	var sent int64
	for {
		select {
		case <-stop:
			return sent, nil
		default:
		}
		start := sent &^ 7
		for i := 0; i+8 <= len(buf); i += 8 {
			binary.LittleEndian.PutUint64(buf[i:], uint64(start)+uint64(i))
		}
		w.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := w.Write(buf[sent-start : sent-start+64<<10])
		sent += int64(n)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return sent, err
		}
	}
}

// readAll reads r to EOF, checks every whole 8-byte word is its offset,
// and returns how many bytes it read.
func readAll(t *testing.T, r io.Reader) int64 {
	t.Helper()
	var got int64
	buf := make([]byte, 1<<20)
	var carry []byte
	for {
		n, err := r.Read(buf)
		data := append(carry, buf[:n]...)
		k := len(data) / 8 * 8
		for i := 0; i < k; i += 8 {
			if w := binary.LittleEndian.Uint64(data[i:]); w != uint64(got) {
				t.Fatalf("at offset %d: got word %d: out of order", got, w)
			}
			got += 8
		}
		carry = append([]byte(nil), data[k:]...)
		if err == io.EOF {
			return got + int64(len(carry))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestSlowReaderBounded: a writer facing a reader that does not read
// gets Budget (and a message) through the redirect, then TCP's window
// holds it, and the reader then reads every byte in order.
func TestSlowReaderBounded(t *testing.T) {
	r := newRig(t, true)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	server.SetReadBuffer(256 << 10)
	client.SetWriteBuffer(256 << 10)
	writeToNonReader(t, client, server)
	if s := r.stats(); s.Fallbacks == 0 {
		t.Errorf("stats %+v: the writer never went through TCP", s)
	}
}

// writeToNonReader has w write for a second to r, which does not read
// meanwhile, bounds what w got out, then reads it all back in order.
func writeToNonReader(t *testing.T, w, r *net.TCPConn) {
	t.Helper()
	stop := make(chan struct{})
	sent := make(chan int64, 1)
	go func() {
		n, _ := stream(w, stop)
		w.CloseWrite()
		sent <- n
	}()
	time.Sleep(time.Second)
	close(stop)
	n := <-sent
	// What the kernel held for the reader: the redirect's budget, a
	// message past it, and TCP's buffers (each side's, autotuned up to
	// tcp_rmem/tcp_wmem's maximum); without the bound a writer gets
	// gigabytes through in a second.
	if limit := int64(Budget + 64<<10 + 16<<20); n > limit {
		t.Fatalf("the writer got %d bytes out to a reader that does not read, want at most %d", n, limit)
	}
	if got := readAll(t, r); got != n {
		t.Fatalf("read %d bytes back, want the %d sent", got, n)
	}
}

// TestHalfClose: a FIN after redirected data arrives after that data, and
// the other direction still works.
func TestHalfClose(t *testing.T) {
	r := newRig(t, true)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	halfClose(t, client, server)
	if r.stats().Redirected == 0 {
		t.Error("nothing was redirected")
	}
}

// halfClose has client send a request and close its side; server reads
// it whole, then EOF, and answers (answerAndClose).
func halfClose(t *testing.T, client, server *net.TCPConn) {
	t.Helper()
	msg := bytes.Repeat([]byte("request "), 1000)
	if _, err := client.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := client.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(server)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("server read %d bytes, %v; want the %d sent, then EOF", len(got), err, len(msg))
	}
	answerAndClose(t, client, server)
}

// answerAndClose has server answer and close its side; client reads the
// answer, then EOF.
func answerAndClose(t *testing.T, client, server *net.TCPConn) {
	t.Helper()
	if _, err := server.Write([]byte("answer")); err != nil {
		t.Fatal(err)
	}
	server.CloseWrite()
	ans, err := io.ReadAll(client)
	if err != nil || string(ans) != "answer" {
		t.Fatalf("client read %q, %v; want the answer, then EOF", ans, err)
	}
}

// TestReset: a peer that closes with unread data resets the connection,
// as TCP does.
func TestReset(t *testing.T) {
	r := newRig(t, true)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	resetByServer(t, client, server)
}

// resetByServer has the server close with data unread, and wants the
// client's next read to see the reset.
func resetByServer(t *testing.T, client, server *net.TCPConn) {
	t.Helper()
	pingPong(t, client, server, 10, 64)
	if _, err := client.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	server.SetLinger(0)
	server.Close()
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := client.Read(make([]byte, 10))
	if !errors.Is(err, syscall.ECONNRESET) && err != io.EOF {
		t.Fatalf("read after the peer's reset: got %v, want ECONNRESET (or EOF)", err)
	}
}

// TestCaptureSwitchesToTCP: with the capture flag on, a redirecting
// connection goes through TCP, without reordering what was in flight.
func TestCaptureSwitchesToTCP(t *testing.T) {
	r := newRig(t, true)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	stop := make(chan struct{})
	sent := make(chan int64, 1)
	go func() {
		n, _ := stream(client, stop)
		client.CloseWrite()
		sent <- n
	}()
	got := make(chan int64, 1)
	go func() { got <- readAll(t, server) }()
	time.Sleep(100 * time.Millisecond)
	if err := r.node.SetCapture(r.cookie, true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	if n, g := <-sent, <-got; g != n {
		t.Fatalf("read %d bytes, want the %d sent", g, n)
	}
	if s := r.stats(); !s.Capture || s.Fallbacks == 0 {
		t.Errorf("stats %+v: want the capture flag and the writer on TCP", s)
	}
	// A new connection during the capture never redirects.
	before := r.stats().Redirected
	c2, s2 := r.pair("tcp4", "127.0.0.1:0")
	pingPong(t, c2, s2, 50, 64)
	if after := r.stats().Redirected; after != before {
		t.Errorf("%d messages redirected during a capture, want none", after-before)
	}
}

// TestDisableTakesPodOut: a disabled namespace's connections go through
// TCP from their next message, and keep working.
func TestDisableTakesPodOut(t *testing.T) {
	r := newRig(t, true)
	client, server := r.pair("tcp4", "127.0.0.1:0")
	pingPong(t, client, server, 100, 64)
	if err := r.node.Disable(r.cookie); err != nil {
		t.Fatal(err)
	}
	pingPong(t, client, server, 100, 64)
	if err := r.node.Disable(r.cookie); err != nil {
		t.Fatalf("a second Disable: %v", err)
	}
}

// TestLayoutNeedsMsgTotLen: a kernel whose psock does not count its
// unread bytes cannot bound a reader, and is refused.
func TestLayoutNeedsMsgTotLen(t *testing.T) {
	u32 := &btf.Int{Name: "u32", Size: 4}
	ptr := &btf.Pointer{Target: &btf.Void{}}
	var b btf.Builder
	for _, typ := range []btf.Type{
		&btf.Struct{Name: "sock", Size: 16, Members: []btf.Member{{Name: "sk_user_data", Type: ptr, Offset: 64}}},
		&btf.Struct{Name: "sk_psock", Size: 8, Members: []btf.Member{{Name: "ingress_bytes", Type: u32, Offset: 0}}},
		&btf.Func{Name: "bpf_rdonly_cast", Type: &btf.FuncProto{Return: ptr}, Linkage: btf.GlobalFunc},
	} {
		if _, err := b.Add(typ); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := b.Marshal(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := btf.LoadSpecFromReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := layoutIn(spec); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("layout of a kernel without msg_tot_len: got %v, want ErrUnsupported", err)
	}
}
