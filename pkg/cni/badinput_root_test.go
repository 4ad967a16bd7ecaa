package cni_test

// Bad input through the real binaries: every case gets a CNI error with a
// message a user can act on, and the node is left as it was. The table in
// docs/reliability/badinput.md lists each case with its code and test.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
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

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// wantCode fails unless te has code.
func wantCode(t *testing.T, te *types.Error, code uint) {
	t.Helper()
	if te.Code != code {
		t.Errorf("code: got %d (%s), want %d", te.Code, te.Msg, code)
	}
}

// TestAddBadConflistKeys runs keys of every kind the table test in
// pkg/api/netconf covers through the plugin binary: wrong JSON types, values
// out of range, and checks that need the CNI arguments. Each is code 7
// (code 1 for a version the plugin does not speak, from skel),
// names the key and the value, and leaves nothing; none starts a stack.
func TestAddBadConflistKeys(t *testing.T) {
	env := nettest.NewEnv(t)
	longRunDir := "/run/" + strings.Repeat("r", 81)
	for _, c := range []struct {
		name  string
		extra map[string]any
		parts []string
		code  uint // zero: types.ErrInvalidNetworkConfig
	}{
		{"gsoMaxSize wrong type", map[string]any{"gsoMaxSize": -1}, []string{`"gsoMaxSize": got -1 (a number)`, "590..65536"}, 0},
		{"gsoMaxSegs too large", map[string]any{"gsoMaxSegs": 70000}, []string{`"gsoMaxSegs": got 70000`, "1..65535"}, 0},
		{"rxChecksumOffload wrong type", map[string]any{"rxChecksumOffload": "no"}, []string{`"rxChecksumOffload": got "no" (a string)`, "true or false"}, 0},
		{"tunMTU too large", map[string]any{"tunMTU": 70000}, []string{`"tunMTU": got 70000`, "1280..65535"}, 0},
		{"tunName with percent", map[string]any{"tunName": "tun%d"}, []string{`"tunName": got "tun%d"`, `"%"`}, 0},
		{"wireQueueLen below -1", map[string]any{"wireQueueLen": -2}, []string{`"wireQueueLen": got -2`, "-1 for no queue"}, 0},
		{"maxUDP negative", map[string]any{"maxUDP": -1}, []string{`"maxUDP": got -1`, "non-negative"}, 0},
		{"readyTimeout zero", map[string]any{"readyTimeout": "0s"}, []string{`"readyTimeout": got "0s"`, "positive duration"}, 0},
		{"runDir too long for the socket", map[string]any{"runDir": longRunDir},
			[]string{`"runDir": got "` + longRunDir + `", 86 bytes long`, "at most 85 bytes", "control socket"}, 0},
		{"logDir relative", map[string]any{"logDir": "log"}, []string{`"logDir": got "log"`, "absolute path"}, 0},
		{"kubeconfig relative", map[string]any{"kubeconfig": "kubeconfig"}, []string{`"kubeconfig": got "kubeconfig"`, "absolute path"}, 0},
		{"nodeName upper case", map[string]any{"nodeName": "Node1"}, []string{`"nodeName": got "Node1"`, "Kubernetes node name"}, 0},
		{"ipam wrong type", map[string]any{"ipam": "host-local"}, []string{`"ipam": got "host-local" (a string)`, `{"type": "host-local", ...}`}, 0},
		{"ipam type is a path", map[string]any{"ipam": map[string]any{"type": "../host-local"}}, []string{`"ipam"`, `"../host-local"`, "naming the IPAM plugin"}, 0},
		{"mtu too small for IPv6", map[string]any{"mtu": 1000}, []string{`"mtu": got 1000`, "1280..65535", "IPv6", env.Subnet6}, 0},
		{"runtimeConfig wrong type", map[string]any{"runtimeConfig": []any{"x"}}, []string{`"runtimeConfig": got ["x"] (an array)`}, 0},
		// skel refuses it before Parse; Parse refuses it for other callers.
		{"name missing", map[string]any{"name": nil}, []string{"missing network name"}, 0},
		{"no ipam and no prevResult", map[string]any{"ipam": nil}, []string{`no "ipam" section and no prevResult`}, 0},
		{"cniVersion unknown", map[string]any{"cniVersion": "9.9.9"}, []string{"incompatible CNI versions"}, types.ErrIncompatibleCNIVersion},
	} {
		t.Run(c.name, func(t *testing.T) {
			te := addFails(t, env, env.Conf(latest, c.extra), "badkey")
			code := c.code
			if code == 0 {
				code = types.ErrInvalidNetworkConfig
			}
			wantCode(t, te, code)
			wantMessage(t, te.Msg, c.parts...)
		})
	}
	// DEL takes what it can read from a configuration Parse refuses (the
	// pod may have been added before a rule existed, see
	// TestDelWithConfigNowRefused): a DEL of a pod never added succeeds
	// and changes nothing. JSON that is no object still fails (code 6,
	// from the CNI library before the plugin runs).
	if _, err := env.Exec("cni-usernet", "DEL", env.Conf(latest, map[string]any{"mtu": "big"}), "badkey", nettest.NewNS(t), "eth0"); err != nil {
		t.Errorf("DEL with a refused conflist of a pod never added: %v", err)
	}
	if _, err := env.Exec("cni-usernet", "DEL", []byte(`["not an object"]`), "badkey", nettest.NewNS(t), "eth0"); err == nil {
		t.Error("DEL with a conflist that is not a JSON object: got success, want code 6")
	} else {
		wantCode(t, cniErr(t, err), types.ErrDecodingFailure)
	}
	env.AssertNoLeaks(t)
}

