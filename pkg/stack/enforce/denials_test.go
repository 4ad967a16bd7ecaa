package enforce_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
)

// recordingHandler keeps the records logged through it.
type recordingHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}

func (h *recordingHandler) attrs(i int) map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := map[string]string{"msg": h.recs[i].Message}
	h.recs[i].Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	return m
}

func closedEnforcer(t *testing.T) *enforce.Enforcer {
	t.Helper()
	e, err := enforce.NewEnforcer(&policy.PodPolicy{Version: policy.FormatVersion, Generation: 7,
		Ingress: isolated(policy.Rule{Policy: "ns/a", Peers: []policy.Peer{peer("10.1.0.0/16")}}),
		Egress:  policy.Direction{Isolated: true, Policies: []string{"ns/out"}}})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestRecentDenials: the status keeps the last RecentDenials denials,
// oldest first, each with what was denied, where and why; allowed flows
// leave no record.
func TestRecentDenials(t *testing.T) {
	e := closedEnforcer(t)
	if st := e.Status(); st.RecentDenials != nil {
		t.Fatalf("recent denials before any: %+v", st.RecentDenials)
	}
	in := e.For(policy.Ingress)
	local := addr("10.0.0.2")
	const n = policy.RecentDenials + 10
	start := time.Now()
	for i := range n {
		if in.CheckFlow(policy.Flow{Dir: policy.Ingress, Proto: policy.ProtoTCP, Peer: addr("10.9.0.1"), Port: uint16(1000 + i), Local: local}) {
			t.Fatal("denied peer allowed")
		}
		if !in.CheckFlow(policy.Flow{Dir: policy.Ingress, Proto: policy.ProtoTCP, Peer: addr("10.1.2.3"), Port: 80, Local: local}) {
			t.Fatal("allowed peer denied")
		}
	}
	e.For(policy.Egress).Deny(policy.Flow{Dir: policy.Egress, Proto: policy.ProtoUDP, Peer: addr("10.96.0.10"), Port: 53, Local: local}, policy.NoAllowedBackend)
	e.For(policy.Egress).CheckFlow(policy.Flow{Dir: policy.Egress, Proto: policy.ProtoICMPv6, Peer: addr("fd00::9"), Local: addr("fd00::2")})

	st := e.Status()
	got := st.RecentDenials
	if len(got) != policy.RecentDenials {
		t.Fatalf("recent denials: got %d, want %d", len(got), policy.RecentDenials)
	}
	// The oldest kept is the one RecentDenials before the last.
	for i, d := range got[:len(got)-2] {
		want := uint16(1000 + n - (policy.RecentDenials - 2) + i)
		if d.Port != want || d.Direction != "ingress" || d.Protocol != "TCP" || d.Peer != addr("10.9.0.1") || d.Local != local ||
			d.Policies != "ns/a,ns/b" || d.Reason != "no rule admits" || d.Generation != 7 {
			t.Fatalf("denial %d: got %+v, want port %d from 10.9.0.1 to 10.0.0.2, ingress TCP, ns/a,ns/b, no rule admits, generation 7", i, d, want)
		}
		if i > 0 && d.Time.Before(got[i-1].Time) || d.Time.Before(start) {
			t.Fatalf("denial %d at %s: out of order", i, d.Time)
		}
	}
	if d := got[len(got)-2]; d.Direction != "egress" || d.Protocol != "UDP" || d.Peer != addr("10.96.0.10") || d.Port != 53 ||
		d.Policies != "ns/out" || d.Reason != "no allowed backend" {
		t.Errorf("Service denial: got %+v", d)
	}
	if d := got[len(got)-1]; d.Protocol != "ICMPv6" || d.Port != 0 || d.Peer != addr("fd00::9") || d.Local != addr("fd00::2") {
		t.Errorf("ICMPv6 denial: got %+v", d)
	}
	if c := st.Denied.Ingress["ns/a,ns/b"]; c != n {
		t.Errorf("ingress denials counted: got %d, want %d", c, n)
	}

	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"recentDenials":[{"time":"`, `"direction":"egress","protocol":"ICMPv6","peer":"fd00::9","local":"fd00::2","layer":"NetworkPolicy","policies":"ns/out","reason":"no rule admits","generation":7}`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("status JSON without %s: %s", want, b)
		}
	}
}

// TestRecentDenialsKeptAcrossPolicies: a new policy keeps the denials of
// the one before, each with the generation that denied it.
func TestRecentDenialsKeptAcrossPolicies(t *testing.T) {
	e := closedEnforcer(t)
	e.For(policy.Ingress).Check(policy.Ingress, addr("10.9.0.1"), policy.ProtoUDP, 53)
	p := policy.Closed(nil)
	p.Generation = 8
	if err := e.Set(p); err != nil {
		t.Fatal(err)
	}
	e.For(policy.Ingress).Check(policy.Ingress, addr("10.9.0.1"), policy.ProtoUDP, 53)
	got := e.Status().RecentDenials
	if len(got) != 2 || got[0].Generation != 7 || got[1].Generation != 8 || got[1].Policies != "(pending)" {
		t.Fatalf("got %+v, want generation 7 then 8 (pending)", got)
	}
}

// TestDenialRecordAllocatesNothing: recording a denial costs no
// allocation once the ring exists (a flood from a denied peer denies
// every packet).
func TestDenialRecordAllocatesNothing(t *testing.T) {
	e := closedEnforcer(t)
	m := e.For(policy.Ingress)
	f := policy.Flow{Dir: policy.Ingress, Proto: policy.ProtoTCP, Peer: addr("fd00::9"), Port: 80, Local: addr("fd00::2")}
	m.CheckFlow(f)
	if n := testing.AllocsPerRun(1000, func() { m.CheckFlow(f) }); n != 0 {
		t.Errorf("allocations per denial: got %v, want 0", n)
	}
}

// TestDenialLogLines: the first denial of each key is logged with what
// was denied, up to denialLogKeys keys a window; the denials beyond are
// counted in the status.
func TestDenialLogLines(t *testing.T) {
	e := closedEnforcer(t)
	h := new(recordingHandler)
	e.SetLogger(slog.New(h))
	m := e.For(policy.Ingress)
	for i := range 25 {
		m.CheckFlow(policy.Flow{Dir: policy.Ingress, Proto: policy.ProtoTCP, Peer: addr("10.9.0.1"), Port: uint16(8000 + i), Local: addr("10.0.0.2")})
	}
	h.mu.Lock()
	lines := len(h.recs)
	h.mu.Unlock()
	// The 25 take well under a window; allow for a slow machine
	// crossing into a second one.
	if lines < 10 || lines > 20 {
		t.Fatalf("log lines for 25 denials at once: got %d, want 10 (up to 20 across two windows)", lines)
	}
	want := map[string]string{"msg": "network policy denied", "direction": "ingress", "protocol": "TCP", "peer": "10.9.0.1",
		"port": "8000", "local": "10.0.0.2", "layer": "NetworkPolicy", "policies": "ns/a,ns/b", "reason": "no rule admits", "generation": "7"}
	got := h.attrs(0)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("log line %s: got %q, want %q (%v)", k, got[k], v, got)
		}
	}
	if s := e.Status().DenialLogsSuppressed; s != uint64(25-lines) {
		t.Errorf("denialLogsSuppressed: got %d, want %d", s, 25-lines)
	}
	if n := len(e.Status().RecentDenials); n != 25 {
		t.Errorf("recent denials: got %d, want all 25 (the limit is the log's only)", n)
	}
}

