package cni_test

import (
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/shaping"
	"github.com/cni-usernet/cni-usernet/pkg/node/sourceguard"
	"github.com/cni-usernet/cni-usernet/pkg/node/wirens"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestWireNamespace: after ADD the pod's namespace holds lo and eth0, the
// stack's TUN with the pod's addresses; the veth's pod end is in the
// stack's own namespace, pinned, with no kernel address; the node end is
// source-guarded. DEL removes the pin, the namespace with the veth, and
// the guard.
func TestWireNamespace(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	p := env.NewPod(conf)
	att := loadState(t, env, p.ID)
	if got, want := linkTypes(t, p.NS), []string{"lo:device", "eth0:tuntap"}; !slices.Equal(got, want) {
		t.Errorf("links in the pod: got %v, want %v", got, want)
	}
	wantPin := wirens.Path(env.NetnsDir(), state.Key(p.ID, "eth0"))
	if att.WireNetns != wantPin {
		t.Errorf("state wireNetns: got %q, want %q", att.WireNetns, wantPin)
	}
	wire := env.WireNS(p)
	if got := linkTypes(t, wire); !slices.Equal(got, []string{"lo:device", "eth0:veth"}) {
		t.Errorf("links in the stack's namespace: got %v, want [lo:device eth0:veth]", got)
	}
	if got := kernelV4(t, wire, "eth0"); len(got) != 0 {
		t.Errorf("kernel IPv4 addresses on the pod's link: got %v, want none (the stack owns them)", got)
	}
	// No id in the pod for the stack's namespace or the node's, through
	// which CAP_NET_ADMIN would reach links there.
	nettest.In(p.NS, func() error {
		for name, n := range map[string]ns.NetNS{"stack's": wire, "node's": env.Node} {
			if id, err := netlink.GetNetNsIdByFd(int(n.Fd())); err != nil || id >= 0 {
				t.Errorf("the pod's id for the %s namespace: got %d (%v), want none", name, id, err)
			}
		}
		return nil
	})
	if att.SourceGuard != att.HostVeth {
		t.Errorf("state sourceGuard: got %q, want the node end %q", att.SourceGuard, att.HostVeth)
	}
	nettest.In(env.Node, func() error {
		if _, err := sourceguard.Dropped(att.HostVeth); err != nil {
			t.Errorf("source guard on %s: %v", att.HostVeth, err)
		}
		return nil
	})
	assertEcho(t, env.Node, nettest.HostPort(p.IP(4), serveEcho(t, p)))

	if err := env.Del(conf, p.ID, p.NS); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if wirens.Exists(wantPin) {
		t.Errorf("DEL left the stack's namespace pinned at %s", wantPin)
	}
	if _, err := os.Stat(wantPin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("DEL left the pin file %s: %v", wantPin, err)
	}
	nettest.In(env.Node, func() error {
		if _, err := sourceguard.Dropped(att.HostVeth); !errors.Is(err, sourceguard.ErrNotInstalled) {
			t.Errorf("source guard after DEL: got %v, want %v", err, sourceguard.ErrNotInstalled)
		}
		return nil
	})
	assertNSClean(t, p.NS)
	env.AssertNoLeaks(t)
}

// serveEcho starts a TCP echo server in the pod and returns its port.
func serveEcho(t *testing.T, p *nettest.Pod) int {
	t.Helper()
	nettest.Serve(nettest.Listen(t, p.NS, "tcp", ":7007"), nettest.Echo)
	return 7007
}

// TestAddOverStalePin: an ADD that died after pinning the stack's
// namespace, before its record, left the pin; the next ADD of the same
// attachment replaces it.
func TestAddOverStalePin(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	pod := nettest.NewNS(t)
	const id = "stalepin"
	pin := wirens.Path(env.NetnsDir(), state.Key(id, "eth0"))
	stale, err := wirens.Create(pin)
	if err != nil {
		t.Fatal(err)
	}
	stale.Close()
	if _, err := env.Add(conf, id, pod); err != nil {
		t.Fatalf("ADD over a stale pin: %v", err)
	}
	if err := env.Del(conf, id, pod); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if wirens.Exists(pin) {
		t.Errorf("DEL left %s pinned", pin)
	}
	env.AssertNoLeaks(t)
}

// TestBandwidthShapedByThePlugin: the runtime's bandwidth argument shapes
// the node end of the veth (towards the pod) and the pod end in the
// stack's namespace (from the pod), which the pod cannot reach.
func TestBandwidthShapedByThePlugin(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, map[string]any{"runtimeConfig": map[string]any{"bandwidth": map[string]any{
		"ingressRate": 10_000_000, "ingressBurst": 1 << 30, "egressRate": 50_000_000, "egressBurst": 1 << 30,
	}}})
	p := env.NewPod(conf)
	att := loadState(t, env, p.ID)
	rate := func(netns ns.NetNS, link string) uint64 {
		var r uint64
		if err := nettest.In(netns, func() (err error) { r, err = shaping.Rate(link); return err }); err != nil {
			t.Fatalf("reading the shaping of %s: %v", link, err)
		}
		return r
	}
	if got := rate(env.Node, att.HostVeth); got != 10_000_000 {
		t.Errorf("node end %s: got %d bit/s, want the ingress rate 10000000", att.HostVeth, got)
	}
	if got := rate(env.WireNS(p), "eth0"); got != 50_000_000 {
		t.Errorf("pod end: got %d bit/s, want the egress rate 50000000", got)
	}
	// A rate without a burst fails before anything is made.
	bad := nettest.NewEnv(t)
	te := addFails(t, bad, bad.Conf(latest, map[string]any{"runtimeConfig": map[string]any{"bandwidth": map[string]any{
		"ingressRate": 10_000_000}}}), "badbw")
	wantMessage(t, te.Msg, "bandwidth", "ingressBurst")
}

// TestAddRefusesRuntimeCgroupPath: a cgroupPath from the runtime outside
// the node's kubepods tree, or one that climbs out of it, fails ADD with
// code 7 naming the path, and leaves the node and the pod as they were
// (addFails checks both).
func TestAddRefusesRuntimeCgroupPath(t *testing.T) {
	env := nettest.NewEnv(t)
	for _, c := range []struct{ name, path, want string }{
		{"outside kubepods", "/system.slice/containerd.service", "/system.slice/containerd.service"},
		{"dot-dot", "/kubepods/burstable/../../system.slice", "/kubepods/burstable/../../system.slice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			conf := env.Conf(latest, map[string]any{"runtimeConfig": map[string]any{"cgroupPath": c.path}})
			te := addFails(t, env, conf, "badcg")
			if te.Code != 7 {
				t.Errorf("code: got %d, want 7", te.Code)
			}
			wantMessage(t, te.Msg, c.want, `"stackCgroup": "node"`)
		})
	}
}
