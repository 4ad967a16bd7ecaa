package cni_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/sockmap"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// echoInPod serves an echo on port in the pod's namespace, with io.Copy:
// Go splices from one TCP connection to another, as proxies do.
func echoInPod(t *testing.T, pod *nettest.Pod, port int) {
	serveInPod(t, pod, port, nettest.Echo)
}

// readEchoInPod serves an echo that reads with read(2), never splice.
func readEchoInPod(t *testing.T, pod *nettest.Pod, port int) {
	serveInPod(t, pod, port, func(c net.Conn) {
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
}

func serveInPod(t *testing.T, pod *nettest.Pod, port int, serve func(net.Conn)) {
	t.Helper()
	var ln net.Listener
	if err := pod.NS.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	nettest.Serve(ln, serve)
}

// dialFor30s connects from the namespace to addr, the connection good
// for 30 seconds.
func dialFor30s(t *testing.T, from ns.NetNS, addr string) net.Conn {
	t.Helper()
	c, err := nettest.Dial(from, "tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("dialing %s: %v", addr, err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

// roundTrips sends n lines from the node to addr and wants each back.
func roundTrips(t *testing.T, node ns.NetNS, addr string, n int) {
	t.Helper()
	c := dialFor30s(t, node, addr)
	defer c.Close()
	r := bufio.NewReader(c)
	for i := range n {
		msg := fmt.Sprintf("request %d through the stack\n", i)
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatalf("round trip %d: %v", i, err)
		}
		if got, err := r.ReadString('\n'); err != nil || got != msg {
			t.Fatalf("round trip %d: got %q (%v), want %q", i, got, err, msg)
		}
	}
}

// TestSocketRedirect: ADD puts the pod's namespace in the node's socket
// redirect, the relay's connection to the application then goes from
// socket to socket, and DEL takes the pod out again.
func TestSocketRedirect(t *testing.T) {
	env := nettest.NewEnv(t)
	pod := env.NewPod(env.Conf(latest, map[string]any{"socketRedirect": "on"}))
	att := loadState(t, env, pod.ID)
	r := att.SocketRedirect
	if r == nil {
		t.Fatal("the record says nothing of the socket redirect")
	}
	if !r.On {
		if strings.Contains(r.Reason, sockmap.ErrUnsupported.Error()) {
			t.Skipf("this kernel cannot: %s", r.Reason)
		}
		t.Fatalf("socket redirect off: %s", r.Reason)
	}
	echoInPod(t, pod, 7007)
	roundTrips(t, env.Node, fmt.Sprintf("%s:7007", pod.IP(4)), 200)
	node, err := sockmap.Open(r.BPFDir)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	s, err := node.Stats(r.NetnsCookie)
	if err != nil {
		t.Fatal(err)
	}
	// Each round trip's answer, which the application sends to the
	// stack; the stack's writes to the application stay on TCP.
	if s.Redirected < 200 {
		t.Errorf("stats %+v: want the application's 200 answers redirected", s)
	}
	var rows []struct {
		Redirect struct {
			Mode  string `json:"mode"`
			Stats *struct {
				Redirected uint64 `json:"redirected"`
			} `json:"stats"`
		} `json:"socketRedirect"`
	}
	if err := json.Unmarshal(runStatus(t, env, "--json"), &rows); err != nil || len(rows) != 1 {
		t.Fatalf("status --json: %d rows, %v", len(rows), err)
	}
	if d := rows[0].Redirect; d.Mode != "on" || d.Stats == nil || d.Stats.Redirected < 200 {
		t.Errorf("status --json's socketRedirect: %+v, want on with the counters", d)
	}
	if table := string(runStatus(t, env)); !strings.Contains(table, "REDIRECT") || !strings.Contains(table, " msgs)") {
		t.Errorf("status table without the redirect column:\n%s", table)
	}
	if err := env.Del(pod.Conf, pod.ID, pod.NS); err != nil {
		t.Fatal(err)
	}
	if _, err := node.Stats(r.NetnsCookie); !sockmap.IsNotEnabled(err) {
		t.Errorf("after DEL: got %v, want the pod out of the redirect", err)
	}
}

// TestSocketRedirectBoth: a pod whose applications never read with
// splice (the annotation's "both") gets the stack's writes to them
// redirected too.
func TestSocketRedirectBoth(t *testing.T) {
	env := nettest.NewEnv(t)
	pod := env.NewPod(env.Conf(latest, map[string]any{"runtimeConfig": map[string]any{
		"io.kubernetes.cri.pod-annotations": map[string]any{"cni-usernet.io/socket-redirect": "both"}}}))
	r := loadState(t, env, pod.ID).SocketRedirect
	if r == nil || !r.On || !r.Both {
		if r != nil && strings.Contains(r.Reason, sockmap.ErrUnsupported.Error()) {
			t.Skipf("this kernel cannot: %s", r.Reason)
		}
		t.Fatalf("record %+v: want on, both ways", r)
	}
	readEchoInPod(t, pod, 7009)
	roundTrips(t, env.Node, fmt.Sprintf("%s:7009", pod.IP(4)), 200)
	node, err := sockmap.Open(r.BPFDir)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	if s, err := node.Stats(r.NetnsCookie); err != nil || s.Redirected < 400 {
		t.Errorf("stats %+v, %v: want the 400 messages of the relay's connection redirected", s, err)
	}
}

// TestSocketRedirectOptOut: the annotation keeps a pod on loopback TCP;
// the conflist's "off" keeps every pod there whatever it asks, and loads
// nothing; by default a pod that does not ask keeps it too.
func TestSocketRedirectOptOut(t *testing.T) {
	env := nettest.NewEnv(t)
	for _, c := range []struct {
		name   string
		extra  map[string]any
		reason string
	}{
		{"annotation", map[string]any{"socketRedirect": "on", "runtimeConfig": map[string]any{
			"io.kubernetes.cri.pod-annotations": map[string]any{"cni-usernet.io/socket-redirect": "off"}}}, "annotation cni-usernet.io/socket-redirect"},
		{"conflist", map[string]any{"socketRedirect": "off", "runtimeConfig": map[string]any{
			"io.kubernetes.cri.pod-annotations": map[string]any{"cni-usernet.io/socket-redirect": "both"}}}, "conflist socketRedirect"},
		{"default", nil, "default"},
	} {
		t.Run(c.name, func(t *testing.T) {
			pod := env.NewPod(env.Conf(latest, c.extra))
			r := loadState(t, env, pod.ID).SocketRedirect
			if r == nil || r.On || r.Reason != c.reason {
				t.Fatalf("record %+v: want off by the %s", r, c.reason)
			}
			echoInPod(t, pod, 7008)
			roundTrips(t, env.Node, fmt.Sprintf("%s:7008", pod.IP(4)), 20)
			if node, err := sockmap.Open(env.BPFDir()); err == nil {
				defer node.Close()
				if cookies, _ := node.Enabled(); len(cookies) != 0 {
					t.Errorf("pods in the redirect: %v, want none", cookies)
				}
			}
		})
	}
}

// TestSocketRedirectBulkEcho: 4 MiB from the node to an io.Copy echo in
// the pod (which splices between its sockets) come back whole, while
// the node is still sending.
func TestSocketRedirectBulkEcho(t *testing.T) {
	env := nettest.NewEnv(t)
	pod := env.NewPod(env.Conf(latest, map[string]any{"socketRedirect": "on"}))
	echoInPod(t, pod, 7010)
	for _, family := range []int{4, 6} {
		bulkEcho(t, env.Node, net.JoinHostPort(pod.IP(family).String(), "7010"))
	}
	r := loadState(t, env, pod.ID).SocketRedirect
	if node, err := sockmap.Open(r.BPFDir); err == nil {
		s, _ := node.Stats(r.NetnsCookie)
		t.Logf("stats %+v", s)
		node.Close()
	}
}

func bulkEcho(t *testing.T, node ns.NetNS, addr string) {
	t.Helper()
	c := dialFor30s(t, node, addr)
	defer c.Close()
	const size = 4 << 20
	data := make([]byte, size)
	rand.Read(data)
	go func() {
		if _, err := c.Write(data); err == nil {
			c.(*net.TCPConn).CloseWrite()
		}
	}()
	start := time.Now()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("%s: after %d of %d bytes back: %v", addr, len(got), size, err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("%s: %d bytes back, not the %d sent", addr, len(got), size)
	}
	t.Logf("%s: %d bytes back in %v", addr, size, time.Since(start))
}

// TestSocketRedirectDirect: two pods of the node that say direct have
// their connections joined application socket to application socket,
// past both stacks, IPv4 and IPv6; a pod that says only both talks to
// them through the stacks; DEL forgets the pod's addresses.
func TestSocketRedirectDirect(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := func(mode string) []byte {
		return env.Conf(latest, map[string]any{"runtimeConfig": map[string]any{
			"io.kubernetes.cri.pod-annotations": map[string]any{"cni-usernet.io/socket-redirect": mode}}})
	}
	client, server, other := env.NewPod(conf("direct")), env.NewPod(conf("direct")), env.NewPod(conf("both"))
	rc, rs := loadState(t, env, client.ID).SocketRedirect, loadState(t, env, server.ID).SocketRedirect
	for _, r := range []*state.SocketRedirect{rc, rs} {
		if r == nil || !r.On || r.Both || !r.Direct {
			if r != nil && strings.Contains(r.Reason, sockmap.ErrUnsupported.Error()) {
				t.Skipf("this kernel cannot: %s", r.Reason)
			}
			t.Fatalf("record %+v: want on, direct", r)
		}
	}
	node, err := sockmap.Open(rc.BPFDir)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	stats := func(r *state.SocketRedirect) sockmap.Stats {
		t.Helper()
		s, err := node.Stats(r.NetnsCookie)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	readEchoInPod(t, server, 7011)
	for _, family := range []int{4, 6} {
		before := stats(rc).Direct
		roundTrips(t, client.NS, net.JoinHostPort(server.IP(family).String(), "7011"), 200)
		// The first request may have left before the server's socket was
		// there to join; the rest join.
		if got := stats(rc).Direct - before; got < 199 {
			t.Errorf("IPv%d: %d of the client's 200 requests went straight to the server, want all but the first at most", family, got)
		}
	}
	if s := stats(rs); s.Direct < 2*199 {
		t.Errorf("server's stats %+v: want its answers straight to the client", s)
	}
	// Pipelined requests, and a bulk echo past the budget, arrive whole
	// and in order across the join and the fallback.
	before := stats(rc).Direct
	pipelined(t, client.NS, net.JoinHostPort(server.IP(4).String(), "7011"), 300)
	if got := stats(rc).Direct - before; got == 0 {
		t.Error("no pipelined request took the shortcut")
	}
	bulkEcho(t, client.NS, net.JoinHostPort(server.IP(6).String(), "7011"))
	t.Logf("client %+v, server %+v", stats(rc), stats(rs))
	// A pod that said only both: through the stacks, both ways.
	before = stats(rs).Direct
	roundTrips(t, other.NS, net.JoinHostPort(server.IP(4).String(), "7011"), 50)
	if after := stats(rs).Direct; after != before {
		t.Errorf("the server joined %d answers to a pod that did not say direct", after-before)
	}
	// Through a Service's cluster IP, which the node translates as
	// kube-proxy does: joined too, both families.
	for _, r := range []*state.SocketRedirect{rc, rs} {
		if !r.Services {
			t.Fatalf("record %+v: want Service joins on", r)
		}
	}
	vip := [2]string{"10.198.0.10", "fd98::10"}
	nftInNode(t, env, fmt.Sprintf(`table ip svc {
	chain pre { type nat hook prerouting priority dstnat; ip daddr %s tcp dport 80 dnat to %s:7011; }
}
table ip6 svc {
	chain pre { type nat hook prerouting priority dstnat; ip6 daddr %s tcp dport 80 dnat to [%s]:7011; }
}
`, vip[0], server.IP(4), vip[1], server.IP(6)))
	for i, family := range []int{4, 6} {
		before := stats(rc).Direct
		roundTrips(t, client.NS, net.JoinHostPort(vip[i], "80"), 200)
		if got := stats(rc).Direct - before; got < 199 {
			t.Errorf("IPv%d through the Service: %d of the client's 200 requests went straight to the server, want all but the first at most", family, got)
		}
	}
	pipelined(t, client.NS, net.JoinHostPort(vip[0], "80"), 300)
	bulkEcho(t, client.NS, net.JoinHostPort(vip[1], "80"))
	// Closed, the connections take their translations with them.
	deadline := time.Now().Add(5 * time.Second)
	for stats(rc).Services != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if s := stats(rc); s.Services != 0 {
		t.Errorf("client's stats %+v: translations of closed connections still charged", s)
	}
	var rows []struct {
		Redirect struct {
			Mode string `json:"mode"`
		} `json:"socketRedirect"`
	}
	if err := json.Unmarshal(runStatus(t, env, "--json"), &rows); err != nil {
		t.Fatalf("status --json: %v", err)
	}
	direct := 0
	for _, r := range rows {
		if r.Redirect.Mode == "direct" {
			direct++
		}
	}
	if direct != 2 {
		t.Errorf("status --json: %d pods in mode direct, want 2", direct)
	}
	if table := string(runStatus(t, env)); !strings.Contains(table, "to another pod)") {
		t.Errorf("status table without the messages to another pod:\n%s", table)
	}
	if err := env.Del(client.Conf, client.ID, client.NS); err != nil {
		t.Fatal(err)
	}
	if _, err := node.Stats(rc.NetnsCookie); !sockmap.IsNotEnabled(err) {
		t.Errorf("after DEL: got %v, want the pod out of the redirect", err)
	}
	if owned := node.Owned(rc.NetnsCookie); len(owned) != 0 {
		t.Errorf("after DEL: addresses %v still name the pod", owned)
	}
	if owned := node.Owned(rs.NetnsCookie); len(owned) != 2 {
		t.Errorf("the server's addresses: %v, want its two", owned)
	}
}

// nftInNode loads nftables rules into the env's node namespace.
func nftInNode(t *testing.T, env *nettest.Env, rules string) {
	t.Helper()
	cmd := exec.Command("nsenter", "--net="+env.Node.Path(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft in the node: %v: %s", err, out)
	}
}

// pipelined sends rounds of one to eight numbered requests back to back
// to an echo at addr, then reads each round's answers, in order.
func pipelined(t *testing.T, from ns.NetNS, addr string, rounds int) {
	t.Helper()
	c := dialFor30s(t, from, addr)
	defer c.Close()
	r := bufio.NewReader(c)
	seq := 0
	for i := range rounds {
		n := 1 + i%8
		var batch strings.Builder
		for j := range n {
			fmt.Fprintf(&batch, "request %d of round %d\n", seq+j, i)
		}
		if _, err := io.WriteString(c, batch.String()); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		for j := range n {
			want := fmt.Sprintf("request %d of round %d\n", seq+j, i)
			if got, err := r.ReadString('\n'); err != nil || got != want {
				t.Fatalf("round %d: got %q (%v), want %q", i, got, err, want)
			}
		}
		seq += n
	}
}
