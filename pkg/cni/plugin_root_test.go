package cni_test

// Root tests of the CNI verbs: real namespaces, the real binaries (built by
// nettest), the real host-local IPAM and ptp plugins, run the way a
// runtime runs them.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// versions are the CNI versions the plugin declares.
var versions = netconf.CNIVersions

var latest = netconf.LatestCNIVersion

// cniErr asserts that err is the plugin's *types.Error and returns it.
func cniErr(t *testing.T, err error) *types.Error {
	t.Helper()
	var te *types.Error
	if !errors.As(err, &te) {
		t.Fatalf("got error %v (%T), want a *types.Error from the plugin", err, err)
	}
	return te
}

// wantMessage fails unless msg contains every part.
func wantMessage(t *testing.T, msg string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Errorf("error %q: got no %q in it, want it named", msg, p)
		}
	}
}

// assertNSClean fails when the pod namespace still holds links or tables.
func assertNSClean(t *testing.T, netns ns.NetNS, want ...string) {
	t.Helper()
	if got := nettest.NSLeaks(netns); !slices.Equal(got, want) {
		t.Errorf("pod namespace holds %v, want %v", got, want)
	}
}

// loadState reads the attachment's state file.
func loadState(t *testing.T, env *nettest.Env, id string) *state.Attachment {
	t.Helper()
	att, err := state.Store{Dir: filepath.Join(env.Dir, "state")}.Load(id, "eth0")
	if err != nil {
		t.Fatalf("loading state of %s: %v", id, err)
	}
	return att
}

// assertEcho sends a line from netns to addr and wants it back.
func assertEcho(t *testing.T, from ns.NetNS, addr string) {
	t.Helper()
	c, err := nettest.Dial(from, "tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("dialing %s: %v", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	const msg = "hello through the stack\n"
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("writing to %s: %v", addr, err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != msg {
		t.Fatalf("echo from %s: got %q (%v), want %q", addr, got, err, msg)
	}
}

// podAddrs are the result's addresses as prefixes.
func podAddrs(r *current.Result) []netip.Prefix {
	var out []netip.Prefix
	for _, ipc := range r.IPs {
		a, _ := netip.AddrFromSlice(ipc.Address.IP)
		ones, _ := ipc.Address.Mask.Size()
		out = append(out, netip.PrefixFrom(a.Unmap(), ones))
	}
	return out
}

// kernelV4 lists the IPv4 addresses the kernel holds on link in netns.
// linkTypes lists the links of netns as "name:type".
func linkTypes(t *testing.T, netns ns.NetNS) []string {
	t.Helper()
	var out []string
	err := nettest.In(netns, func() error {
		links, err := netlinksafe.LinkList()
		for _, l := range links {
			out = append(out, l.Attrs().Name+":"+l.Type())
		}
		return err
	})
	if err != nil {
		t.Fatalf("listing links: %v", err)
	}
	return out
}

func kernelV4(t *testing.T, netns ns.NetNS, link string) []string {
	t.Helper()
	var out []string
	err := nettest.In(netns, func() error {
		l, err := netlinksafe.LinkByName(link)
		if err != nil {
			return err
		}
		addrs, err := netlinksafe.AddrList(l, netlink.FAMILY_V4)
		for _, a := range addrs {
			out = append(out, a.IPNet.String())
		}
		return err
	})
	if err != nil {
		t.Fatalf("listing addresses of %s: %v", link, err)
	}
	return out
}

// TestAddCheckDelEveryVersion runs ADD, CHECK (with the ADD result as
// prevResult, from 0.4.0 on), DEL and DEL again for every supported
// version: the result comes in the caller's version with the pod's
// addresses, and nothing is left on the node or in the pod.
func TestAddCheckDelEveryVersion(t *testing.T) {
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			env := nettest.NewEnv(t)
			conf := env.Conf(v, nil)
			pod := nettest.NewNS(t)
			id := "ver-" + strings.ReplaceAll(v, ".", "")
			out, err := env.Exec("cni-usernet", "ADD", conf, id, pod, "eth0")
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			t.Cleanup(func() { env.Del(conf, id, pod) })
			var head struct {
				CNIVersion string `json:"cniVersion"`
			}
			if err := json.Unmarshal(out, &head); err != nil {
				t.Fatalf("result %s: %v", out, err)
			}
			if head.CNIVersion != v {
				t.Errorf("result cniVersion: got %q, want %q", head.CNIVersion, v)
			}
			res, err := nettest.ParseResult(conf, out)
			if err != nil {
				t.Fatal(err)
			}
			subnets := []netip.Prefix{netip.MustParsePrefix(env.Subnet), netip.MustParsePrefix(env.Subnet6)}
			addrs := podAddrs(res)
			for _, s := range subnets {
				if !slices.ContainsFunc(addrs, func(p netip.Prefix) bool { return s.Contains(p.Addr()) }) {
					t.Errorf("result IPs: got %v, want one in %s", addrs, s)
				}
			}
			if !slices.ContainsFunc(res.Interfaces, func(i *current.Interface) bool {
				return i.Name == "eth0" && i.Sandbox == pod.Path()
			}) {
				t.Errorf("result interfaces: got %+v, want eth0 in sandbox %s", res.Interfaces, pod.Path())
			}
			if att := loadState(t, env, id); !slices.Equal(att.IPs, prefixStrings(addrs)) {
				t.Errorf("state IPs: got %v, want %v", att.IPs, prefixStrings(addrs))
			}

			delConf := conf
			if v != "0.3.1" { // CHECK and prevResult on DEL came with 0.4.0
				delConf = nettest.WithPrevResult(t, conf, res)
				if err := env.Check(delConf, id, pod); err != nil {
					t.Errorf("CHECK: %v", err)
				}
			}
			if err := env.Del(delConf, id, pod); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if err := env.Del(delConf, id, pod); err != nil {
				t.Errorf("second DEL: %v", err)
			}
			env.AssertNoLeaks(t)
			assertNSClean(t, pod)
		})
	}
}

