package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runStart is when this test binary started: the plugin logs of a kept
// cluster hold earlier runs' lines, which say nothing about this one.
var runStart = time.Now()

// The podcgroup.Source values the plugin logs, by the containerd that
// hack/k8s/e2e.sh says the lab runs (E2E_CONTAINERD): Debian's 1.6 passes
// no cgroupPath, so the plugin finds each pod's cgroup by its UID;
// containerd 2 passes the sandbox's cgroup parent, which the plugin joins.
var wantStackCgroupSource = map[string]string{
	"1": "pod UID",
	"2": "runtime cgroupPath",
}

// stackCgroupLine is one "stack cgroup" line of the plugin's log: where
// ADD charged a pod's stack, and how it found that cgroup.
type stackCgroupLine struct {
	Time  time.Time `json:"time"`
	Level string    `json:"level"`
	Msg   string    `json:"msg"`
	CNI   struct {
		Cmd string `json:"cmd"`
		Pod string `json:"pod"`
	} `json:"cni"`
	Path   string `json:"path"`
	Source string `json:"source"`
	Reason string `json:"reason"`
}

// readStackCgroupLines returns the "stack cgroup" lines of ADDs logged in
// file since since.
func readStackCgroupLines(file string, since time.Time) ([]stackCgroupLine, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []stackCgroupLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if !strings.Contains(sc.Text(), `"msg":"stack cgroup"`) {
			continue
		}
		var l stackCgroupLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("%s: %w: %s", file, err, sc.Text())
		}
		if l.Msg == "stack cgroup" && l.CNI.Cmd == "ADD" && !l.Time.Before(since) {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}

// chargedToPod says why a line does not show a stack charged to its pod's
// cgroup found from want, or "" when it does.
func (l stackCgroupLine) chargedToPod(want string) string {
	switch {
	case l.Level != "INFO" || l.Reason != "":
		return fmt.Sprintf("a %s: %s", l.Level, l.Reason)
	case l.Source != want:
		return fmt.Sprintf("found from the %s, want the %s", l.Source, want)
	}
	for _, e := range strings.Split(l.Path, "/") {
		// cgroupfs' pod<UID>, systemd's <parent>-pod<UID_>.slice
		if strings.HasPrefix(e, "pod") || strings.Contains(e, "-pod") && strings.HasSuffix(e, ".slice") {
			return ""
		}
	}
	return fmt.Sprintf("%q is not a pod's cgroup", l.Path)
}

func TestStackCgroupLine(t *testing.T) {
	const (
		uid     = "5531abf2-614a-46ef-969c-323a058519a9"
		byUID   = "pod UID"
		runtime = "runtime cgroupPath"
	)
	for _, c := range []struct {
		name       string
		line       stackCgroupLine
		wantSource string
		want       string // "" for charged to the pod
	}{
		{"by UID, cgroupfs", stackCgroupLine{Level: "INFO", Path: "kubepods/besteffort/pod" + uid, Source: byUID}, byUID, ""},
		{"runtime, node 2's cgroup root", stackCgroupLine{Level: "INFO", Path: "k8s-lab-node2/kubepods/burstable/pod" + uid, Source: runtime}, runtime, ""},
		{"runtime, v2 leaf, systemd", stackCgroupLine{Level: "INFO", Path: "kubepods.slice/kubepods-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cni-usernet", Source: runtime}, runtime, ""},
		{"by UID where the runtime passes it", stackCgroupLine{Level: "INFO", Path: "kubepods/pod" + uid, Source: byUID}, runtime, "found from the pod UID, want the runtime cgroupPath"},
		{"charged to the node", stackCgroupLine{Level: "WARN", Path: "kubepods/cni-usernet-stacks", Source: "node", Reason: "no cgroup"}, byUID, "a WARN: no cgroup"},
		{"not a pod's", stackCgroupLine{Level: "INFO", Path: "kubepods/burstable", Source: runtime}, runtime, `"kubepods/burstable" is not a pod's cgroup`},
	} {
		if got := c.line.chargedToPod(c.wantSource); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

// TestKubernetesStackCgroupSource reads, after the tests that started pods
// (go test runs this file after e2e_test.go's TestKubernetes: files in name
// order), every node's plugin log: each ADD of this run charged its stack
// to the pod's cgroup, found the way the lab's containerd allows. On
// containerd 2 that proves the runtime's cgroupPath reached the plugin and
// was used; on 1.6 that the lookup by UID served every pod.
func TestKubernetesStackCgroupSource(t *testing.T) {
	if os.Getenv("CNI_USERNET_E2E") != "1" {
		t.Skip("needs the plugin logs of a real cluster's run: `make e2e` sets CNI_USERNET_E2E=1")
	}
	lab := os.Getenv("E2E_CONTAINERD")
	want, ok := wantStackCgroupSource[lab]
	if !ok {
		t.Skipf("E2E_CONTAINERD=%q names no containerd of the lab (1 or 2; hack/k8s/e2e.sh sets it)", lab)
	}
	logs := [][2]string{{node1(), "/var/log/cni-usernet/plugin.log"}}
	if node2() != "" {
		logs = append(logs, [2]string{node2(), filepath.Join(node2Dir("/var/log/cni-usernet"), "plugin.log")})
	}
	for _, nl := range logs {
		node, file := nl[0], nl[1]
		lines, err := readStackCgroupLines(file, runStart)
		if err != nil {
			t.Errorf("node %s: %v", node, err)
			continue
		}
		if len(lines) == 0 {
			t.Errorf("node %s: no ADD logged a \"stack cgroup\" line in %s since %s: did no test start pods there?",
				node, file, runStart.Format(time.RFC3339))
			continue
		}
		bad := 0
		for _, l := range lines {
			// The faults test starts two sandboxes with crictl, beside the
			// kubelet: a pod cgroup there is a matter of chance (the node's
			// is what the plugin gives them when there is none).
			if strings.HasPrefix(l.CNI.Pod, "cu-faults-") && (strings.HasSuffix(l.CNI.Pod, "/stranger") || strings.HasSuffix(l.CNI.Pod, "/known")) {
				continue
			}
			if why := l.chargedToPod(want); why != "" {
				bad++
				t.Errorf("node %s: pod %s: stack cgroup %q: %s", node, l.CNI.Pod, l.Path, why)
			}
		}
		t.Logf("node %s (containerd %s): %d of %d ADDs since %s charged the stack to the pod's cgroup found from the %s, e.g. pod %s: %s",
			node, lab, len(lines)-bad, len(lines), runStart.Format(time.TimeOnly), want, lines[0].CNI.Pod, lines[0].Path)
	}
}
