package policyctl

import (
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// A policy the compiler cannot fully use: its warnings go to the log and,
// once per change, to warn (the Event on the pod).
func TestCompileWarningsOncePerChange(t *testing.T) {
	logs := &nettest.LockedBuffer{}
	report := &reporter{log: slog.New(slog.NewTextHandler(logs, nil)), metrics: NewMetrics()}
	var warned []string
	w := newWarnings(func(p *netpolicy.Pod, ws string) {
		warned = append(warned, p.Metadata.Name+": "+ws)
		report.compileWarnings(p, ws)
	})
	pod := podObj("x", "a", "10.244.1.10", nil)
	bad := ingressPolicy("x", "bad", "")
	bad.Spec.Ingress = []netpolicy.NetworkPolicyIngressRule{{From: []netpolicy.NetworkPolicyPeer{{IPBlock: &netpolicy.IPBlock{CIDR: "10.0.0.0/33"}}}}}
	snap := &netpolicy.Snapshot{
		Policies: map[string]*netpolicy.NetworkPolicy{"x/bad": bad},
		Pods:     map[string]*netpolicy.Pod{"x/a": pod},
	}
	tg := target{key: state.Key("c-a", "eth0"), namespace: "x", pod: "a", ips: []netip.Addr{netip.MustParseAddr("10.244.1.10")}}
	for range 3 {
		peers := netpolicy.NewPodIndex()
		peers.Pod(nil, pod)
		r := newRound(snap, netpolicy.Indexes{Pods: peers, Services: &netpolicy.ServiceTables{}}, func(k string) *netpolicy.Pod { return snap.Pods[k] }, testNode, []target{tg}, w)
		p := r.compile(r.pod(tg), tg).Policy
		if !p.Ingress.Isolated || len(ingressPeers(p)) != 0 {
			t.Fatalf("the bad ipBlock opened something: %+v", p.Ingress)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "x/bad") {
		t.Errorf("warnings given: %q, want one naming x/bad", warned)
	}
	if !strings.Contains(logs.String(), "x/bad") {
		t.Errorf("no log line:\n%s", logs)
	}
}
