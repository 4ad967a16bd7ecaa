package cni_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

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

// roundTrips sends n lines from the node to addr and wants each back.
func roundTrips(t *testing.T, node ns.NetNS, addr string, n int) {
	t.Helper()
	c, err := nettest.Dial(node, "tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("dialing %s: %v", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
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
	c, err := nettest.Dial(node, "tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
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
