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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
)

// labNode is one node of the lab as the test reaches it: node 1 is this
// machine's root namespaces, node 2 has namespaces and private directories
// of its own (hack/k8s/node2.sh).
type labNode struct {
	name string
	two  bool
	repo string
}

func labNodes(repo string) []labNode {
	ns := []labNode{{name: node1(), repo: repo}}
	if node2() != "" {
		ns = append(ns, labNode{name: node2(), two: true, repo: repo})
	}
	return ns
}

// exec runs a command on the node.
func (n labNode) exec(argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if n.two {
		return run(ctx, n.repo, "hack/k8s/node2.sh", append([]string{"exec"}, argv...)...)
	}
	return run(ctx, "", argv[0], argv[1:]...)
}

// path is where the node's file p (under one of node 2's private
// directories, dir) lies on this machine.
func (n labNode) path(dir, rest string) string {
	if n.two {
		return filepath.Join(node2Dir(dir), rest)
	}
	return filepath.Join(dir, rest)
}

// pidNS is the node's PID namespace (node 2's is its init's).
func (n labNode) pidNS() (string, error) {
	if !n.two {
		return os.Readlink("/proc/self/ns/pid")
	}
	b, err := os.ReadFile("/run/k8s-lab/node2-init.pid")
	if err != nil {
		return "", fmt.Errorf("node 2's init: %w", err)
	}
	return os.Readlink("/proc/" + strings.TrimSpace(string(b)) + "/ns/pid")
}

// crictl runs crictl against the node's containerd.
func (n labNode) crictl(args ...string) (string, error) {
	return n.exec(append([]string{"crictl", "--runtime-endpoint", "unix:///run/containerd/containerd.sock"}, args...)...)
}

// nodeAccount is what a node has of cni-usernet, next to what its running
// pods explain: the runtime's ready sandboxes on the pod network.
type nodeAccount struct {
	node string
	// sandboxes: ready pod-network sandboxes, ID -> namespace/name.
	sandboxes map[string]string
	atts      []*state.Attachment
	// stacks: stack processes of the node, by their PID in its namespace.
	stacks    []int
	veths     []string
	leases    map[string]string // IP -> the container ID host-local leased it to
	stackDirs []string
	locks     []string
	// podRoutes: the node's routes over the plugin's veths, IP -> link.
	podRoutes map[string]string
	// nodeRoutes: the agent's routes to the other nodes' pod CIDRs.
	nodeRoutes []string
}

