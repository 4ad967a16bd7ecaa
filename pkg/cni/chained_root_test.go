package cni_test

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/wirens"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// ptpAdd runs the real ptp plugin's ADD for id in pod, masquerading as
// bridge does behind flannel without --ip-masq, and returns its result and
// the configuration its DEL takes (run at cleanup too).
func ptpAdd(t *testing.T, env *nettest.Env, id string, pod ns.NetNS) (*current.Result, []byte) {
	t.Helper()
	ptpConf, _ := json.Marshal(map[string]any{
		"cniVersion": latest,
		"name":       "usernet-test",
		"type":       "ptp",
		"ipMasq":     true,
		"ipam":       env.HostLocal(map[string]any{"subnet": "10.199.1.0/24"}),
	})
	out, err := env.Exec("ptp", "ADD", ptpConf, id, pod, "eth0")
	if err != nil {
		t.Fatalf("ptp ADD: %v", err)
	}
	ptpRes, err := nettest.ParseResult(ptpConf, out)
	if err != nil {
		t.Fatal(err)
	}
	ptpDel := nettest.WithPrevResult(t, ptpConf, ptpRes)
	t.Cleanup(func() { env.Exec("ptp", "DEL", ptpDel, id, pod, "eth0") })
	return ptpRes, ptpDel
}

// addrStrings are the result's addresses as the kernel lists them.
func addrStrings(r *current.Result) []string {
	var out []string
	for _, a := range podAddrs(r) {
		out = append(out, a.String())
	}
	return out
}