// BenchmarkDeny is the verdict on a flow the policy denies, recorded in
// the ring, without and with the log (aggregated: what a flood from a
// denied peer costs per packet).
func BenchmarkDeny(b *testing.B) {
	for _, logged := range []bool{false, true} {
		name := "ring"
		if logged {
			name = "ring+log"
		}
		b.Run(name, func(b *testing.B) {
			e, err := enforce.NewEnforcer(&policy.PodPolicy{Version: policy.FormatVersion,
				Ingress: isolated(policy.Rule{Policy: "ns/a", Peers: []policy.Peer{peer("10.1.0.0/16")}})})
			if err != nil {
				b.Fatal(err)
			}
			if logged {
				e.SetLogger(slog.New(slog.DiscardHandler))
			}
			m := e.For(policy.Ingress)
			f := policy.Flow{Dir: policy.Ingress, Proto: policy.ProtoTCP, Peer: addr("10.9.0.1"), Port: 80, Local: addr("10.0.0.2")}
			b.ReportAllocs()
			for b.Loop() {
				m.CheckFlow(f)
			}
		})
	}
}

func TestEnforcer(t *testing.T) {
	open := &policy.PodPolicy{Version: policy.FormatVersion, Generation: 5}
	e, err := enforce.NewEnforcer(open)
	if err != nil {
		t.Fatal(err)
	}
	if e.For(policy.Ingress) != nil || e.For(policy.Egress) != nil {
		t.Fatal("open policy: got a matcher to ask, want none (the fast path)")
	}
	closed := policy.Closed([]netip.Addr{addr("10.0.0.1")})
	closed.Generation = 4
	if err := e.Set(closed); !errors.Is(err, policy.ErrStale) {
		t.Fatalf("older generation: got %v, want ErrStale", err)
	}
	closed.Generation = 5
	if err := e.Set(closed); err != nil {
		t.Fatalf("same generation: %v", err)
	}
	m := e.For(policy.Ingress)
	if m == nil || e.For(policy.Egress) == nil {
		t.Fatal("closed policy: no matcher to ask")
	}
	for range 3 {
		m.Check(policy.Ingress, addr("10.0.0.9"), tcp, 80)
	}
	m.Check(policy.Ingress, addr("10.0.0.1"), tcp, 80) // the node
	e.For(policy.Egress).Check(policy.Egress, addr("10.0.0.9"), udp, 53)
	bad := &policy.PodPolicy{Version: policy.FormatVersion + 1, Generation: 9}
	if err := e.Set(bad); err == nil || errors.Is(err, policy.ErrStale) {
		t.Fatalf("unknown version: got %v, want a validation error", err)
	}
	// A new policy isolated by the same policies counts on.
	next := policy.Closed(nil)
	next.Generation = 6
	next.Egress = policy.Direction{}
	if err := e.Set(next); err != nil {
		t.Fatal(err)
	}
	if e.For(policy.Egress) != nil {
		t.Error("egress no longer isolated: still a matcher to ask")
	}
	e.For(policy.Ingress).Check(policy.Ingress, addr("10.0.0.1"), tcp, 80) // no longer the node
	s := e.Status()
	if s.Generation != 6 || !s.IngressIsolated || s.EgressIsolated {
		t.Errorf("status: got %+v", s)
	}
	if got := s.Denied.Ingress["(pending)"]; got != 4 {
		t.Errorf("ingress denials: got %d, want 4", got)
	}
	if got := s.Denied.Egress["(pending)"]; got != 1 {
		t.Errorf("egress denials: got %d, want 1", got)
	}
}
