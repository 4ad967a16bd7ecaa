package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

func TestQuantile(t *testing.T) {
	v := []float64{5, 1, 4, 2, 3}
	if got := quantile(v, 0.5); got != 3 {
		t.Errorf("quantile 0.5: got %v, want 3", got)
	}
	if got := quantile(v, 0.99); got != 5 {
		t.Errorf("quantile 0.99: got %v, want 5", got)
	}
}

func TestCheckGSO(t *testing.T) {
	st := func(mode string, segs int) stackStatus {
		var s stackStatus
		s.GSO.Mode, s.GSO.MaxSegs = mode, segs
		return s
	}
	for _, tc := range []struct {
		cfg string
		st  stackStatus
		ok  bool
	}{
		{"usernet-hardware", st("hardware", 64), true},
		{"usernet-hardware", st("software", 64), false},
		{"usernet-auto-nooffload", st("software", 64), true},
		{"usernet-auto-nooffload", st("hardware", 64), false},
		{"usernet-segs2", st("hardware", 2), true},
		{"usernet-segs2", st("hardware", 64), false},
	} {
		if err := checkGSO(configByName(tc.cfg), tc.st); (err == nil) != tc.ok {
			t.Errorf("%s with %+v: got %v, want ok=%v", tc.cfg, tc.st.GSO, err, tc.ok)
		}
	}
}

func TestConflistKnobs(t *testing.T) {
	raw, err := configByName("usernet-auto-nooffload").conflist("/i", "/s", "/l", "/r", true)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	p := got.Plugins[0]
	if p["type"] != "cni-usernet" || p["gso"] != "auto" || p["podLinkOffloadsOff"] != true || p["stateDir"] != "/s" {
		t.Errorf("got %v, want type cni-usernet, gso auto, podLinkOffloadsOff true, stateDir /s", p)
	}
	if _, ok := p["gsoMaxSegs"]; ok {
		t.Errorf("got gsoMaxSegs in %v, want it only for the segs2 configuration", p)
	}
}

// TestRoundOrder: odd rounds keep the order, even rounds reverse it, and
// the caller's slice is left alone.
func TestRoundOrder(t *testing.T) {
	rows := []string{"kernel", "usernet-hardware", "usernet-software"}
	for r, want := range map[int][]string{
		1: {"kernel", "usernet-hardware", "usernet-software"},
		2: {"usernet-software", "usernet-hardware", "kernel"},
		3: {"kernel", "usernet-hardware", "usernet-software"},
	} {
		if got := roundOrder(rows, r); !slices.Equal(got, want) {
			t.Errorf("round %d: got %v, want %v", r, got, want)
		}
	}
	if rows[0] != "kernel" || rows[2] != "usernet-software" {
		t.Errorf("roundOrder changed its argument: %v", rows)
	}
}

// TestBenchPolicy: the policy row's conflist turns enforcement on, and its
// policy has the rules asked for, the last one letting the node through
// both ways on any port while the others do not.
func TestBenchPolicy(t *testing.T) {
	c := configByName("usernet-policy1k")
	raw, err := c.conflist("/i", "/s", "/l", "/r", true)
	if err != nil || !strings.Contains(string(raw), `"networkPolicy": true`) {
		t.Fatalf("conflist of %s: %s, %v; want networkPolicy on", c.Name, raw, err)
	}
	node := netip.MustParseAddr("10.199.0.1")
	p := benchPolicy(c.PolicyRules, []netip.Addr{node, netip.MustParseAddr("fd99::1")})
	if len(p.Ingress.Rules) != 1000 || len(p.Egress.Rules) != 1000 || len(p.Node) != 0 {
		t.Fatalf("got %d/%d rules, node %v; want 1000 each way, no node", len(p.Ingress.Rules), len(p.Egress.Rules), p.Node)
	}
	m, err := policy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []policy.Dir{policy.Ingress, policy.Egress} {
		if ok, _ := m.Allow(d, node, policy.ProtoTCP, 6379); !ok {
			t.Errorf("%s: node denied", d)
		}
		if ok, _ := m.Allow(d, netip.MustParseAddr("172.20.0.1"), policy.ProtoTCP, 6379); ok {
			t.Errorf("%s: a rule's peer allowed on another port", d)
		}
	}
}

// policySink is a stack's control source that keeps the pushed policy.
type policySink struct{ got chan *policy.PodPolicy }

func (s policySink) Healthy() error { return nil }
func (s policySink) Status() any    { return nil }
func (s policySink) SetPolicy(p *policy.PodPolicy) (uint64, error) {
	s.got <- p
	return p.Generation, nil
}

// TestStandInAgent: ADD's request to the node agent's socket gets the
// row's policy written to the pod's policy file and pushed to its stack.
func TestStandInAgent(t *testing.T) {
	b := &bench{tmp: t.TempDir()}
	c := configByName("usernet-policy1k")
	if err := b.standInAgent(c); err != nil {
		t.Fatal(err)
	}
	sink := policySink{got: make(chan *policy.PodPolicy, 1)}
	sock := filepath.Join(b.tmp, "stack.sock")
	srv, err := control.Listen(sock, sink)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	file := filepath.Join(b.tmp, "policy.json")
	body := fmt.Sprintf(`{"containerID":"c","ifName":"eth0","namespace":"bench","pod":"p","podIPs":["10.199.0.2/24"],"controlSocket":%q,"policyPath":%q}`, sock, file)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", filepath.Join(b.tmp, "run", "agent.sock"))
	}}}
	resp, err := hc.Post("http://agent/v1/policy", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(answer), `"generation": 1`) {
		t.Fatalf("agent answered %d %s", resp.StatusCode, answer)
	}
	p := <-sink.got
	if len(p.Ingress.Rules) != c.PolicyRules {
		t.Errorf("pushed %d ingress rules, want %d", len(p.Ingress.Rules), c.PolicyRules)
	}
	if f, err := policy.ReadFile(file); err != nil || !policy.Equal(f, p) {
		t.Errorf("policy file: %v, %v; want the pushed policy", f, err)
	}
}
