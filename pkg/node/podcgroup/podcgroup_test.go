package podcgroup

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	uid      = "0f9a6c1e-2b3d-4e5f-8a9b-0c1d2e3f4a5b"
	uidSD    = "0f9a6c1e_2b3d_4e5f_8a9b_0c1d2e3f4a5b"
	otherUID = "11111111-2222-3333-4444-555555555555"
)

// tree is a fake cgroup mount in a temporary directory: v2 (one
// hierarchy with cgroup.controllers at its top) or v1 (cpu,cpuacct and
// memory hierarchies, with cpu and cpuacct as links, as systemd mounts
// them).
type tree struct {
	t    *testing.T
	root string
	dirs []string
}

func newTree(t *testing.T, v2 bool) *tree {
	t.Helper()
	tr := &tree{t: t, root: t.TempDir()}
	if v2 {
		tr.dirs = []string{""}
		tr.file("cgroup.controllers")
	} else {
		tr.dirs = []string{"cpu,cpuacct", "memory"}
		for _, link := range []string{"cpu", "cpuacct"} {
			if err := os.Symlink("cpu,cpuacct", filepath.Join(tr.root, link)); err != nil {
				t.Fatal(err)
			}
		}
		// A hierarchy that does not account a stack: not looked in.
		tr.mkdirIn("pids", "")
	}
	for _, d := range tr.dirs {
		tr.mkdirIn(d, "")
	}
	return tr
}

func (tr *tree) file(rel string) {
	tr.t.Helper()
	p := filepath.Join(tr.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		tr.t.Fatal(err)
	}
}

// mkdirIn makes rel a cgroup in hierarchy d: every level gets its
// cgroup.procs, as on a cgroup file system.
func (tr *tree) mkdirIn(d, rel string) {
	tr.t.Helper()
	p := filepath.Join(tr.root, d)
	for _, c := range append([]string{""}, strings.Split(rel, "/")...) {
		p = filepath.Join(p, c)
		if err := os.MkdirAll(p, 0o755); err != nil {
			tr.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "cgroup.procs"), nil, 0o644); err != nil {
			tr.t.Fatal(err)
		}
	}
}

// cgroup makes rel a cgroup in every hierarchy.
func (tr *tree) cgroup(rels ...string) *tree {
	tr.t.Helper()
	for _, rel := range rels {
		for _, d := range tr.dirs {
			tr.mkdirIn(d, rel)
		}
	}
	return tr
}

var layouts = []struct {
	name string
	v2   bool
}{{"v2", true}, {"v1", false}}

// The pod cgroups kubelet makes, per driver and QoS class.
var (
	cgroupfsPods = map[string]string{
		"burstable":  "kubepods/burstable/pod" + uid,
		"besteffort": "kubepods/besteffort/pod" + uid,
		"guaranteed": "kubepods/pod" + uid,
	}
	systemdPods = map[string]string{
		"burstable":  "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uidSD + ".slice",
		"besteffort": "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidSD + ".slice",
		"guaranteed": "kubepods.slice/kubepods-pod" + uidSD + ".slice",
	}
)

// TestFindRuntimePath: every form in which runtimes pass the pod's
// cgroup leads to the pod-level cgroup, on v1 and v2.
func TestFindRuntimePath(t *testing.T) {
	const cid = "5d2b7c1e9f3a4b6c8d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e"
	for _, lay := range layouts {
		for _, c := range []struct {
			name, value, want string
		}{
			{"cgroupfs burstable", "/kubepods/burstable/pod" + uid, cgroupfsPods["burstable"]},
			{"cgroupfs besteffort", "/kubepods/besteffort/pod" + uid, cgroupfsPods["besteffort"]},
			{"cgroupfs guaranteed", "/kubepods/pod" + uid, cgroupfsPods["guaranteed"]},
			{"cgroupfs relative, unclean", "kubepods//burstable/./pod" + uid + "/", cgroupfsPods["burstable"]},
			{"cgroupfs container cut to its pod", "/kubepods/burstable/pod" + uid + "/" + cid, cgroupfsPods["burstable"]},
			{"cgroupfs under --cgroup-root", "/kubelet/kubepods/burstable/pod" + uid, "kubelet/" + cgroupfsPods["burstable"]},
			{"systemd path", "/" + systemdPods["burstable"], systemdPods["burstable"]},
			{"systemd guaranteed path", "/" + systemdPods["guaranteed"], systemdPods["guaranteed"]},
			{"systemd slice name", "kubepods-burstable-pod" + uidSD + ".slice", systemdPods["burstable"]},
			{"systemd besteffort slice name", "kubepods-besteffort-pod" + uidSD + ".slice", systemdPods["besteffort"]},
			{"systemd guaranteed slice name", "kubepods-pod" + uidSD + ".slice", systemdPods["guaranteed"]},
			{"systemd slice:prefix:name", "kubepods-burstable-pod" + uidSD + ".slice:cri-containerd:" + cid, systemdPods["burstable"]},
			{"systemd container scope cut to its pod", "/" + systemdPods["burstable"] + "/cri-containerd-" + cid + ".scope", systemdPods["burstable"]},
			{"systemd under --cgroup-root", "kubelet-kubepods-burstable-pod" + uidSD + ".slice",
				"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod" + uidSD + ".slice"},
		} {
			t.Run(lay.name+"/"+c.name, func(t *testing.T) {
				tr := newTree(t, lay.v2).cgroup(c.want)
				for _, podUID := range []string{uid, ""} {
					loc, err := Find(Query{Root: tr.root, RuntimePath: c.value, PodUID: podUID})
					if err != nil {
						t.Fatalf("Find(%q, uid %q): %v", c.value, podUID, err)
					}
					if loc.Path != c.want || loc.Source != SourceRuntime || loc.V2 != lay.v2 {
						t.Errorf("Find(%q, uid %q): got %+v, want path %s from the runtime, v2 %v", c.value, podUID, loc, c.want, lay.v2)
					}
				}
			})
		}
	}
}

