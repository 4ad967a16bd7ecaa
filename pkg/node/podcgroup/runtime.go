package podcgroup

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// Rule is one rule a runtime's cgroupPath must keep, worded to follow
// "must" in the refusal.
type Rule string

// The rules, in the order they are checked.
const (
	RuleSystemdForm Rule = "be a cgroup path, a systemd slice name (kubepods-burstable-pod<UID>.slice) or systemd's slice:prefix:name"
	RuleNoDotDot    Rule = `not contain ".."`
	RuleInKubepods  Rule = "lie inside the node's kubepods tree (kubepods/..., kubepods.slice/..., or either under kubelet's --cgroup-root)"
	RulePodLevel    Rule = "name a pod's cgroup: pod<UID> (cgroupfs) or <parent>-pod<UID>.slice (systemd) directly under kubepods or under its burstable or besteffort class"
	RuleSamePod     Rule = "belong to the pod CNI_ARGS names (K8S_POD_UID)"
	RuleExists      Rule = "exist"
	RuleDirectory   Rule = "be a directory"
	RuleCgroup      Rule = "be a cgroup (a directory with cgroup.procs)"
)

// RefusedError is a runtime's cgroupPath that breaks a Rule: no stack is
// put there.
type RefusedError struct {
	// Value is the cgroupPath as the runtime passed it.
	Value string
	// Path is where it led: the cleaned path for the rules on its shape,
	// the directory for those on the file system; zero when it could not
	// be read as a path.
	Path string
	Rule Rule
	// Detail says how the path breaks the rule, when the rule alone
	// does not.
	Detail string
}

func (e *RefusedError) Error() string {
	subject := "it"
	if e.Path != "" && e.Path != e.Value {
		subject = e.Path
	}
	msg := fmt.Sprintf("the runtime's cgroupPath %q is refused: %s must %s", e.Value, subject, e.Rule)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// fromRuntime checks the runtime's cgroupPath against the rules and
// returns the pod's cgroup it names. Runtimes pass the sandbox's cgroup
// parent, which kubelet sets to the pod's cgroup: /kubepods/burstable/
// pod<UID> with the cgroupfs driver, /kubepods.slice/kubepods-burstable.
// slice/kubepods-burstable-pod<UID_>.slice with systemd's. The slice's
// name alone and runc's slice:prefix:name (which names a container's scope
// in the pod's slice) are read too, and a path below the pod's cgroup (a
// container's) is cut to the pod's: a stack must outlive the sandbox's
// containers until DEL.
func fromRuntime(root string, l layout, q Query) (Location, error) {
	v := q.RuntimePath
	refuse := func(p string, r Rule, detail string) (Location, error) {
		return Location{}, &RefusedError{Value: v, Path: p, Rule: r, Detail: detail}
	}
	p := v
	if slice, _, isSystemd := strings.Cut(v, ":"); isSystemd {
		if strings.Count(v, ":") != 2 {
			return refuse("", RuleSystemdForm, "slice:prefix:name has three fields")
		}
		x, err := expandSlice(slice)
		if err != nil {
			return refuse("", RuleSystemdForm, err.Error())
		}
		p = x
	} else if !strings.Contains(v, "/") && strings.HasSuffix(v, ".slice") {
		x, err := expandSlice(v)
		if err != nil {
			return refuse("", RuleSystemdForm, err.Error())
		}
		p = x
	}
	// Checked before cleaning, which would resolve ".." into some other
	// cgroup instead of refusing it.
	if slices.Contains(strings.Split(p, "/"), "..") {
		return refuse("", RuleNoDotDot, "")
	}
	rel := strings.TrimPrefix(path.Clean("/"+p), "/")
	comps := strings.Split(rel, "/")
	k := slices.IndexFunc(comps, isKubepods)
	if k < 0 {
		return refuse("/"+rel, RuleInKubepods, "")
	}
	at, uid := podComponent(comps, k)
	if at < 0 {
		return refuse("/"+rel, RulePodLevel, "")
	}
	if q.PodUID != "" && uid != q.PodUID {
		return refuse("/"+rel, RuleSamePod, fmt.Sprintf("it is pod %s's, K8S_POD_UID is %s", uid, q.PodUID))
	}
	rel = path.Join(comps[:at+1]...)
	if e := checkAll(root, l, rel); e != nil {
		e.Value = v
		return Location{}, e
	}
	return Location{Path: rel, Source: SourceRuntime, V2: l.v2, dirs: l.dirs}, nil
}

// isKubepods reports whether a path component is kubelet's kubepods
// cgroup: kubepods (cgroupfs), kubepods.slice, or <root>-kubepods.slice
// under a --cgroup-root of the systemd driver.
func isKubepods(c string) bool {
	return c == "kubepods" || c == "kubepods.slice" || strings.HasSuffix(c, "-kubepods.slice")
}

// podComponent finds the pod's cgroup below comps[k], the kubepods
// cgroup: directly under it (Guaranteed) or under its burstable or
// besteffort class. It returns the component's index and the pod's UID,
// or -1.
func podComponent(comps []string, k int) (int, string) {
	prefix, systemd := strings.CutSuffix(comps[k], ".slice")
	uidAt := func(i int, parent string) string {
		if i >= len(comps) {
			return ""
		}
		var u string
		var ok bool
		if systemd {
			if u, ok = strings.CutPrefix(comps[i], parent+"-pod"); ok {
				u, ok = strings.CutSuffix(u, ".slice")
				u = strings.ReplaceAll(u, "_", "-")
			}
		} else {
			u, ok = strings.CutPrefix(comps[i], "pod")
		}
		if !ok || !validUID(u) {
			return ""
		}
		return u
	}
	if u := uidAt(k+1, prefix); u != "" {
		return k + 1, u
	}
	for _, class := range []string{"burstable", "besteffort"} {
		name, parent := class, ""
		if systemd {
			parent = prefix + "-" + class
			name = parent + ".slice"
		}
		if k+1 < len(comps) && comps[k+1] == name {
			if u := uidAt(k+2, parent); u != "" {
				return k + 2, u
			}
		}
	}
	return -1, ""
}

// expandSlice turns a systemd slice's name into its cgroup path, as
// systemd nests slices: a-b-c.slice is /a.slice/a-b.slice/a-b-c.slice.
func expandSlice(slice string) (string, error) {
	name, ok := strings.CutSuffix(slice, ".slice")
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("%q is not a slice's name", slice)
	}
	if name == "-" {
		return "/", nil // the root slice
	}
	var b strings.Builder
	prefix := ""
	for _, c := range strings.Split(name, "-") {
		if c == "" {
			return "", fmt.Errorf("slice %q has an empty component", slice)
		}
		b.WriteString("/" + prefix + c + ".slice")
		prefix += c + "-"
	}
	return b.String(), nil
}
