// Package podcgroup finds the cgroup a pod's stack is charged to: the
// pod's own, from the runtime's cgroupPath or from the pod's UID, or
// cni-usernet's node-level cgroup under kubelet's kubepods tree.
package podcgroup

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultRoot is where the node mounts its cgroup hierarchies.
const DefaultRoot = "/sys/fs/cgroup"

// StackLeaf is the cgroup a stack gets inside its pod's on cgroup v2. The
// pod's cgroup itself cannot take it: kubelet's runtime enables
// controllers in its cgroup.subtree_control for the containers below, and
// v2 puts no process in such a cgroup (writing cgroup.procs fails with
// EBUSY). Its name holds no "pod", so kubelet, which takes any child of a
// QoS cgroup with "pod" in its name for a pod, never mistakes it; and as a
// child of the pod's cgroup it is removed with it (runc's removal, which
// kubelet uses, takes sub-cgroups first).
const StackLeaf = "cni-usernet"

// NodeCgroup is the cgroup, directly under the kubepods tree, that stacks
// are charged to when they are not charged to their pods. Under kubepods
// it is bounded by what kubelet gives all pods (node allocatable) and
// counted in kubelet's eviction, never by the container runtime's cgroup;
// no "pod" in its name for the reason given at StackLeaf.
const NodeCgroup = "cni-usernet-stacks"

// ErrNotFound is returned when there is no cgroup to charge a stack to:
// no pod cgroup for the UID, no kubepods tree, no cgroup hierarchy. The
// stack still serves the pod; the caller charges it elsewhere.
var ErrNotFound = errors.New("no such cgroup")

// Source says how a Location was found.
type Source string

const (
	// SourceRuntime: from the runtime's cgroupPath capability argument.
	SourceRuntime Source = "runtime cgroupPath"
	// SourcePodUID: found by the pod's UID (K8S_POD_UID).
	SourcePodUID Source = "pod UID"
	// SourceNode: cni-usernet's NodeCgroup.
	SourceNode Source = "node"
)

// Query is what the plugin knows about the pod's cgroup.
type Query struct {
	// Root is the cgroup mount. Zero: DefaultRoot.
	Root string
	// RuntimePath is the runtime's cgroupPath capability argument (the
	// pod sandbox's cgroup parent, as containerd ≥ 1.7.1 and CRI-O pass
	// it). Zero, or the hierarchy's root: the runtime said nothing.
	RuntimePath string
	// PodUID is CNI_ARGS' K8S_POD_UID: the pod whose cgroup is looked
	// up when the runtime passes no path, and the pod a passed path must
	// belong to. Zero: unknown.
	PodUID string
}

func (q Query) root() string {
	if q.Root == "" {
		return DefaultRoot
	}
	return q.Root
}

// Location is a cgroup found for a stack, not yet prepared (see Prepare).
type Location struct {
	// Path is the pod's cgroup (SourceRuntime, SourcePodUID) or
	// NodeCgroup (SourceNode), relative to the hierarchy roots,
	// slash-separated, without a leading slash.
	Path   string
	Source Source
	// V2 is true on a unified hierarchy, false on v1.
	V2 bool
	// dirs are the hierarchies Path was checked in (see layout).
	dirs []string
}

// layout is what a cgroup mount holds.
type layout struct {
	v2 bool
	// dirs are the hierarchies, relative to the root, where a pod's
	// cgroup must be: "" on v2; on v1 those of cpu, cpuacct and memory,
	// the controllers that account a stack (runtime and kubelet create a
	// pod's cgroup in every hierarchy; the join takes all that have it).
	dirs []string
}

func readLayout(root string) (layout, error) {
	if isFile(filepath.Join(root, "cgroup.controllers")) {
		return layout{v2: true, dirs: []string{""}}, nil
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return layout{}, fmt.Errorf("reading the cgroup mount %s: %v: %w", root, err, ErrNotFound)
	}
	var l layout
	for _, e := range entries {
		// A symlink (cpu -> cpu,cpuacct) names a hierarchy listed anyway.
		if !e.IsDir() {
			continue
		}
		for _, c := range strings.Split(e.Name(), ",") {
			if c == "cpu" || c == "cpuacct" || c == "memory" {
				l.dirs = append(l.dirs, e.Name())
				break
			}
		}
	}
	if len(l.dirs) == 0 {
		return layout{}, fmt.Errorf("no cgroup v2 hierarchy (cgroup.controllers) and no v1 cpu, cpuacct or memory hierarchy under %s: %w", root, ErrNotFound)
	}
	return l, nil
}

