package stack

import (
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
)

// TestStartPolicy: a stack starts with the policy file when there is one,
// and closed but to the spec's gateways when there is none or it cannot
// be read.
func TestStartPolicy(t *testing.T) {
	spec := &podnet.Spec{Routes: []podnet.Route{
		{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gw: netip.MustParseAddr("10.1.0.1")},
		{Dst: netip.MustParsePrefix("10.9.0.0/16"), Gw: netip.MustParseAddr("10.1.0.1")},
		{Dst: netip.MustParsePrefix("::/0"), Gw: netip.MustParseAddr("fd01::1")},
		{Dst: netip.MustParsePrefix("10.1.0.0/24")},
	}}
	log := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	node, other := netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.7")

	closed := func(t *testing.T, e *enforce.Enforcer) {
		t.Helper()
		m := e.Current()
		if m.Generation() != 0 || !m.Isolated(policy.Ingress) || !m.Isolated(policy.Egress) {
			t.Fatalf("got generation %d, isolated %v/%v; want policy.Closed", m.Generation(), m.Isolated(policy.Ingress), m.Isolated(policy.Egress))
		}
		for _, a := range []netip.Addr{node, netip.MustParseAddr("fd01::1")} {
			if ok, _ := m.Allow(policy.Ingress, a, policy.ProtoTCP, 80); !ok {
				t.Errorf("gateway %s denied", a)
			}
		}
		if ok, _ := m.Allow(policy.Ingress, other, policy.ProtoTCP, 80); ok {
			t.Error("a peer other than the gateways allowed")
		}
	}
	t.Run("no file", func(t *testing.T) {
		e, err := startPolicy(filepath.Join(dir, "none.json"), spec, log)
		if err != nil {
			t.Fatal(err)
		}
		closed(t, e)
	})
	t.Run("unreadable file", func(t *testing.T) {
		path := filepath.Join(dir, "bad.json")
		if err := os.WriteFile(path, []byte(`{"version": 99}`), 0o600); err != nil {
			t.Fatal(err)
		}
		e, err := startPolicy(path, spec, log)
		if err != nil {
			t.Fatal(err)
		}
		closed(t, e)
	})
	t.Run("file", func(t *testing.T) {
		path := filepath.Join(dir, "policy.json")
		p := &policy.PodPolicy{Version: policy.FormatVersion, Generation: 12,
			Ingress: policy.Direction{Isolated: true, Rules: []policy.Rule{{Peers: []policy.Peer{{CIDR: netip.PrefixFrom(other, 32)}}}}}}
		if err := policy.WriteFile(path, p); err != nil {
			t.Fatal(err)
		}
		e, err := startPolicy(path, spec, log)
		if err != nil {
			t.Fatal(err)
		}
		m := e.Current()
		if m.Generation() != 12 || m.Isolated(policy.Egress) {
			t.Fatalf("got generation %d, egress isolated %v; want the file's", m.Generation(), m.Isolated(policy.Egress))
		}
		if ok, _ := m.Allow(policy.Ingress, other, policy.ProtoTCP, 80); !ok {
			t.Error("the file's peer denied")
		}
		if ok, _ := m.Allow(policy.Ingress, node, policy.ProtoTCP, 80); ok {
			t.Error("the gateway allowed though the file names no node")
		}
	})
}