func prefixStrings(ps []netip.Prefix) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// addFails runs ADD of a fresh pod with conf, wants a plugin error, and
// checks that neither the node nor the pod's namespace keeps anything.
func addFails(t *testing.T, env *nettest.Env, conf []byte, id string) *types.Error {
	t.Helper()
	pod := nettest.NewNS(t)
	out, err := env.Exec("cni-usernet", "ADD", conf, id, pod, "eth0")
	if err == nil {
		env.Del(conf, id, pod)
		t.Fatalf("ADD: got result %s, want an error", out)
	}
	te := cniErr(t, err)
	env.AssertNoLeaks(t)
	assertNSClean(t, pod)
	return te
}

// TestAddBadConflist checks that configuration errors fail ADD with code 7
// and a message naming the key and the value, touching nothing.
func TestAddBadConflist(t *testing.T) {
	env := nettest.NewEnv(t)
	for _, c := range []struct {
		name  string
		extra map[string]any
		parts []string
	}{
		{"mtu wrong type", map[string]any{"mtu": "big"}, []string{"mtu", "string"}},
		{"mtu out of range", map[string]any{"mtu": 100}, []string{`"mtu"`, "100", "576..65535"}},
		{"unknown gso", map[string]any{"gso": "turbo"}, []string{`"gso"`, `"turbo"`, "auto, hardware, software, off"}},
		{"tunName too long", map[string]any{"tunName": "usernet-tun-too-long"}, []string{`"tunName"`, "usernet-tun-too-long", "15 bytes"}},
		{"negative udpIdle", map[string]any{"udpIdle": "-3s"}, []string{`"udpIdle"`, `"-3s"`, "positive duration"}},
		{"relative stateDir", map[string]any{"stateDir": "state"}, []string{`"stateDir"`, `"state"`, "absolute"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			te := addFails(t, env, env.Conf(latest, c.extra), "badconf")
			if te.Code != types.ErrInvalidNetworkConfig {
				t.Errorf("code: got %d (%s), want %d", te.Code, te.Msg, types.ErrInvalidNetworkConfig)
			}
			wantMessage(t, te.Msg, c.parts...)
		})
	}
}