// TestAddBadNetns gives ADD a CNI_NETNS that is missing, or exists but is
// no network namespace: code 8 (ErrInvalidNetNS) naming the path and
// saying what is wanted, before any lease or link is made.
func TestAddBadNetns(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	file := filepath.Join(env.Dir, "not-a-netns")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(env.Dir, "a-directory")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path string
		parts      []string
	}{
		{"missing", "/var/run/netns/cni-usernet-test-never-made", []string{"does not exist"}},
		{"regular file", file, []string{"is not a namespace"}},
		{"directory", dir, []string{"is not a namespace"}},
		{"mount namespace", "/proc/self/ns/mnt", []string{"is a mount namespace"}},
		{"PID namespace", "/proc/self/ns/pid", []string{"is a PID namespace"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := env.ExecNetns("cni-usernet", "ADD", conf, "badnetns", c.path, "eth0")
			if err == nil {
				env.ExecNetns("cni-usernet", "DEL", conf, "badnetns", c.path, "eth0")
				t.Fatalf("ADD: got result %s, want an error", out)
			}
			te := cniErr(t, err)
			wantCode(t, te, types.ErrInvalidNetNS)
			wantMessage(t, te.Msg, append(c.parts, "CNI_NETNS", `"`+c.path+`"`, "pod's network namespace")...)
			env.AssertNoLeaks(t)
			// The runtime's DEL after the failed ADD must succeed too.
			if _, err := env.ExecNetns("cni-usernet", "DEL", conf, "badnetns", c.path, "eth0"); err != nil {
				t.Errorf("DEL after the failed ADD: %v", err)
			}
			env.AssertNoLeaks(t)
		})
	}
}

// linkState is what the test compares of a link to say it is untouched.
type linkState struct {
	Index int
	Type  string
	Up    bool
	Addrs []string
}

func linkStateOf(t *testing.T, netns ns.NetNS, name string) linkState {
	t.Helper()
	var s linkState
	err := nettest.In(netns, func() error {
		l, err := netlinksafe.LinkByName(name)
		if err != nil {
			return err
		}
		s = linkState{Index: l.Attrs().Index, Type: l.Type(), Up: l.Attrs().Flags&net.FlagUp != 0}
		addrs, err := netlinksafe.AddrList(l, netlink.FAMILY_V4)
		for _, a := range addrs {
			s.Addrs = append(s.Addrs, a.IPNet.String())
		}
		return err
	})
	if err != nil {
		t.Fatalf("reading link %s: %v", name, err)
	}
	return s
}