// masq lists the node's NAT POSTROUTING rules.
func masq(t *testing.T, env *nettest.Env) string {
	t.Helper()
	var out []byte
	err := env.Node.Do(func(ns.NetNS) error {
		var err error
		out, err = exec.Command("iptables", "-w", "-t", "nat", "-S", "POSTROUTING").CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("iptables -t nat -S POSTROUTING: %v: %s", err, out)
	}
	return string(out)
}

// TestChainedAfterPtp runs cni-usernet after the real ptp plugin: it takes
// over ptp's eth0, passes ptp's result on, and carries traffic; DEL of
// both leaves nothing. ptp masquerades (ipMasq), as bridge does behind
// flannel without --ip-masq: its DEL finds the rule to remove by eth0's
// addresses, which cni-usernet's DEL must have given back.
func TestChainedAfterPtp(t *testing.T) {
	env := nettest.NewEnv(t)
	pod := nettest.NewNS(t)
	const id = "chained"
	ptpRes, ptpDel := ptpAdd(t, env, id, pod)

	conf := nettest.WithPrevResult(t, env.Conf(latest, map[string]any{"ipam": nil}), ptpRes)
	out, err := env.Exec("cni-usernet", "ADD", conf, id, pod, "eth0")
	if err != nil {
		t.Fatalf("cni-usernet ADD after ptp: %v", err)
	}
	t.Cleanup(func() { env.Del(conf, id, pod) })
	res, err := nettest.ParseResult(conf, out)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := podAddrs(res), podAddrs(ptpRes); !slices.Equal(got, want) {
		t.Errorf("result IPs: got %v, want ptp's %v", got, want)
	}
	if att := loadState(t, env, id); !att.Chained || att.HostVeth != "" || att.IPAMType != "" {
		t.Errorf("state: got chained=%v hostVeth=%q ipamType=%q, want chained with no veth or IPAM of its own",
			att.Chained, att.HostVeth, att.IPAMType)
	}
	att := loadState(t, env, id)
	wire, err := ns.GetNS(att.WireNetns)
	if err != nil {
		t.Fatalf("the stack's namespace: %v", err)
	}
	defer wire.Close()
	if got := kernelV4(t, wire, "eth0"); len(got) != 0 {
		t.Errorf("kernel IPv4 addresses on ptp's eth0 in the stack's namespace: got %v, want none (the stack owns them)", got)
	}
	if got, want := linkTypes(t, pod), []string{"lo:device", "eth0:tuntap"}; !slices.Equal(got, want) {
		t.Errorf("links in the pod: got %v, want %v (ptp's veth lives in the stack's namespace)", got, want)
	}
	// The veth left the pod through a namespace of passage: the pod holds
	// no id for the stack's namespace, through which CAP_NET_ADMIN would
	// reach the link again.
	nettest.In(pod, func() error {
		if id, err := netlink.GetNetNsIdByFd(int(wire.Fd())); err != nil || id >= 0 {
			t.Errorf("the pod's id for the stack's namespace: got %d (%v), want none", id, err)
		}
		return nil
	})
	if err := env.Check(nettest.WithPrevResult(t, env.Conf(latest, map[string]any{"ipam": nil}), res), id, pod); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	podIP := podAddrs(res)[0].Addr()
	nettest.Serve(nettest.Listen(t, pod, "tcp", ":8080"), nettest.Echo)
	assertEcho(t, env.Node, nettest.HostPort(podIP, 8080))

	if err := env.Del(conf, id, pod); err != nil {
		t.Fatalf("cni-usernet DEL: %v", err)
	}
	if got := nettest.NSLeaks(pod); !slices.Equal(got, []string{"link eth0"}) {
		t.Errorf("pod namespace after cni-usernet DEL: got %v, want only ptp's eth0", got)
	}
	if got, want := kernelV4(t, pod, "eth0"), addrStrings(ptpRes); !slices.Equal(got, want) {
		t.Errorf("eth0's addresses after cni-usernet DEL: got %v, want ptp's %v back", got, want)
	}
	if m := masq(t, env); !strings.Contains(m, id) {
		t.Fatalf("ptp made no masquerade rule for the pod:\n%s", m)
	}
	if _, err := env.Exec("ptp", "DEL", ptpDel, id, pod, "eth0"); err != nil {
		t.Fatalf("ptp DEL: %v", err)
	}
	if m := masq(t, env); strings.Contains(m, id) {
		t.Errorf("ptp's masquerade rule for the pod left after both DELs:\n%s", m)
	}
	env.AssertNoLeaks(t)
	assertNSClean(t, pod)
}

// TestChainedAddFailsGivesInterfaceBack: a chained ADD that fails after it
// moved the earlier plugin's interface into the stack's namespace gives the
// interface back to the pod with its addresses and leaves nothing of its
// own, whether it fails right after the move (the spec cannot be saved on
// a full state directory) or after the stack fenced the link and made its
// TUN (the control socket cannot be bound); ptp's DEL then leaves the
// node clean.
func TestChainedAddFailsGivesInterfaceBack(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(env *nettest.Env) map[string]any
		want  func(env *nettest.Env) []string
	}{
		{"state directory full", func(env *nettest.Env) map[string]any {
			stateDir := filepath.Join(env.Dir, "state")
			mountTmpfs(t, stateDir, "64k")
			fill(t, stateDir)
			return nil
		}, func(env *nettest.Env) []string {
			return []string{"state directory " + filepath.Join(env.Dir, "state"), "no space left on device"}
		}},
		{"control socket path too long", func(env *nettest.Env) map[string]any {
			// A unix socket path holds at most 107 bytes.
			return map[string]any{"runDir": filepath.Join(env.Dir, "run-"+strings.Repeat("x", 100))}
		}, func(env *nettest.Env) []string {
			return []string{"stack", filepath.Join(env.Dir, "run-"+strings.Repeat("x", 100))}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := nettest.NewEnv(t)
			pod := nettest.NewNS(t)
			const id = "chainedfail"
			ptpRes, ptpDel := ptpAdd(t, env, id, pod)
			extra := map[string]any{"ipam": nil}
			for k, v := range c.setup(env) {
				extra[k] = v
			}
			conf := nettest.WithPrevResult(t, env.Conf(latest, extra), ptpRes)
			out, err := env.Exec("cni-usernet", "ADD", conf, id, pod, "eth0")
			if err == nil {
				env.Del(conf, id, pod)
				t.Fatalf("chained ADD: got result %s, want an error", out)
			}
			wantMessage(t, cniErr(t, err).Msg, c.want(env)...)
			if got := nettest.NSLeaks(pod); !slices.Equal(got, []string{"link eth0"}) {
				t.Errorf("pod namespace after the failed ADD: got %v, want only ptp's eth0", got)
			}
			if got, want := kernelV4(t, pod, "eth0"), addrStrings(ptpRes); !slices.Equal(got, want) {
				t.Errorf("eth0's addresses after the failed ADD: got %v, want ptp's %v back", got, want)
			}
			if pin := wirens.Path(env.NetnsDir(), state.Key(id, "eth0")); wirens.Exists(pin) {
				t.Errorf("the failed ADD left the stack's namespace pinned at %s", pin)
			}
			if _, err := env.Exec("ptp", "DEL", ptpDel, id, pod, "eth0"); err != nil {
				t.Fatalf("ptp DEL: %v", err)
			}
			env.AssertNoLeaks(t)
			assertNSClean(t, pod)
		})
	}
}