// account reads what node n has, at once, without the API server.
func account(n labNode, network string) (nodeAccount, error) {
	a := nodeAccount{node: n.name, sandboxes: map[string]string{}, leases: map[string]string{}, podRoutes: map[string]string{}}
	out, err := n.crictl("pods", "--state", "ready", "-o", "json")
	if err != nil {
		return a, err
	}
	var pods struct {
		Items []struct {
			ID       string `json:"id"`
			Metadata struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &pods); err != nil {
		return a, fmt.Errorf("crictl pods: %w", err)
	}
	for _, p := range pods.Items {
		out, err := n.crictl("inspectp", "-o", "json", p.ID)
		if err != nil {
			continue // gone meanwhile
		}
		var st struct {
			Status struct {
				Linux struct {
					Namespaces struct {
						Options struct {
							Network string `json:"network"`
						} `json:"options"`
					} `json:"namespaces"`
				} `json:"linux"`
			} `json:"status"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return a, fmt.Errorf("crictl inspectp %s: %w", p.ID, err)
		}
		if st.Status.Linux.Namespaces.Options.Network != "NODE" {
			a.sandboxes[p.ID] = p.Metadata.Namespace + "/" + p.Metadata.Name
		}
	}

	sd := n.path(stateDir, "")
	atts, errs := state.Store{Dir: sd}.List()
	if len(errs) > 0 {
		return a, fmt.Errorf("state files: %v", errs)
	}
	a.atts = atts
	for _, sub := range []string{"stacks", "locks"} {
		entries, _ := os.ReadDir(filepath.Join(sd, sub))
		for _, e := range entries {
			if sub == "stacks" {
				a.stackDirs = append(a.stackDirs, e.Name())
			} else {
				a.locks = append(a.locks, strings.TrimSuffix(e.Name(), ".lock"))
			}
		}
	}

	pidns, err := n.pidNS()
	if err != nil {
		return a, err
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if ns, err := os.Readlink(p + "/ns/pid"); err != nil || ns != pidns {
			continue
		}
		b, err := os.ReadFile(p + "/cmdline")
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if config, ok := launch.StackConfigOf(argv); !ok || !strings.HasPrefix(config, stacksDir) {
			continue
		}
		status, err := os.ReadFile(p + "/status")
		if err != nil || strings.Contains(string(status), "\nState:\tZ") {
			continue
		}
		// The PID in the node's own namespace: the last of NSpid.
		for _, l := range strings.Split(string(status), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "NSpid:" {
				pid, _ := strconv.Atoi(f[len(f)-1])
				a.stacks = append(a.stacks, pid)
			}
		}
	}

	out, err = n.exec("ip", "-j", "link", "show")
	if err != nil {
		return a, err
	}
	var links []struct {
		Name string `json:"ifname"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		return a, fmt.Errorf("ip link: %w", err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Name, hostVethPfx) {
			a.veths = append(a.veths, l.Name)
		}
	}
	for _, fam := range []string{"-4", "-6"} {
		out, err := n.exec("ip", "-j", fam, "route", "show")
		if err != nil {
			return a, err
		}
		var routes []struct {
			Dst      string `json:"dst"`
			Dev      string `json:"dev"`
			Protocol string `json:"protocol"`
		}
		if err := json.Unmarshal([]byte(out), &routes); err != nil {
			return a, fmt.Errorf("ip route: %w", err)
		}
		for _, r := range routes {
			switch {
			case r.Protocol == "kernel":
				// The kernel's, for the addresses on the host veths (IPv6
				// makes a route of the gateway's /128 there): not routes
				// to pods.
			case strings.HasPrefix(r.Dev, hostVethPfx):
				// Host routes to pods; not the kernel's link-local ones.
				dst := strings.TrimSuffix(strings.TrimSuffix(r.Dst, "/32"), "/128")
				if !strings.Contains(dst, "/") {
					a.podRoutes[dst] = r.Dev
				}
			case r.Protocol == "117":
				a.nodeRoutes = append(a.nodeRoutes, r.Dst)
			}
		}
	}

	dir := n.path("/var/lib/cni", filepath.Join("networks", network))
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		a.leases[e.Name()] = strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
	}
	sort.Ints(a.stacks)
	sort.Strings(a.veths)
	sort.Strings(a.stackDirs)
	sort.Strings(a.nodeRoutes)
	return a, nil
}

// problems lists every difference between what the node has and what its
// running pods explain: each ready pod-network sandbox has exactly one
// attachment, and each attachment its live stack, its veth, its leases
// (owned by its container), its stack directory and its routes; nothing
// else exists. wantNodeRoutes is the other nodes' pod CIDRs.
func (a nodeAccount) problems(wantNodeRoutes []string) []string {
	var p []string
	add := func(f string, args ...any) { p = append(p, a.node+": "+fmt.Sprintf(f, args...)) }
	byID := map[string]*state.Attachment{}
	var pids []int
	var veths, keys []string
	ips := map[string]*state.Attachment{}
	for _, at := range a.atts {
		byID[at.ContainerID] = at
		if _, ok := a.sandboxes[at.ContainerID]; !ok {
			add("attachment of %s/%s (sandbox %.12s) without a ready sandbox: leaked", at.PodNS, at.PodName, at.ContainerID)
		}
		pids = append(pids, at.StackPID)
		if at.HostVeth != "" {
			veths = append(veths, at.HostVeth)
		}
		keys = append(keys, state.Key(at.ContainerID, at.IfName))
		for _, ip := range at.IPs {
			if pf, err := netip.ParsePrefix(ip); err == nil {
				ip = pf.Addr().String()
			}
			ips[ip] = at
		}
	}
	for id, name := range a.sandboxes {
		if byID[id] == nil {
			add("pod %s (sandbox %.12s) runs without an attachment", name, id)
		}
	}
	sort.Ints(pids)
	sort.Strings(veths)
	sort.Strings(keys)
	if !slices.Equal(pids, a.stacks) {
		add("stack processes %v, attachments name %v", a.stacks, pids)
	}
	if !slices.Equal(veths, a.veths) {
		add("node-side veths %v, attachments name %v", a.veths, veths)
	}
	if !slices.Equal(keys, a.stackDirs) {
		add("stack directories %v, attachments %v", a.stackDirs, keys)
	}
	for _, l := range a.locks {
		if !slices.Contains(keys, l) {
			add("lock file %s.lock of no attachment", l)
		}
	}
	for ip, owner := range a.leases {
		at := ips[ip]
		switch {
		case at == nil:
			add("host-local lease %s (container %.12s) of no attachment: leaked", ip, owner)
		case at.ContainerID != owner:
			add("host-local lease %s held by container %.12s, the attachment's is %.12s", ip, owner, at.ContainerID)
		}
	}
	for ip, at := range ips {
		if _, ok := a.leases[ip]; !ok && at.IPAMType == "host-local" {
			add("%s/%s's address %s has no host-local lease", at.PodNS, at.PodName, ip)
		}
		if at.HostVeth != "" && a.podRoutes[ip] != at.HostVeth {
			add("route to %s/%s's %s: over %q, want %s", at.PodNS, at.PodName, ip, a.podRoutes[ip], at.HostVeth)
		}
	}
	for ip, dev := range a.podRoutes {
		if ips[ip] == nil {
			add("route to %s over %s of no attachment", ip, dev)
		}
	}
	if wantNodeRoutes != nil && !slices.Equal(a.nodeRoutes, wantNodeRoutes) {
		add("routes to other nodes' pods %v, want %v", a.nodeRoutes, wantNodeRoutes)
	}
	return p
}

// otherPodCIDRs is, for each node, the pod CIDRs of the other nodes: the
// agent's routes (standalone mode).
func otherPodCIDRs(t *testing.T) map[string][]string {
	t.Helper()
	var l struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				PodCIDRs []string `json:"podCIDRs"`
			} `json:"spec"`
		} `json:"items"`
	}
	if err := kubectlJSON(&l, "get", "nodes"); err != nil {
		t.Fatal(err)
	}
	m := map[string][]string{}
	for _, n := range l.Items {
		m[n.Metadata.Name] = []string{}
	}
	for _, n := range l.Items {
		for other := range m {
			if other != n.Metadata.Name {
				m[other] = append(m[other], n.Spec.PodCIDRs...)
			}
		}
	}
	for k := range m {
		sort.Strings(m[k])
	}
	return m
}