// TestFindRuntimePathRefused: each rule refuses what breaks it, and the
// error names the value, where it led and the rule.
func TestFindRuntimePathRefused(t *testing.T) {
	for _, lay := range layouts {
		for _, c := range []struct {
			name, value string
			setup       func(tr *tree)
			rule        Rule
			// mention is a part of the error besides the value and rule.
			mention string
		}{
			{name: "dot-dot out of kubepods", value: "/kubepods/burstable/../../system.slice/containerd.service", rule: RuleNoDotDot},
			{name: "dot-dot back into kubepods", value: "/kubepods/../kubepods/burstable/pod" + uid, rule: RuleNoDotDot},
			{name: "outside kubepods", value: "/system.slice/containerd.service", rule: RuleInKubepods, mention: "/system.slice/containerd.service"},
			{name: "a slice outside kubepods", value: "system-foo.slice", rule: RuleInKubepods, mention: "/system.slice/system-foo.slice"},
			{name: "the kubepods cgroup itself", value: "/kubepods", rule: RulePodLevel},
			{name: "a QoS class", value: "/kubepods/burstable", rule: RulePodLevel, mention: "/kubepods/burstable"},
			{name: "not a pod below kubepods", value: "/kubepods/burstable/cni-usernet-stacks", rule: RulePodLevel},
			{name: "a pod with a UID that makes a path", value: "/kubepods/burstable/pod..", rule: RulePodLevel},
			{name: "systemd pod in a cgroupfs class", value: "/kubepods/burstable/kubepods-burstable-pod" + uidSD + ".slice", rule: RulePodLevel},
			{name: "another pod's", value: "/kubepods/burstable/pod" + otherUID, rule: RuleSamePod, mention: "K8S_POD_UID is " + uid,
				setup: func(tr *tree) { tr.cgroup("kubepods/burstable/pod" + otherUID) }},
			{name: "another pod's, systemd", value: "kubepods-pod" + strings.ReplaceAll(otherUID, "-", "_") + ".slice", rule: RuleSamePod, mention: "it is pod " + otherUID + "'s"},
			{name: "missing", value: "/kubepods/besteffort/pod" + uid, rule: RuleExists, mention: "kubepods/besteffort/pod" + uid},
			{name: "a file instead of a directory", value: "/kubepods/burstable/pod" + uid, rule: RuleDirectory, mention: "regular file",
				setup: func(tr *tree) {
					for _, d := range tr.dirs {
						tr.mkdirIn(d, "kubepods/burstable")
						tr.file(filepath.Join(d, "kubepods/burstable/pod"+uid))
					}
				}},
			{name: "a directory that is no cgroup", value: "/kubepods/pod" + uid, rule: RuleCgroup, mention: "without cgroup.procs",
				setup: func(tr *tree) {
					for _, d := range tr.dirs {
						tr.mkdirIn(d, "kubepods")
						os.Mkdir(filepath.Join(tr.root, d, "kubepods/pod"+uid), 0o755)
					}
				}},
			{name: "slice:prefix:name with a field missing", value: "kubepods-pod" + uidSD + ".slice:cri-containerd", rule: RuleSystemdForm},
			{name: "slice:prefix:name without a slice", value: ":cri-containerd:abc", rule: RuleSystemdForm},
			{name: "slice name with an empty component", value: "kubepods--pod" + uidSD + ".slice", rule: RuleSystemdForm},
			{name: "slice name without a name", value: ".slice", rule: RuleSystemdForm},
		} {
			t.Run(lay.name+"/"+c.name, func(t *testing.T) {
				tr := newTree(t, lay.v2).cgroup("kubepods/burstable", "kubepods.slice")
				if c.setup != nil {
					c.setup(tr)
				}
				loc, err := Find(Query{Root: tr.root, RuntimePath: c.value, PodUID: uid})
				var re *RefusedError
				if !errors.As(err, &re) {
					t.Fatalf("Find(%q): got %+v, %v, want a *RefusedError", c.value, loc, err)
				}
				if re.Rule != c.rule {
					t.Errorf("Find(%q): rule %q, want %q (%v)", c.value, re.Rule, c.rule, err)
				}
				if errors.Is(err, ErrNotFound) {
					t.Errorf("Find(%q): a refusal is ErrNotFound; the caller would fall back instead of refusing", c.value)
				}
				msg := err.Error()
				for _, want := range []string{`"` + c.value + `"`, "must " + string(c.rule), c.mention} {
					if !strings.Contains(msg, want) {
						t.Errorf("error %q: got no %q in it", msg, want)
					}
				}
			})
		}
	}
}

