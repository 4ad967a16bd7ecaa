package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
)

// What the DaemonSet installs on the node, at the paths the manifest gives.
const (
	cniConfDir = "/etc/cni/net.d"
	cniBinDir  = "/opt/cni/bin"
	installed  = cniBinDir + "/cni-usernet"
	// installedStack is what the plugin runs pods' stacks from.
	installedStack = installed + "-stack"
	stateDir       = "/var/lib/cni-usernet"
	stacksDir      = stateDir + "/stacks/"
	leaseRoot      = "/var/lib/cni/networks"
	hostVethPfx    = "usn"
)

// statusRow is one attachment of `cni-usernet status --json`.
type statusRow struct {
	ContainerID string   `json:"containerID"`
	Pod         string   `json:"pod"`
	IPs         []string `json:"ips"`
	PID         int      `json:"pid"`
	Healthy     bool     `json:"healthy"`
	Problem     string   `json:"problem"`
	GSO         struct {
		Mode   string `json:"mode"`
		Reason string `json:"reason"`
	} `json:"gso"`
	Stats *struct {
		Spec *struct {
			MTU int `json:"mtu"`
		} `json:"spec"`
	} `json:"stats"`
	Redirect *struct {
		Mode        string `json:"mode"`
		Reason      string `json:"reason"`
		Services    bool   `json:"services"`
		ServicesOff string `json:"servicesOff"`
		Stats       *struct {
			Redirected uint64 `json:"redirected"`
			Direct     uint64 `json:"direct"`
		} `json:"stats"`
	} `json:"socketRedirect"`
}

// mtu is the MTU the pod's stack runs with (0: not reported).
func (r statusRow) mtu() int {
	if r.Stats == nil || r.Stats.Spec == nil {
		return 0
	}
	return r.Stats.Spec.MTU
}

// nodeStatus runs the installed plugin's status command, as an operator
// on the node would, and indexes its rows by "namespace/pod".
func nodeStatus(t *testing.T) map[string]statusRow {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := run(ctx, "", installed, "status", "--json")
	if err != nil {
		t.Fatal(err)
	}
	return parseStatus(t, out)
}

func parseStatus(t *testing.T, out string) map[string]statusRow {
	t.Helper()
	// Lines after the JSON array name unreadable state files.
	dec := json.NewDecoder(strings.NewReader(out))
	var rows []statusRow
	if err := dec.Decode(&rows); err != nil {
		t.Fatalf("decoding status --json: %v\n%s", err, out)
	}
	if rest := strings.TrimSpace(out[dec.InputOffset():]); rest != "" {
		t.Errorf("status reports: %s", rest)
	}
	m := map[string]statusRow{}
	for _, r := range rows {
		m[r.Pod] = r
	}
	return m
}

// nodeState is what cni-usernet has on the node: attachment state files,
// stack processes, node-side veths and host-local leases.
type nodeState struct {
	atts   []*state.Attachment
	stacks []int    // PIDs of "<bin> stack --config /var/lib/cni-usernet/stacks/..."
	veths  []string // links named like the plugin's node-side veths
	leases []string // IPs leased by host-local in the network's directory
}

func readNodeState(t *testing.T, network string) nodeState {
	t.Helper()
	var s nodeState
	atts, errs := state.Store{Dir: stateDir}.List()
	for _, e := range errs {
		t.Errorf("state: %v", e)
	}
	s.atts = atts
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	self, _ := os.Readlink("/proc/self/ns/pid")
	for _, c := range procs {
		// Node 2's stacks (hack/k8s/node2.sh) are processes of this
		// machine too, in node 2's PID namespace. (Not its mount
		// namespace: node 1's agent restarts stacks in /proc/1's, which
		// need not be the test's.)
		if pidns, err := os.Readlink(filepath.Join(filepath.Dir(c), "ns", "pid")); err != nil || pidns != self {
			continue
		}
		b, err := os.ReadFile(c)
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if config, ok := launch.StackConfigOf(argv); ok && strings.HasPrefix(config, stacksDir) {
			var pid int
			fmt.Sscanf(strings.TrimPrefix(c, "/proc/"), "%d", &pid)
			s.stacks = append(s.stacks, pid)
		}
	}
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, hostVethPfx) {
			s.veths = append(s.veths, i.Name)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(leaseRoot, network))
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			s.leases = append(s.leases, e.Name())
		}
	}
	sort.Ints(s.stacks)
	sort.Strings(s.veths)
	sort.Strings(s.leases)
	return s
}

// consistent says what does not match between the state files and what
// exists: every stack, veth and lease belongs to an attachment, and every
// attachment has them.
func (s nodeState) consistent() error {
	var pids []int
	var veths, ips []string
	for _, a := range s.atts {
		pids = append(pids, a.StackPID)
		if a.HostVeth != "" {
			veths = append(veths, a.HostVeth)
		}
		for _, ip := range a.IPs {
			if p, err := netip.ParsePrefix(ip); err == nil {
				ip = p.Addr().String()
			}
			ips = append(ips, ip)
		}
	}
	sort.Ints(pids)
	sort.Strings(veths)
	sort.Strings(ips)
	var probs []string
	if !slices.Equal(pids, s.stacks) {
		probs = append(probs, fmt.Sprintf("stack processes %v, state files say %v", s.stacks, pids))
	}
	if !slices.Equal(veths, s.veths) {
		probs = append(probs, fmt.Sprintf("node-side veths %v, state files say %v", s.veths, veths))
	}
	if !slices.Equal(ips, s.leases) {
		probs = append(probs, fmt.Sprintf("host-local leases %v, state files say %v", s.leases, ips))
	}
	if probs != nil {
		return fmt.Errorf("%s", strings.Join(probs, "; "))
	}
	return nil
}

func (s nodeState) attachmentOf(ns, name string) *state.Attachment {
	for _, a := range s.atts {
		if a.PodNS == ns && a.PodName == name {
			return a
		}
	}
	return nil
}

// installedConflist returns the network name and first plugin type of the
// file containerd uses: the lexically first .conf/.conflist/.json in
// /etc/cni/net.d.
func installedConflist() (file, network, firstType string, err error) {
	file, network, types, err := conflistIn(cniConfDir)
	if len(types) > 0 {
		firstType = types[0]
	}
	return file, network, firstType, err
}

// conflistIn returns the file containerd uses in dir, its network name and
// its plugins' types in order.
func conflistIn(dir string) (file, network string, types []string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", "", nil, err
	}
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".conf" && ext != ".conflist" && ext != ".json") {
			continue
		}
		file = filepath.Join(dir, e.Name())
		break
	}
	if file == "" {
		return "", "", nil, fmt.Errorf("no CNI configuration in %s", dir)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", "", nil, err
	}
	var c struct {
		Name    string `json:"name"`
		Type    string `json:"type"`
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return "", "", nil, fmt.Errorf("%s: %w", file, err)
	}
	if c.Type != "" {
		types = append(types, c.Type)
	}
	for _, p := range c.Plugins {
		types = append(types, p.Type)
	}
	return file, c.Name, types, nil
}

// stackAlive says whether pid still runs as a cni-usernet stack.
func stackAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), "\x00stack\x00--config\x00"+stacksDir)
}

// stateKeyFile is the name of an attachment's state file.
func stateKeyFile(containerID, ifName string) string {
	return state.Key(containerID, ifName) + ".json"
}

// inNamespace counts the attachments of pods in namespace ns.
func (s nodeState) inNamespace(ns string) int {
	n := 0
	for _, a := range s.atts {
		if a.PodNS == ns {
			n++
		}
	}
	return n
}