// TestAddBadAnnotation checks that a pod annotation the stack cannot take
// (an unknown GSO mode, a busy-poll window beyond the limit) fails ADD
// before anything is created, with a message naming the annotation, the
// value and what it takes.
func TestAddBadAnnotation(t *testing.T) {
	env := nettest.NewEnv(t)
	for _, c := range []struct {
		annotation, value string
		parts             []string
	}{
		{"cni-usernet.io/gso", "turbo", []string{"turbo", "auto, hardware, software, off"}},
		{"cni-usernet.io/busy-poll", "1s", []string{`"1s"`, "at most 10ms"}},
		{"cni-usernet.io/socket-redirect", "fast", []string{`"fast"`, "on, both, direct, off"}},
	} {
		t.Run(c.annotation, func(t *testing.T) {
			conf := env.Conf(latest, map[string]any{"runtimeConfig": map[string]any{
				"io.kubernetes.cri.pod-annotations": map[string]any{c.annotation: c.value},
			}})
			te := addFails(t, env, conf, "badannotation")
			if te.Code != types.ErrInvalidNetworkConfig {
				t.Errorf("code: got %d, want %d", te.Code, types.ErrInvalidNetworkConfig)
			}
			wantMessage(t, te.Msg, append([]string{c.annotation}, c.parts...)...)
		})
	}
}

// TestAddIPAMExhausted fills a one-address range: the second ADD fails
// without disturbing the first pod or leaving anything of its own.
func TestAddIPAMExhausted(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, map[string]any{"ipam": env.HostLocal(map[string]any{
		"subnet": "10.199.0.0/24", "rangeStart": "10.199.0.10", "rangeEnd": "10.199.0.10",
	})})
	first := env.NewPod(conf)
	if got, want := first.IP(4), netip.MustParseAddr("10.199.0.10"); got != want {
		t.Fatalf("first pod IP: got %s, want %s", got, want)
	}
	before := env.Leaks()

	pod := nettest.NewNS(t)
	_, err := env.Exec("cni-usernet", "ADD", conf, "second", pod, "eth0")
	if err == nil {
		env.Del(conf, "second", pod)
		t.Fatal("second ADD: got success, want the range exhausted")
	}
	wantMessage(t, cniErr(t, err).Msg, "no IP addresses available")
	if after := env.Leaks(); !slices.Equal(after, before) {
		t.Errorf("after the failed ADD the node holds %v, want what the first pod had: %v", after, before)
	}
	assertNSClean(t, pod)

	if err := env.Check(nettest.WithPrevResult(t, conf, first.Result), first.ID, first.NS); err != nil {
		t.Errorf("CHECK of the first pod after the failed ADD: %v", err)
	}
	nettest.Serve(nettest.Listen(t, first.NS, "tcp", ":7"), nettest.Echo)
	assertEcho(t, env.Node, nettest.HostPort(first.IP(4), 7))

	if err := env.Del(conf, first.ID, first.NS); err != nil {
		t.Fatalf("DEL of the first pod: %v", err)
	}
	env.AssertNoLeaks(t)
}

// TestAddStackCannotStart makes the stack fail at start, early (it refuses
// hardware GSO on a link whose offloads it turned off) and late (after it
// fenced the link and made its TUN: the control socket cannot be bound).
// ADD fails saying why, and both the node and the pod are as before.
func TestAddStackCannotStart(t *testing.T) {
	env := nettest.NewEnv(t)
	t.Run("hardware GSO without offloads", func(t *testing.T) {
		conf := env.Conf(latest, map[string]any{"gso": "hardware", "podLinkOffloadsOff": true})
		te := addFails(t, env, conf, "nogso")
		wantMessage(t, te.Msg, "GSO", `"hardware"`)
	})
	t.Run("control socket path too long", func(t *testing.T) {
		// A unix socket path holds at most 107 bytes.
		runDir := filepath.Join(env.Dir, "run-"+strings.Repeat("x", 100))
		conf := env.Conf(latest, map[string]any{"runDir": runDir})
		te := addFails(t, env, conf, "longsock")
		wantMessage(t, te.Msg, "stack", runDir)
	})
}

// TestAddTwice checks that a second ADD of the same container and
// interface fails clearly and leaves the first attachment working.
func TestAddTwice(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	pod := env.NewPod(conf)
	_, err := env.Exec("cni-usernet", "ADD", conf, pod.ID, pod.NS, "eth0")
	if err == nil {
		t.Fatal("second ADD: got success, want an error")
	}
	wantMessage(t, cniErr(t, err).Msg, pod.ID, "eth0", "already attached")
	if err := env.Check(nettest.WithPrevResult(t, conf, pod.Result), pod.ID, pod.NS); err != nil {
		t.Errorf("CHECK after the second ADD: %v", err)
	}
	if err := env.Del(conf, pod.ID, pod.NS); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	env.AssertNoLeaks(t)
}