// TestFindRuntimePathV1AllHierarchies: on v1 a pod's cgroup must be in
// every accounting hierarchy; the error names the one it is missing from.
func TestFindRuntimePathV1AllHierarchies(t *testing.T) {
	tr := newTree(t, false)
	tr.mkdirIn("cpu,cpuacct", "kubepods/pod"+uid)
	tr.mkdirIn("memory", "kubepods")
	_, err := Find(Query{Root: tr.root, RuntimePath: "/kubepods/pod" + uid})
	var re *RefusedError
	if !errors.As(err, &re) || re.Rule != RuleExists {
		t.Fatalf("got %v, want a refusal by %q", err, RuleExists)
	}
	if want := filepath.Join(tr.root, "memory/kubepods/pod"+uid); re.Path != want {
		t.Errorf("refused path %s, want %s", re.Path, want)
	}
}

// TestFindByUID: without a runtime path the pod's cgroup is found by its
// UID, with either driver, in every QoS class, on v1 and v2, and under a
// kubelet --cgroup-root.
func TestFindByUID(t *testing.T) {
	for _, lay := range layouts {
		for driver, pods := range map[string]map[string]string{"cgroupfs": cgroupfsPods, "systemd": systemdPods} {
			for class, rel := range pods {
				t.Run(lay.name+"/"+driver+"/"+class, func(t *testing.T) {
					// Another pod beside it, and the other classes' cgroups.
					tr := newTree(t, lay.v2).cgroup(rel, strings.ReplaceAll(rel, uid, otherUID), strings.ReplaceAll(rel, uidSD, strings.ReplaceAll(otherUID, "-", "_")))
					for _, runtimePath := range []string{"", "/"} {
						loc, err := Find(Query{Root: tr.root, RuntimePath: runtimePath, PodUID: uid})
						if err != nil {
							t.Fatalf("Find(uid, runtime path %q): %v", runtimePath, err)
						}
						if loc.Path != rel || loc.Source != SourcePodUID {
							t.Errorf("Find(uid, runtime path %q): got %+v, want %s by pod UID", runtimePath, loc, rel)
						}
					}
				})
			}
		}
	}
	t.Run("under --cgroup-root", func(t *testing.T) {
		for _, rel := range []string{
			"kubelet/kubepods/burstable/pod" + uid,
			"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + uidSD + ".slice",
		} {
			tr := newTree(t, true).cgroup(rel)
			loc, err := Find(Query{Root: tr.root, PodUID: uid})
			if err != nil || loc.Path != rel {
				t.Errorf("got %+v, %v, want %s", loc, err, rel)
			}
		}
	})
}

