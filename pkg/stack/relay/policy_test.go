package relay

import (
	"net/netip"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/stack/enforce"
)

func egressPolicy(t *testing.T, gen uint64) *policy.PodPolicy {
	t.Helper()
	return &policy.PodPolicy{Version: policy.FormatVersion, Generation: gen,
		Egress: policy.Direction{Isolated: true, Policies: []string{"ns/out"}, Rules: []policy.Rule{
			{Peers: []policy.Peer{{CIDR: netip.MustParsePrefix("10.1.0.0/16")}, {CIDR: netip.MustParsePrefix("fd01::/64")}},
				Ports: []policy.PortRange{{Protocol: policy.TCP, First: 8080}, {Protocol: policy.UDP, First: 53}}},
			{Peers: []policy.Peer{{CIDR: netip.MustParsePrefix("10.3.0.0/16")}}},
		}},
		Services: []policy.Service{
			{Name: "ns/web", Protocol: policy.TCP, VIP: netip.MustParseAddrPort("10.96.0.10:80"),
				Backends: []policy.Backend{{Addr: netip.MustParseAddrPort("10.2.0.1:8080")}, {Addr: netip.MustParseAddrPort("10.1.0.7:8080")}}},
			{Name: "ns/dns", Protocol: policy.UDP, VIP: netip.MustParseAddrPort("10.96.0.53:53"),
				Backends: []policy.Backend{{Addr: netip.MustParseAddrPort("10.1.0.53:53")}}},
			{Name: "ns/closed", Protocol: policy.TCP, VIP: netip.MustParseAddrPort("10.96.0.11:80"),
				Backends: []policy.Backend{{Addr: netip.MustParseAddrPort("10.2.0.1:8080")}}},
		}}
}

// TestEgressTo: the verdict on the applications' new connections and
// flows, and the Service VIPs dialled as their allowed backend.
func TestEgressTo(t *testing.T) {
	e, err := enforce.NewEnforcer(egressPolicy(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	r := &env{opts: Options{Policy: e}}
	app := netip.MustParseAddrPort("10.9.0.2:40000")
	ap := netip.MustParseAddrPort
	for _, c := range []struct {
		name   string
		remote netip.AddrPort
		proto  uint8
		want   netip.AddrPort
		ok     bool
	}{
		{"allowed TCP", ap("10.1.2.3:8080"), policy.ProtoTCP, ap("10.1.2.3:8080"), true},
		{"allowed v6 UDP", ap("[fd01::9]:53"), policy.ProtoUDP, ap("[fd01::9]:53"), true},
		{"denied port", ap("10.1.2.3:8081"), policy.ProtoTCP, ap("10.1.2.3:8081"), false},
		{"denied peer", ap("10.2.0.1:8080"), policy.ProtoTCP, ap("10.2.0.1:8080"), false},
		{"any port of 10.3/16", ap("10.3.0.1:9"), policy.ProtoUDP, ap("10.3.0.1:9"), true},
		{"VIP to its allowed backend", ap("10.96.0.10:80"), policy.ProtoTCP, ap("10.1.0.7:8080"), true},
		{"UDP VIP", ap("10.96.0.53:53"), policy.ProtoUDP, ap("10.1.0.53:53"), true},
		{"VIP without an allowed backend", ap("10.96.0.11:80"), policy.ProtoTCP, netip.AddrPort{}, false},
		{"VIP port of another protocol", ap("10.96.0.10:80"), policy.ProtoUDP, ap("10.96.0.10:80"), false},
	} {
		got, ok := r.egressTo(flowKey{app: app, remote: c.remote}, c.proto)
		if ok != c.ok || got != c.want {
			t.Errorf("%s: got %s %v, want %s %v", c.name, got, ok, c.want, c.ok)
		}
	}
	if n := e.Status().Denied.Egress["ns/out"]; n != 4 {
		t.Errorf("egress denials: got %d, want 4", n)
	}
	// The VIP without an allowed backend is recorded as what the
	// application asked for, with why.
	var vip policy.Denial
	for _, d := range e.Status().RecentDenials {
		if d.Peer == ap("10.96.0.11:80").Addr() {
			vip = d
		}
	}
	if vip.Direction != "egress" || vip.Port != 80 || vip.Local != app.Addr() || vip.Reason != "no allowed backend" {
		t.Errorf("the Service's denial: got %+v", vip)
	}
	// Egress open: the remote as the application asked, VIP included.
	open := &policy.PodPolicy{Version: policy.FormatVersion, Generation: 2}
	if err := e.Set(open); err != nil {
		t.Fatal(err)
	}
	if got, ok := r.egressTo(flowKey{app: app, remote: ap("10.96.0.11:80")}, policy.ProtoTCP); !ok || got != ap("10.96.0.11:80") {
		t.Errorf("egress open: got %s %v, want the VIP itself", got, ok)
	}
	// No policy at all (a stack that does not enforce).
	if got, ok := (&env{}).egressTo(flowKey{app: app, remote: ap("10.2.0.1:1")}, policy.ProtoTCP); !ok || got != ap("10.2.0.1:1") {
		t.Errorf("no policy: got %s %v", got, ok)
	}
}

// TestPingerEgress: a denied echo request is consumed and never relayed.
func TestPingerEgress(t *testing.T) {
	e, err := enforce.NewEnforcer(egressPolicy(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	p := &Pinger{stats: new(Stats), policy: e, queue: make(chan echo, 4)}
	pod := netip.MustParseAddr("10.9.0.2")
	if !p.handle(request(pod, netip.MustParseAddr("10.2.0.1"), 1, 1, []byte("x"))) {
		t.Fatal("denied echo request: not taken")
	}
	if len(p.queue) != 0 {
		t.Fatal("denied echo request: queued for the network")
	}
	if !p.handle(request(pod, netip.MustParseAddr("10.3.0.1"), 1, 2, []byte("x"))) || len(p.queue) != 1 {
		t.Fatal("allowed echo request (a rule without ports): not queued")
	}
	if n := e.Status().Denied.Egress["ns/out"]; n != 1 {
		t.Errorf("egress denials: got %d, want 1", n)
	}
}