// TestAddInterfaceExists pre-creates the pod's eth0 (standalone mode makes
// it itself): ADD fails saying what is there and what to do, before taking
// a lease; eth0 is untouched, also by the runtime's DEL that follows.
func TestAddInterfaceExists(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	for _, c := range []struct {
		name  string
		make  func() error
		links []string // the pod namespace holds these, before and after
	}{
		// This kernel has no dummy links; a bridge is as foreign.
		{"bridge", func() error {
			return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}})
		}, []string{"link eth0"}},
		{"veth", func() error {
			return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "other0"})
		}, []string{"link eth0", "link other0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			pod := nettest.NewNS(t)
			err := nettest.In(pod, func() error {
				if err := c.make(); err != nil {
					return err
				}
				l, err := netlinksafe.LinkByName("eth0")
				if err != nil {
					return err
				}
				// TEST-NET-1, inside this namespace only.
				addr, _ := netlink.ParseAddr("192.0.2.5/24")
				if err := netlink.AddrAdd(l, addr); err != nil {
					return err
				}
				return netlink.LinkSetUp(l)
			})
			if err != nil {
				t.Fatalf("making eth0 in the pod: %v", err)
			}
			before := linkStateOf(t, pod, "eth0")

			out, err := env.Exec("cni-usernet", "ADD", conf, "ifexists", pod, "eth0")
			if err == nil {
				t.Fatalf("ADD: got result %s, want an error", out)
			}
			te := cniErr(t, err)
			wantCode(t, te, types.ErrInternal)
			wantMessage(t, te.Msg, `interface "eth0" already exists`, pod.Path(), "a "+c.name+" link", "192.0.2.5/24",
				"remove it", "CNI_IFNAME", "chain")
			env.AssertNoLeaks(t)
			assertNSClean(t, pod, c.links...)
			if after := linkStateOf(t, pod, "eth0"); !slices.Equal(after.Addrs, before.Addrs) || after.Index != before.Index ||
				after.Type != before.Type || after.Up != before.Up {
				t.Errorf("eth0 after the failed ADD: got %+v, want it untouched: %+v", after, before)
			}

			// Runtimes DEL after a failed ADD; eth0 is not this attachment's.
			if err := env.Del(conf, "ifexists", pod); err != nil {
				t.Fatalf("DEL after the failed ADD: %v", err)
			}
			env.AssertNoLeaks(t)
			assertNSClean(t, pod, c.links...)
			if after := linkStateOf(t, pod, "eth0"); after.Index != before.Index || !slices.Equal(after.Addrs, before.Addrs) {
				t.Errorf("eth0 after DEL: got %+v, want it untouched: %+v", after, before)
			}
		})
	}
}

// badStates are state files ADD, CHECK and status cannot read.
var badStates = []struct {
	name    string
	content func(t *testing.T, good []byte) []byte
	parts   []string
}{
	{"garbage", func(*testing.T, []byte) []byte { return []byte("\x00\xffnot json{{") }, []string{"is corrupt"}},
	{"truncated", func(_ *testing.T, good []byte) []byte { return good[:len(good)/2] }, []string{"is corrupt"}},
	{"version 0", func(t *testing.T, good []byte) []byte { return withVersion(t, good, 0) }, []string{"has version 0", "reads 1"}},
	{"no version", func(t *testing.T, good []byte) []byte { return withVersion(t, good, -1) }, []string{"has version 0", "reads 1"}},
}

// withVersion rewrites a state file's version; -1 removes the key, as
// files written before versions existed.
func withVersion(t *testing.T, good []byte, v int) []byte {
	var m map[string]any
	if err := json.Unmarshal(good, &m); err != nil {
		t.Fatal(err)
	}
	if v < 0 {
		delete(m, "version")
	} else {
		m["version"] = v
	}
	b, _ := json.Marshal(m)
	return b
}

func statePath(env *nettest.Env, id string) string {
	return filepath.Join(env.Dir, "state", state.Key(id, "eth0")+".json")
}

// TestStateFileUnreadable spoils an attachment's state file: ADD and
// CHECK fail naming the file and the way out, `cni-usernet status` lists
// it as unreadable beside the healthy pods, and DEL still undoes the
// attachment from its arguments: stack, veth, lease, files.
func TestStateFileUnreadable(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	healthy := env.NewPod(conf)
	good, err := os.ReadFile(statePath(env, healthy.ID))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range badStates {
		t.Run(c.name, func(t *testing.T) {
			pod := env.NewPod(conf)
			att := loadState(t, env, pod.ID)
			path := statePath(env, pod.ID)
			if err := os.WriteFile(path, c.content(t, good), 0o600); err != nil {
				t.Fatal(err)
			}

			_, err := env.Exec("cni-usernet", "ADD", conf, pod.ID, pod.NS, "eth0")
			if err == nil {
				t.Fatal("ADD over an unreadable state file: got success, want an error")
			}
			te := cniErr(t, err)
			wantCode(t, te, types.ErrDecodingFailure)
			wantMessage(t, te.Msg, append(c.parts, path, "run DEL for container "+pod.ID+" interface eth0 first", "remove the file")...)

			err = env.Check(nettest.WithPrevResult(t, conf, pod.Result), pod.ID, pod.NS)
			if err == nil {
				t.Fatal("CHECK with an unreadable state file: got success, want an error")
			}
			te = cniErr(t, err)
			wantCode(t, te, types.ErrDecodingFailure)
			wantMessage(t, te.Msg, append(c.parts, path, "run DEL")...)

			table := string(runStatus(t, env))
			if !strings.Contains(table, shortID(healthy.ID)) || !strings.Contains(table, "yes") {
				t.Errorf("status:\n%s\nwant the healthy pod %s listed as healthy", table, healthy.ID)
			}
			if !strings.Contains(table, "unreadable: ") || !strings.Contains(table, path) {
				t.Errorf("status:\n%s\nwant %s listed as unreadable", table, path)
			}
			var rows []statusRow
			if err := json.NewDecoder(strings.NewReader(string(runStatus(t, env, "--json")))).Decode(&rows); err != nil {
				t.Errorf("status --json: %v", err)
			} else if len(rows) != 1 || rows[0].ContainerID != healthy.ID || !rows[0].Healthy {
				t.Errorf("status --json rows: got %+v, want only the healthy pod %s", rows, healthy.ID)
			}

			if err := env.Del(conf, pod.ID, pod.NS); err != nil {
				t.Fatalf("DEL with an unreadable state file: %v", err)
			}
			if launch.Alive(launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}) {
				t.Errorf("stack %d still running after DEL", att.StackPID)
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("state file after DEL: got %v, want it removed", err)
			}
			assertNSClean(t, pod.NS)
			assertOnlyPod(t, env, healthy)
		})
	}
	if err := env.Check(nettest.WithPrevResult(t, conf, healthy.Result), healthy.ID, healthy.NS); err != nil {
		t.Errorf("CHECK of the healthy pod: %v", err)
	}
	if err := env.Del(conf, healthy.ID, healthy.NS); err != nil {
		t.Fatalf("DEL of the healthy pod: %v", err)
	}
	env.AssertNoLeaks(t)
}