// Find returns the pod's cgroup: the runtime's cgroupPath when it passes
// one, checked against the rules (an error is then a *RefusedError), else
// the cgroup kubelet made for PodUID (ErrNotFound when there is none).
func Find(q Query) (Location, error) {
	root := q.root()
	l, err := readLayout(root)
	if err != nil {
		return Location{}, err
	}
	if strings.Trim(q.RuntimePath, "/") != "" {
		return fromRuntime(root, l, q)
	}
	return byUID(root, l, q.PodUID)
}

// Node returns NodeCgroup under the node's kubepods tree; ErrNotFound
// when the node has none (no kubelet, or one without per-QoS cgroups).
func Node(root string) (Location, error) {
	if root == "" {
		root = DefaultRoot
	}
	l, err := readLayout(root)
	if err != nil {
		return Location{}, err
	}
	trees := kubepodsTrees(filepath.Join(root, l.dirs[0]))
	if len(trees) == 0 {
		return Location{}, fmt.Errorf("no kubepods cgroup under %s: %w", filepath.Join(root, l.dirs[0]), ErrNotFound)
	}
	return Location{Path: path.Join(trees[0], NodeCgroup), Source: SourceNode, V2: l.v2, dirs: l.dirs}, nil
}

// Prepare makes loc ready for a stack to join and returns the path to
// join, relative to root: on v2, StackLeaf inside the pod's cgroup
// (created if missing), on v1 the pod's cgroup itself (v1 lets a process
// sit beside child cgroups, and a new child would need cpuset's cpus and
// mems copied); NodeCgroup, created if missing, in every hierarchy.
func Prepare(root string, loc Location) (string, error) {
	if root == "" {
		root = DefaultRoot
	}
	join := loc.Path
	switch {
	case loc.Source == SourceNode:
	case loc.V2:
		join = path.Join(loc.Path, StackLeaf)
	default:
		return join, nil
	}
	for _, d := range loc.dirs {
		p := filepath.Join(root, d, join)
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("creating the stacks' cgroup %s: %w", p, err)
		}
	}
	return join, nil
}

// RemoveLeaf removes the StackLeaf a stack was in, once it has exited:
// lines are its /proc/PID/cgroup lines at start (launch.Cgroups), read
// in the cgroup namespace of the caller, and root is that namespace's
// cgroup mount (zero: DefaultRoot), with the unified hierarchy at root
// or, on a hybrid node, at root/unified. Only a v2 cgroup named
// StackLeaf is removed: the pod's own cgroup is kubelet's, and
// NodeCgroup is shared by every stack charged to the node. Already gone
// is success; a leaf that still holds a process stays (EBUSY).
func RemoveLeaf(root string, lines []string) error {
	if root == "" {
		root = DefaultRoot
	}
	var errs []error
	for _, line := range lines {
		rel, ok := strings.CutPrefix(line, "0::")
		if !ok || path.Base(rel) != StackLeaf {
			continue
		}
		rel = strings.TrimPrefix(path.Clean("/"+rel), "/")
		if slices.Contains(strings.Split(rel, "/"), "..") {
			continue
		}
		for _, mount := range []string{root, filepath.Join(root, "unified")} {
			if !isFile(filepath.Join(mount, "cgroup.controllers")) {
				continue
			}
			p := filepath.Join(mount, rel)
			if err := unix.Rmdir(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("removing the stack's cgroup %s: %w", p, err))
			}
			break
		}
	}
	return errors.Join(errs...)
}