// TestFindByUIDNotFound: whatever keeps the pod's cgroup from being found
// is ErrNotFound, which the caller turns into a fallback, never a
// refusal.
func TestFindByUIDNotFound(t *testing.T) {
	for _, c := range []struct {
		name    string
		tree    func(t *testing.T) *tree
		podUID  string
		mention string
	}{
		{"no UID", func(t *testing.T) *tree { return newTree(t, true).cgroup(cgroupfsPods["burstable"]) }, "", "no pod UID"},
		{"UID that makes a path", func(t *testing.T) *tree { return newTree(t, true).cgroup("kubepods") }, "../../x", "not a UID"},
		{"another pod only", func(t *testing.T) *tree {
			return newTree(t, true).cgroup(strings.ReplaceAll(cgroupfsPods["burstable"], uid, otherUID))
		}, uid, "no pod" + uid + " or *-pod" + uidSD + ".slice"},
		{"no kubepods", func(t *testing.T) *tree { return newTree(t, false).cgroup("system.slice") }, uid, "no kubepods cgroup"},
		{"no cgroup mount", func(t *testing.T) *tree { return &tree{t: t, root: t.TempDir()} }, uid, "no cgroup v2 hierarchy"},
		{"a file where the pod's cgroup would be", func(t *testing.T) *tree {
			tr := newTree(t, true).cgroup("kubepods/burstable")
			tr.file("kubepods/burstable/pod" + uid)
			return tr
		}, uid, "no pod" + uid},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := c.tree(t)
			loc, err := Find(Query{Root: tr.root, PodUID: c.podUID})
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("got %+v, %v, want ErrNotFound", loc, err)
			}
			if !strings.Contains(err.Error(), c.mention) {
				t.Errorf("error %q: got no %q in it", err, c.mention)
			}
		})
	}
}

// TestNodeAndPrepare: the node-level cgroup lies under whichever kubepods
// tree the node has and is created in every accounting hierarchy; a pod's
// cgroup gets the stack's leaf on v2 and is joined as it is on v1; a
// second Prepare changes nothing.
func TestNodeAndPrepare(t *testing.T) {
	for _, lay := range layouts {
		for _, kubepods := range []string{"kubepods", "kubepods.slice"} {
			t.Run(lay.name+"/"+kubepods, func(t *testing.T) {
				tr := newTree(t, lay.v2).cgroup(kubepods)
				loc, err := Node(tr.root)
				if err != nil {
					t.Fatal(err)
				}
				want := kubepods + "/" + NodeCgroup
				if loc.Path != want || loc.Source != SourceNode {
					t.Fatalf("Node: got %+v, want %s", loc, want)
				}
				for range 2 {
					join, err := Prepare(tr.root, loc)
					if err != nil || join != want {
						t.Fatalf("Prepare(node): got %q, %v, want %q", join, err, want)
					}
				}
				for _, d := range tr.dirs {
					if !isDir(filepath.Join(tr.root, d, want)) {
						t.Errorf("Prepare(node): no %s in hierarchy %q", want, d)
					}
				}
			})
		}
		t.Run(lay.name+"/pod", func(t *testing.T) {
			rel := systemdPods["burstable"]
			tr := newTree(t, lay.v2).cgroup(rel)
			loc, err := Find(Query{Root: tr.root, PodUID: uid})
			if err != nil {
				t.Fatal(err)
			}
			want := rel
			if lay.v2 {
				want = rel + "/" + StackLeaf
			}
			for range 2 {
				join, err := Prepare(tr.root, loc)
				if err != nil || join != want {
					t.Fatalf("Prepare(pod): got %q, %v, want %q", join, err, want)
				}
			}
			if leaf := filepath.Join(tr.root, tr.dirs[0], rel, StackLeaf); isDir(leaf) != lay.v2 {
				t.Errorf("%s exists: %v, want %v", leaf, isDir(leaf), lay.v2)
			}
		})
	}
	t.Run("no kubepods", func(t *testing.T) {
		tr := newTree(t, true).cgroup("system.slice")
		if loc, err := Node(tr.root); !errors.Is(err, ErrNotFound) {
			t.Errorf("Node: got %+v, %v, want ErrNotFound", loc, err)
		}
	})
	t.Run("pod cgroup gone before Prepare", func(t *testing.T) {
		tr := newTree(t, true).cgroup(cgroupfsPods["guaranteed"])
		loc, err := Find(Query{Root: tr.root, PodUID: uid})
		if err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(filepath.Join(tr.root, cgroupfsPods["guaranteed"]))
		if join, err := Prepare(tr.root, loc); err == nil || !strings.Contains(err.Error(), cgroupfsPods["guaranteed"]) {
			t.Errorf("Prepare: got %q, %v, want an error naming the cgroup", join, err)
		}
	})
}

func TestExpandSlice(t *testing.T) {
	for in, want := range map[string]string{
		"kubepods.slice":                   "/kubepods.slice",
		"kubepods-burstable-podab_c.slice": "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podab_c.slice",
		"-.slice":                          "/",
	} {
		if got, err := expandSlice(in); err != nil || got != want {
			t.Errorf("expandSlice(%q): got %q, %v, want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", ".slice", "a", "a-.slice", "-a.slice", "a/b.slice", "a--b.slice"} {
		if got, err := expandSlice(in); err == nil {
			t.Errorf("expandSlice(%q): got %q, want an error", in, got)
		}
	}
}