// statusRow is the part of `cni-usernet status --json` the tests read.
type statusRow struct {
	ContainerID string         `json:"containerID"`
	IfName      string         `json:"ifName"`
	IPs         []string       `json:"ips"`
	PID         int            `json:"pid"`
	Healthy     bool           `json:"healthy"`
	Problem     string         `json:"problem"`
	GSO         map[string]any `json:"gso"`
}

func runStatus(t *testing.T, env *nettest.Env, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(filepath.Join(env.BinDir, "cni-usernet"),
		append([]string{"status", "--state-dir", filepath.Join(env.Dir, "state")}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cni-usernet status %v: %v", args, err)
	}
	return out
}

// TestAnnotationGSOOff checks that the pod annotation chooses the stack's
// GSO mode, and that the status command reports it with the rest of the
// attachment, as JSON and as a table.
func TestAnnotationGSOOff(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, map[string]any{"gso": "software", "runtimeConfig": map[string]any{
		"io.kubernetes.cri.pod-annotations": map[string]any{"cni-usernet.io/gso": "off"},
	}})
	pod := env.NewPod(conf)

	var rows []statusRow
	out := runStatus(t, env, "--json")
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("status --json printed %s: %v", out, err)
	}
	if len(rows) != 1 {
		t.Fatalf("status rows: got %d, want 1:\n%s", len(rows), out)
	}
	r := rows[0]
	if r.ContainerID != pod.ID || r.IfName != "eth0" {
		t.Errorf("row: got %s/%s, want %s/eth0", r.ContainerID, r.IfName, pod.ID)
	}
	if want := prefixStrings(podAddrs(pod.Result)); !slices.Equal(r.IPs, want) {
		t.Errorf("ips: got %v, want %v", r.IPs, want)
	}
	if att := loadState(t, env, pod.ID); r.PID != att.StackPID || r.PID <= 0 {
		t.Errorf("pid: got %d, want the stack's %d", r.PID, att.StackPID)
	}
	if !r.Healthy {
		t.Errorf("healthy: got false (%s), want true", r.Problem)
	}
	if got := r.GSO["mode"]; got != "off" {
		t.Errorf("gso.mode: got %v, want off", got)
	}
	for _, k := range []string{"maxSize", "maxSegs"} {
		if _, ok := r.GSO[k].(float64); !ok {
			t.Errorf("gso.%s: got %v, want a number", k, r.GSO[k])
		}
	}

	table := string(runStatus(t, env))
	if !strings.Contains(table, pod.ID) || !strings.Contains(table, "off") {
		t.Errorf("status table: got\n%s\nwant a row with %s and gso off", table, pod.ID)
	}
}

// TestGCRemovesUnlisted attaches three pods and runs GC listing one: the
// other two lose state, stack, veth and lease; the listed one is intact.
func TestGCRemovesUnlisted(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	keep, gone1, gone2 := env.NewPod(conf), env.NewPod(conf), env.NewPod(conf)
	var goneAtts []*state.Attachment
	for _, p := range []*nettest.Pod{gone1, gone2} {
		goneAtts = append(goneAtts, loadState(t, env, p.ID))
	}

	gcConf := env.Conf(latest, map[string]any{"cni.dev/valid-attachments": []any{
		map[string]any{"containerID": keep.ID, "ifname": "eth0"},
	}})
	if _, err := env.Exec("cni-usernet", "GC", gcConf, "", nil, ""); err != nil {
		t.Fatalf("GC: %v", err)
	}

	for i, p := range []*nettest.Pod{gone1, gone2} {
		att := goneAtts[i]
		if _, err := (state.Store{Dir: filepath.Join(env.Dir, "state")}).Load(p.ID, "eth0"); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("state of %s after GC: got %v, want none", p.ID, err)
		}
		if launch.Alive(launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}) {
			t.Errorf("stack %d of %s after GC: got running, want stopped", att.StackPID, p.ID)
		}
		assertNSClean(t, p.NS)
	}
	// What remains on the node is exactly the kept pod's.
	want := footprint(t, env, keep)
	if got := env.Leaks(); !slices.Equal(got, want) {
		t.Errorf("after GC the node holds %v, want only the kept pod's %v", got, want)
	}
	if err := env.Check(nettest.WithPrevResult(t, conf, keep.Result), keep.ID, keep.NS); err != nil {
		t.Errorf("CHECK of the kept pod: %v", err)
	}
	if err := env.Del(conf, keep.ID, keep.NS); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	env.AssertNoLeaks(t)
}