// byUID looks for the pod-level cgroup kubelet makes for uid, with either
// cgroup driver and in every QoS class.
func byUID(root string, l layout, uid string) (Location, error) {
	if uid == "" {
		return Location{}, fmt.Errorf("no cgroupPath from the runtime and no pod UID to look for: %w", ErrNotFound)
	}
	if !validUID(uid) {
		return Location{}, fmt.Errorf("pod UID %q: not a UID (letters, digits, \"-\"): %w", uid, ErrNotFound)
	}
	trees := kubepodsTrees(filepath.Join(root, l.dirs[0]))
	if len(trees) == 0 {
		return Location{}, fmt.Errorf("looking for the cgroup of pod %s: no kubepods cgroup under %s: %w", uid, filepath.Join(root, l.dirs[0]), ErrNotFound)
	}
	for _, t := range trees {
		for _, rel := range podCandidates(t, uid) {
			if checkAll(root, l, rel) == nil {
				return Location{Path: rel, Source: SourcePodUID, V2: l.v2, dirs: l.dirs}, nil
			}
		}
	}
	return Location{}, fmt.Errorf("looking for the cgroup of pod %s under %s (%s): no pod%s or *-pod%s.slice in any QoS class: %w",
		uid, filepath.Join(root, l.dirs[0]), strings.Join(trees, ", "), uid, systemdUID(uid), ErrNotFound)
}

// kubepodsTrees are kubelet's kubepods cgroups under dir, relative to it:
// at the top (the default cgroup root) or one level down (a kubelet with
// --cgroup-root, such as kind's /kubelet), for both drivers. The systemd
// driver's name comes first: a node that switched drivers may keep an
// empty tree of the other.
func kubepodsTrees(dir string) []string {
	var out []string
	for _, pattern := range []string{"kubepods.slice", "kubepods", "*.slice/*-kubepods.slice", "*/kubepods"} {
		matches, _ := filepath.Glob(filepath.Join(dir, pattern))
		for _, m := range matches {
			if isDir(m) {
				rel, _ := filepath.Rel(dir, m)
				out = append(out, filepath.ToSlash(rel))
			}
		}
	}
	return out
}

// podCandidates are the cgroups kubelet names for pod uid under tree:
// Guaranteed pods directly under it, Burstable and BestEffort ones under
// their class. The systemd driver writes the UID with "_" for "-" and
// prefixes each slice with its parent's name.
func podCandidates(tree, uid string) []string {
	base := path.Base(tree)
	if prefix, ok := strings.CutSuffix(base, ".slice"); ok {
		u := systemdUID(uid)
		return []string{
			path.Join(tree, prefix+"-burstable.slice", prefix+"-burstable-pod"+u+".slice"),
			path.Join(tree, prefix+"-besteffort.slice", prefix+"-besteffort-pod"+u+".slice"),
			path.Join(tree, prefix+"-pod"+u+".slice"),
		}
	}
	return []string{
		path.Join(tree, "burstable", "pod"+uid),
		path.Join(tree, "besteffort", "pod"+uid),
		path.Join(tree, "pod"+uid),
	}
}

func systemdUID(uid string) string { return strings.ReplaceAll(uid, "-", "_") }

// validUID accepts what kubelet puts in a pod cgroup's name: a UUID, or
// a static pod's hash. Anything else could make a path of its own.
func validUID(uid string) bool {
	if uid == "" || len(uid) > 128 {
		return false
	}
	for _, r := range uid {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '-') {
			return false
		}
	}
	return true
}

// checkAll checks that rel is a cgroup in every hierarchy of l, and says
// which rule the first one that is not breaks.
func checkAll(root string, l layout, rel string) *RefusedError {
	for _, d := range l.dirs {
		p := filepath.Join(root, d, rel)
		fi, err := os.Stat(p)
		switch {
		case err != nil && errors.Is(err, os.ErrNotExist):
			return &RefusedError{Path: p, Rule: RuleExists}
		case err != nil:
			return &RefusedError{Path: p, Rule: RuleExists, Detail: err.Error()}
		case !fi.IsDir():
			return &RefusedError{Path: p, Rule: RuleDirectory, Detail: "it is a " + fileKind(fi.Mode())}
		case !isFile(filepath.Join(p, "cgroup.procs")):
			return &RefusedError{Path: p, Rule: RuleCgroup, Detail: "a directory without cgroup.procs is not on a cgroup file system"}
		}
	}
	return nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m.IsRegular():
		return "regular file"
	case m&os.ModeSymlink != 0:
		return "symbolic link"
	case m&os.ModeDevice != 0:
		return "device"
	case m&os.ModeNamedPipe != 0:
		return "named pipe"
	case m&os.ModeSocket != 0:
		return "socket"
	}
	return "file of mode " + m.String()
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}
