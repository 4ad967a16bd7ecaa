package nettest

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Serve accepts connections on ln until it is closed and runs handle on
// each in its own goroutine, closing the connection afterwards.
func Serve(ln net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// Echo is a Serve handler that sends back what it reads.
func Echo(c net.Conn) { io.Copy(c, c) }

// HTTPClient makes requests from netns, one connection each.
func HTTPClient(netns ns.NetNS, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return Dial(netns, network, addr, 5*time.Second)
			},
		},
	}
}

// ServeRemoteAddr answers every HTTP request on ln with the peer address
// it saw, until the test ends.
func ServeRemoteAddr(t testing.TB, ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.RemoteAddr)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// GetPeer asks a ServeRemoteAddr server at to:port, from netns, which
// address it saw the request come from.
func GetPeer(t testing.TB, from ns.NetNS, to netip.Addr, port int) netip.Addr {
	t.Helper()
	resp, err := HTTPClient(from, 10*time.Second).Get("http://" + HostPort(to, port) + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", to, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	ap, err := netip.ParseAddrPort(string(body))
	if err != nil {
		t.Fatalf("server answered %q: %v", body, err)
	}
	return ap.Addr().Unmap()
}

// PingBothWays pings the pod's IPv4 and IPv6 addresses from node and the
// pod's gateways from the pod, two echoes each, with iputils ping.
func PingBothWays(t testing.TB, node ns.NetNS, pod *Pod) {
	t.Helper()
	if _, err := exec.LookPath("ping"); err != nil {
		t.Fatal("ping not installed (iputils-ping)")
	}
	for _, c := range []struct {
		name string
		from ns.NetNS
		to   netip.Addr
	}{
		{"node→pod", node, pod.IP(4)}, {"pod→node", pod.NS, pod.Gateway(4)},
		{"node→pod v6", node, pod.IP(6)}, {"pod→node v6", pod.NS, pod.Gateway(6)},
	} {
		out, err := exec.Command("nsenter", "--net="+c.from.Path(), "ping", "-c", "2", "-i", "0.2", "-W", "2", c.to.String()).CombinedOutput()
		if err != nil {
			t.Errorf("%s: ping %s: %v\n%s", c.name, c.to, err, out)
		}
	}
}

// Pattern is a deterministic stream of pseudo-random bytes: a 1 MiB block
// repeated, cheap to produce at several Gbit/s.
func Pattern(seed uint64) []byte {
	b := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(seed, seed))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// SendHashed writes n bytes of Pattern(seed) to w, at most rate bytes
// per second when rate > 0, and returns their SHA-256.
func SendHashed(w io.Writer, n int64, seed uint64, rate int64) ([32]byte, error) {
	block := Pattern(seed)
	h := sha256.New()
	start := time.Now()
	for sent := int64(0); sent < n; {
		if rate > 0 {
			if ahead := time.Duration(float64(sent)/float64(rate)*float64(time.Second)) - time.Since(start); ahead > 0 {
				time.Sleep(ahead)
			}
		}
		chunk := block[:min(int64(len(block)), n-sent)]
		if _, err := w.Write(chunk); err != nil {
			return [32]byte{}, fmt.Errorf("writing at %d: %w", sent, err)
		}
		h.Write(chunk)
		sent += int64(len(chunk))
	}
	return [32]byte(h.Sum(nil)), nil
}

// ReceiveHashed reads r to its end and returns how many bytes it read and
// their SHA-256.
func ReceiveHashed(r io.Reader) (int64, [32]byte, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return n, [32]byte(h.Sum(nil)), err
}

// Transfer is one hashed TCP transfer between two namespaces.
type Transfer struct {
	// Server and Client are the namespaces of the listener and the dialer.
	Server, Client ns.NetNS
	// Addr and Port are where the server listens (in Server).
	Addr netip.Addr
	Port int
	// Bytes is how much is sent.
	Bytes int64
	// ServerSends: the server sends and the client receives; false: the
	// client sends.
	ServerSends bool
	// Rate caps the sender at this many bytes per second. Zero: as fast
	// as it can.
	Rate int64
	// Timeout bounds the whole transfer. Zero: 3 minutes.
	Timeout time.Duration
}

// Run moves the bytes and compares what was sent with what arrived, by
// count and hash.
func (x Transfer) Run() error {
	timeout := x.Timeout
	if timeout == 0 {
		timeout = 3 * time.Minute
	}
	deadline := time.Now().Add(timeout)
	var ln net.Listener
	err := In(x.Server, func() (err error) {
		ln, err = net.Listen("tcp", HostPort(x.Addr, x.Port))
		return err
	})
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	defer ln.Close()
	type res struct {
		sum [32]byte
		n   int64
		err error
	}
	// send and receive are one side's part; the sender closes its write
	// side so that the receiver sees the end.
	part := func(c net.Conn, sends bool) res {
		if sends {
			sum, err := SendHashed(c, x.Bytes, 7, x.Rate)
			if err == nil {
				err = c.(*net.TCPConn).CloseWrite()
			}
			return res{sum: sum, n: x.Bytes, err: err}
		}
		n, sum, err := ReceiveHashed(c)
		return res{sum: sum, n: n, err: err}
	}
	srvDone := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srvDone <- res{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(deadline)
		srvDone <- part(c, x.ServerSends)
	}()
	c, err := Dial(x.Client, "tcp", HostPort(x.Addr, x.Port), 5*time.Second)
	if err != nil {
		ln.Close()
		<-srvDone
		return fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	c.SetDeadline(deadline)
	local := part(c, !x.ServerSends)
	if local.err != nil {
		// Unblock the server's side.
		c.Close()
	}
	remote := <-srvDone
	if local.err != nil || remote.err != nil {
		return fmt.Errorf("transfer errors: client %v, server %v", local.err, remote.err)
	}
	if local.n != x.Bytes || remote.n != x.Bytes {
		return fmt.Errorf("moved %d and %d bytes, want %d", local.n, remote.n, x.Bytes)
	}
	if local.sum != remote.sum {
		return fmt.Errorf("hash mismatch: %x vs %x", local.sum[:8], remote.sum[:8])
	}
	return nil
}