// TestAddOverUnreadableState writes a bad state file for an attachment
// never added: ADD refuses it before touching anything, and the DEL it
// recommends clears the way for an ADD that works.
func TestAddOverUnreadableState(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	const id = "stale"
	pod := nettest.NewNS(t)
	path := statePath(env, id)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(`{"containerID": "stale", "ifName": "eth0"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := env.Exec("cni-usernet", "ADD", conf, id, pod, "eth0")
	if err == nil {
		env.Del(conf, id, pod)
		t.Fatal("ADD over an old state file: got success, want an error")
	}
	te := cniErr(t, err)
	wantCode(t, te, types.ErrDecodingFailure)
	wantMessage(t, te.Msg, path, "has version 0", "run DEL")
	if got := env.Leaks(); !slices.Equal(got, []string{"file state/" + filepath.Base(path)}) {
		t.Errorf("after the refused ADD the node holds %v, want only the old state file", got)
	}
	assertNSClean(t, pod)
	if err := env.Del(conf, id, pod); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	env.AssertNoLeaks(t)
	if _, err := env.Add(conf, id, pod); err != nil {
		t.Fatalf("ADD after DEL: %v", err)
	}
	if err := env.Del(conf, id, pod); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	env.AssertNoLeaks(t)
}

// TestStateFileNotReadable puts a directory where the state file belongs:
// reading it is an I/O error (code 5), not a decoding one, and DEL still
// removes it.
func TestStateFileNotReadable(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	const id = "statedir"
	pod := nettest.NewNS(t)
	path := statePath(env, id)
	if err := os.MkdirAll(path, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := env.Exec("cni-usernet", "ADD", conf, id, pod, "eth0")
	if err == nil {
		env.Del(conf, id, pod)
		t.Fatal("ADD with a directory for a state file: got success, want an error")
	}
	te := cniErr(t, err)
	wantCode(t, te, types.ErrIOFailure)
	wantMessage(t, te.Msg, path, "is a directory", "run DEL")
	assertNSClean(t, pod)
	if err := env.Del(conf, id, pod); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	env.AssertNoLeaks(t)
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// footprint is what an attached pod holds on the node, as env.Leaks
// names it.
func footprint(t *testing.T, env *nettest.Env, p *nettest.Pod) []string {
	t.Helper()
	att := loadState(t, env, p.ID)
	key := state.Key(p.ID, "eth0")
	want := []string{
		"link " + att.HostVeth,
		"file state/" + key + ".json",
		"file state/stacks/" + key,
		"file run/" + key + ".sock",
		"file run/netns/cni-usernet-" + key,
		fmt.Sprintf("stack process %d", att.StackPID),
	}
	if r := att.SocketRedirect; r != nil && r.On {
		want = append(want, fmt.Sprintf("socket redirect of netns cookie %d", r.NetnsCookie))
	}
	for _, a := range podAddrs(p.Result) {
		want = append(want, "lease "+a.Addr().String())
	}
	slices.Sort(want)
	return want
}

// assertOnlyPod fails unless what the node holds is exactly p's.
func assertOnlyPod(t *testing.T, env *nettest.Env, p *nettest.Pod) {
	t.Helper()
	want := footprint(t, env, p)
	var got []string
	for range 50 { // a stopped stack may take a moment to go
		if got = env.Leaks(); slices.Equal(got, want) {
			return
		}
		sleep()
	}
	t.Errorf("the node holds %v, want only %s's %v", got, p.ID, want)
}

// mountTmpfs mounts a tmpfs of size on dir, unmounted at cleanup (before
// the env's directory is removed: cleanups run last-in first-out).
func mountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size="+size+",mode=0700"); err != nil {
		t.Fatalf("mounting a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
}

// fill writes into dir until the file system is full.
func fill(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: got %v, want ENOSPC", dir, err)
			}
			return
		}
	}
}

// TestStateDirFull puts the state directory on a tiny tmpfs and fills it:
// ADD fails with code 5 naming the directory and the full disk, and leaves
// no veth, lease, stack, TUN or file; a pod added before still works, and
// its DEL, which only removes, succeeds on the full disk.
func TestStateDirFull(t *testing.T) {
	env := nettest.NewEnv(t)
	stateDir := filepath.Join(env.Dir, "state")
	mountTmpfs(t, stateDir, "64k")
	conf := env.Conf(latest, nil)
	before := env.NewPod(conf)
	fill(t, stateDir)

	pod := nettest.NewNS(t)
	out, err := env.Exec("cni-usernet", "ADD", conf, "diskfull", pod, "eth0")
	if err == nil {
		env.Del(conf, "diskfull", pod)
		t.Fatalf("ADD on a full disk: got result %s, want an error", out)
	}
	te := cniErr(t, err)
	wantCode(t, te, types.ErrIOFailure)
	wantMessage(t, te.Msg, "state directory "+stateDir, "no space left on device", `"stateDir"`)
	assertOnlyPod(t, env, before)
	assertNSClean(t, pod)

	if err := env.Check(nettest.WithPrevResult(t, conf, before.Result), before.ID, before.NS); err != nil {
		t.Errorf("CHECK of the pod added before the disk filled: %v", err)
	}
	if err := env.Del(conf, before.ID, before.NS); err != nil {
		t.Fatalf("DEL on a full disk: %v", err)
	}
	env.AssertNoLeaks(t)
	assertNSClean(t, before.NS)
	if err := os.Remove(filepath.Join(stateDir, "filler")); err != nil {
		t.Fatal(err)
	}
	// With room again, the same attachment works.
	if _, err := env.Add(conf, "diskfull", pod); err != nil {
		t.Fatalf("ADD with room again: %v", err)
	}
	if err := env.Del(conf, "diskfull", pod); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	env.AssertNoLeaks(t)
}

// TestConcurrentAddSameAttachment runs two ADDs of one attachment at once,
// a few times: the attachment lock lets exactly one build it, the other
// gets "already attached" and undoes nothing of the winner's; one DEL then
// leaves nothing.
func TestConcurrentAddSameAttachment(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, nil)
	for round := range 3 {
		id := fmt.Sprintf("twice-%d", round)
		pod := nettest.NewNS(t)
		t.Cleanup(func() { env.Del(conf, id, pod) })
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() { _, errs[i] = env.Add(conf, id, pod) })
		}
		wg.Wait()
		var failed []error
		for _, err := range errs {
			if err != nil {
				failed = append(failed, err)
			}
		}
		if len(failed) != 1 {
			t.Fatalf("round %d: got errors %v, want exactly one ADD to fail", round, errs)
		}
		te := cniErr(t, failed[0])
		wantMessage(t, te.Msg, id, "eth0", "already attached", "DEL it")
		if got := len(env.StackPIDs()); got != 1 {
			t.Errorf("round %d: stack processes: got %d, want 1", round, got)
		}
		att := loadState(t, env, id)
		if err := env.Check(nettest.WithPrevResult(t, conf, mustResult(t, att)), id, pod); err != nil {
			t.Errorf("round %d: CHECK of the winner: %v", round, err)
		}
		if err := env.Del(conf, id, pod); err != nil {
			t.Fatalf("round %d: DEL: %v", round, err)
		}
		env.AssertNoLeaks(t)
		assertNSClean(t, pod)
	}
}

func sleep() { time.Sleep(100 * time.Millisecond) }

// mustResult decodes the ADD result a state file recorded.
func mustResult(t *testing.T, att *state.Attachment) *current.Result {
	t.Helper()
	var r current.Result
	if err := json.Unmarshal(att.Result, &r); err != nil {
		t.Fatalf("decoding the recorded result %s: %v", att.Result, err)
	}
	return &r
}
