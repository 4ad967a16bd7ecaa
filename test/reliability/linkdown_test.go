package reliability

import (
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestPodLinkDownAndUp sets the pod's link to the node down and up again
// in the stack's namespace, as an administrator of the node can (the pod's
// processes cannot reach it). The kernel reports ENETDOWN on
// every packet socket bound to it, which ends the stack's readers; the
// stack must not stay up deaf: it exits, the agent restarts it, and the
// pod opens connections again.
func TestPodLinkDownAndUp(t *testing.T) {
	env, pod := newEnvPod(t, nil)
	startAgent(t, env)
	echoServer(t, env.Node, 7000)
	node := nettest.HostPort(pod.Gateway(4), 7000)
	if err := roundTrip(pod.NS, node); err != nil {
		t.Fatalf("before the link went down: %v", err)
	}
	old := stackOf(t, env, pod)
	err := env.WireNS(pod).Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetDown(l); err != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatalf("setting eth0 down and up: %v", err)
	}
	upAt := time.Now()
	for {
		if err := roundTrip(pod.NS, node); err == nil {
			break
		}
		if time.Since(upAt) > 10*time.Second {
			t.Fatalf("pod cannot open connections %s after its link came back up", time.Since(upAt).Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("new connections work %s after the link came back up", time.Since(upAt).Round(time.Millisecond))
	if now := lockedStackOf(t, env, pod); now == old || !launch.Alive(now) {
		t.Fatalf("state names stack %+v, before the link went down %+v: want a restarted stack", now, old)
	}
	if err := env.Check(pod.Conf, pod.ID, pod.NS); err != nil {
		t.Fatalf("CHECK after the restart: %v", err)
	}
}
