package cni

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/node/podcgroup"
)

const (
	testPodUID   = "6b0c3c53-6f7e-4b39-9a4e-2f1d8c7b5a90"
	testPodUIDSD = "6b0c3c53_6f7e_4b39_9a4e_2f1d8c7b5a90"
)

// cgroupInv is an invocation of ADD for pod testPodUID, with the
// runtime's cgroupPath and the conflist's stackCgroup given.
func cgroupInv(runtimePath, stackCgroup string) *invocation {
	conf := &netconf.NetConf{StackCgroup: stackCgroup}
	conf.RuntimeConfig.CgroupPath = runtimePath
	inv := &invocation{conf: conf, log: slog.New(slog.DiscardHandler)}
	inv.pod.K8S_POD_UID = testPodUID
	return inv
}

// fakeCgroupMount is a cgroup mount in a temporary directory: v2, or v1
// with cpu,cpuacct and memory hierarchies; each rel a cgroup (a
// directory with cgroup.procs) in every hierarchy.
func fakeCgroupMount(t *testing.T, v2 bool, rels ...string) (root string, hierarchies []string) {
	t.Helper()
	root = t.TempDir()
	hierarchies = []string{"cpu,cpuacct", "memory"}
	if v2 {
		hierarchies = []string{""}
		if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range hierarchies {
		for _, rel := range append([]string{""}, rels...) {
			p := filepath.Join(root, h, rel)
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(p, "cgroup.procs"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root, hierarchies
}

// TestStackCgroup: where the stack is charged, for each way the pod's
// cgroup is known or not, on v1 and v2, with both drivers; a fallback
// comes with a note, the node's cgroup is created, the pod's leaf too on
// v2.
func TestStackCgroup(t *testing.T) {
	burstable := "kubepods/burstable/pod" + testPodUID
	guaranteedSD := "kubepods.slice/kubepods-pod" + testPodUIDSD + ".slice"
	for _, c := range []struct {
		name        string
		v2          bool
		tree        []string
		runtimePath string
		stackCgroup string
		// want is the path to join; created, whether it must have been
		// made; note, a part of the note ("" for none).
		want    string
		created bool
		note    string
	}{
		{name: "v2 cgroupfs runtime path", v2: true, tree: []string{burstable}, runtimePath: "/" + burstable,
			want: burstable + "/" + podcgroup.StackLeaf, created: true},
		{name: "v2 systemd runtime slice:prefix:name", v2: true, tree: []string{guaranteedSD},
			runtimePath: "kubepods-pod" + testPodUIDSD + ".slice:cri-containerd:0123abcd",
			want:        guaranteedSD + "/" + podcgroup.StackLeaf, created: true},
		{name: "v2 systemd by UID", v2: true, tree: []string{guaranteedSD},
			want: guaranteedSD + "/" + podcgroup.StackLeaf, created: true},
		{name: "v1 cgroupfs by UID", tree: []string{burstable}, want: burstable},
		{name: "v1 systemd runtime path", tree: []string{guaranteedSD}, runtimePath: "/" + guaranteedSD, want: guaranteedSD},
		{name: "v2 pod not found: the node's", v2: true, tree: []string{"kubepods/burstable"},
			want: "kubepods/" + podcgroup.NodeCgroup, created: true, note: "charged to the node (kubepods/cni-usernet-stacks): looking for the cgroup of pod " + testPodUID},
		{name: "v1 pod not found: the node's", tree: []string{"kubepods.slice"},
			want: "kubepods.slice/" + podcgroup.NodeCgroup, created: true, note: "charged to the node"},
		// No kubepods tree: no node kubelet runs pods on, so no pod to
		// warn; the plugin's log says it.
		{name: "no kubepods: where the plugin runs", v2: true, tree: []string{"system.slice"},
			want: "", note: ""},
		{name: "node chosen", v2: true, tree: []string{burstable}, runtimePath: "/" + burstable, stackCgroup: netconf.StackCgroupNode,
			want: "kubepods/" + podcgroup.NodeCgroup, created: true},
		{name: "node chosen, no kubepods", tree: []string{"system.slice"}, stackCgroup: netconf.StackCgroupNode,
			want: "", note: `"stackCgroup" is "node", but no kubepods cgroup`},
	} {
		t.Run(c.name, func(t *testing.T) {
			root, hierarchies := fakeCgroupMount(t, c.v2, c.tree...)
			stackCgroup := c.stackCgroup
			if stackCgroup == "" {
				stackCgroup = netconf.StackCgroupPod
			}
			path, note, err := cgroupInv(c.runtimePath, stackCgroup).stackCgroupUnder(root)
			if err != nil {
				t.Fatal(err)
			}
			if path != c.want {
				t.Errorf("path: got %q, want %q", path, c.want)
			}
			if c.note == "" && note != "" || !strings.Contains(note, c.note) {
				t.Errorf("note: got %q, want one with %q", note, c.note)
			}
			for _, h := range hierarchies {
				fi, err := os.Stat(filepath.Join(root, h, c.want))
				if c.want != "" && (err != nil || !fi.IsDir()) {
					t.Errorf("%s in hierarchy %q: %v, want a directory", c.want, h, err)
				}
			}
			if !c.created {
				if leaf := filepath.Join(root, hierarchies[0], c.want, podcgroup.StackLeaf); c.want != "" && pathExists(leaf) {
					t.Errorf("%s was created, want the pod's cgroup joined as it is", leaf)
				}
			}
		})
	}
}

func pathExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestStackCgroupRefused: a runtime cgroupPath that breaks a rule fails
// ADD with code 7, naming the path, the rule and the way out; nothing is
// created.
func TestStackCgroupRefused(t *testing.T) {
	for _, c := range []struct {
		name, runtimePath string
		rule              podcgroup.Rule
	}{
		{"outside kubepods", "/system.slice/containerd.service", podcgroup.RuleInKubepods},
		{"dot-dot", "/kubepods/burstable/../../system.slice", podcgroup.RuleNoDotDot},
		{"missing", "/kubepods/besteffort/pod" + testPodUID, podcgroup.RuleExists},
		{"another pod's", "/kubepods/burstable/pod11111111-2222-3333-4444-555555555555", podcgroup.RuleSamePod},
	} {
		t.Run(c.name, func(t *testing.T) {
			root, _ := fakeCgroupMount(t, true, "kubepods/burstable/pod"+testPodUID, "kubepods/burstable/pod11111111-2222-3333-4444-555555555555")
			path, note, err := cgroupInv(c.runtimePath, netconf.StackCgroupPod).stackCgroupUnder(root)
			var te *types.Error
			if !errors.As(err, &te) || te.Code != types.ErrInvalidNetworkConfig {
				t.Fatalf("got %q, %q, %v, want a CNI error of code %d", path, note, err, types.ErrInvalidNetworkConfig)
			}
			for _, want := range []string{`"` + c.runtimePath + `"`, string(c.rule), `"stackCgroup": "node"`} {
				if !strings.Contains(te.Msg, want) {
					t.Errorf("message %q: got no %q in it", te.Msg, want)
				}
			}
			for _, made := range []string{"kubepods/" + podcgroup.NodeCgroup, "kubepods/burstable/pod" + testPodUID + "/" + podcgroup.StackLeaf} {
				if pathExists(filepath.Join(root, made)) {
					t.Errorf("%s created for a refused path", made)
				}
			}
		})
	}
}