// nodesAccountFor waits until every node has exactly what its running pods
// explain (reconcile runs every 30 s; a pod being deleted takes its grace
// period), and fails with what is left over or missing. It returns the
// accounts.
func nodesAccountFor(t *testing.T, repo, network string, routes map[string][]string, within time.Duration) map[string]nodeAccount {
	t.Helper()
	accts := map[string]nodeAccount{}
	start := time.Now()
	err := poll(within, func() error {
		var all []string
		for _, n := range labNodes(repo) {
			a, err := account(n, network)
			if err != nil {
				return fmt.Errorf("%s: %w", n.name, err)
			}
			accts[n.name] = a
			all = append(all, a.problems(routes[n.name])...)
		}
		if len(all) > 0 {
			return fmt.Errorf("%d differences:\n  %s", len(all), strings.Join(all, "\n  "))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("nodes' accounts not within %v: %v", within, err)
	}
	for _, n := range labNodes(repo) {
		a := accts[n.name]
		t.Logf("%s accounts for %d pods (stacks, veths, leases, state, routes), nothing leaked (%.1fs)", n.name, len(a.atts), time.Since(start).Seconds())
	}
	return accts
}

// runningAnswer checks that every Running pod of namespace ns answers
// over HTTP from node 1, on its address the API shows.
func runningAnswer(t *testing.T, ns string, within time.Duration) {
	t.Helper()
	var l struct{ Items []pod }
	if err := kubectlJSON(&l, "-n", ns, "get", "pods"); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range l.Items {
		if p.Status.Phase != "Running" || p.Status.PodIP == "" {
			continue
		}
		n++
		name := p.Metadata.Name
		eventually(t, within, name+" answers", func() error {
			// (its address anew: the API shows a new sandbox's late)
			var p pod
			if err := kubectlJSON(&p, "-n", ns, "get", "pod", name); err != nil {
				return err
			}
			body, err := httpGet("http://" + net.JoinHostPort(p.Status.PodIP, "8080") + "/")
			if err == nil && !strings.HasPrefix(body, "pod="+name+" ") {
				err = fmt.Errorf("answer %q", body)
			}
			return err
		})
	}
	t.Logf("%d running pods of %s answer", n, ns)
}

func (a nodeAccount) attachmentOf(ns, name string) *state.Attachment {
	for _, at := range a.atts {
		if at.PodNS == ns && at.PodName == name {
			return at
		}
	}
	return nil
}