// TestStatus checks STATUS: ready on a good configuration, code 50 when
// the state directory cannot take files.
func TestStatus(t *testing.T) {
	env := nettest.NewEnv(t)
	if _, err := env.Exec("cni-usernet", "STATUS", env.Conf(latest, nil), "", nil, ""); err != nil {
		t.Errorf("STATUS on a good configuration: got %v, want success", err)
	}
	file := filepath.Join(env.Dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(file, "state")
	_, err := env.Exec("cni-usernet", "STATUS", env.Conf(latest, map[string]any{"stateDir": stateDir}), "", nil, "")
	if err == nil {
		t.Fatal("STATUS with an unwritable state directory: got success, want code 50")
	}
	te := cniErr(t, err)
	if te.Code != types.ErrPluginNotAvailable {
		t.Errorf("code: got %d (%s), want %d", te.Code, te.Msg, types.ErrPluginNotAvailable)
	}
	wantMessage(t, te.Msg, stateDir)
}

// TestConcurrentAddDel runs 20 ADDs at once, then 20 DELs at once.
func TestConcurrentAddDel(t *testing.T) {
	const n = 20
	env := nettest.NewEnv(t)
	// Twenty stacks starting on two busy cores: be generous.
	conf := env.Conf(latest, map[string]any{"readyTimeout": "60s"})
	pods := make([]ns.NetNS, n)
	ids := make([]string, n)
	for i := range pods {
		pods[i], ids[i] = nettest.NewNS(t), fmt.Sprintf("conc-%02d", i)
		t.Cleanup(func() { env.Del(conf, ids[i], pods[i]) })
	}
	each := func(verb string, f func(i int) error) {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { errs[i] = f(i) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("%s %s: %v", verb, ids[i], err)
			}
		}
	}
	results := make([]*current.Result, n)
	each("ADD", func(i int) (err error) {
		results[i], err = env.Add(conf, ids[i], pods[i])
		return err
	})
	if t.Failed() {
		t.FailNow()
	}
	seen := make(map[netip.Addr]string)
	for i, r := range results {
		for _, p := range podAddrs(r) {
			if other, dup := seen[p.Addr()]; dup {
				t.Errorf("%s and %s both got %s", other, ids[i], p.Addr())
			}
			seen[p.Addr()] = ids[i]
		}
	}
	if got := len(env.StackPIDs()); got != n {
		t.Errorf("stack processes: got %d, want %d", got, n)
	}
	each("DEL", func(i int) error { return env.Del(conf, ids[i], pods[i]) })
	env.AssertNoLeaks(t)
}

// TestCheckDetectsDeadStack kills the stack: CHECK must say so, and DEL
// must still clean up everything.
func TestCheckDetectsDeadStack(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	pod := env.NewPod(conf)
	att := loadState(t, env, pod.ID)
	proc := launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}
	if err := syscall.Kill(att.StackPID, syscall.SIGKILL); err != nil {
		t.Fatalf("killing stack %d: %v", att.StackPID, err)
	}
	for deadline := time.Now().Add(30 * time.Second); launch.Alive(proc); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stack %d still alive 30s after SIGKILL", att.StackPID)
		}
	}
	err := env.Check(nettest.WithPrevResult(t, conf, pod.Result), pod.ID, pod.NS)
	if err == nil {
		t.Fatal("CHECK with a dead stack: got success, want an error")
	}
	wantMessage(t, cniErr(t, err).Msg, fmt.Sprint(att.StackPID), "not running")
	if err := env.Del(conf, pod.ID, pod.NS); err != nil {
		t.Fatalf("DEL with a dead stack: %v", err)
	}
	env.AssertNoLeaks(t)
	assertNSClean(t, pod.NS)
}
