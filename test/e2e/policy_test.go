package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/kube"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// The NetworkPolicy matrix, in the style of the upstream network policy
// tests: namespaces x, y, z with pods a, b, c each (spread over both
// nodes), every pod probing every other pod's IP and Service ClusterIP over
// TCP and UDP with a 1 s timeout, the whole matrix compared with the
// expected one after each change of the policies, labels or namespaces.

// probe kinds: the pod's address or its Service's, TCP (podtool's HTTP) or
// UDP (podtool's echo).
var probeKinds = []string{"pod/tcp", "pod/udp", "svc/tcp", "svc/udp"}

type mpod struct {
	ns, name string // "x", "a"
	full     string // the Kubernetes namespace
	node     string
	ip, svc  string
}

func (p *mpod) key() string { return p.ns + "/" + p.name }

// policyModel is what the test has applied; allowed derives the verdict.
type policyModel struct {
	// denyX: default deny ingress in x.
	denyX bool
	// allowY: an ingress rule in x from the namespaces labelled team=y;
	// with needRole only from pods labelled role=client, with tcpOnly on
	// TCP 8080 only.
	allowY            bool
	needRole, tcpOnly bool
	// egressY: egress of every pod in y denied but DNS.
	egressY bool
	team    map[string]string // namespace -> its team label
	role    map[string]string // pod key -> its role label
}

func (m *policyModel) allowed(src, dst *mpod, kind string) bool {
	tcp := strings.HasSuffix(kind, "/tcp")
	if m.egressY && src.ns == "y" {
		return false
	}
	if dst.ns == "x" && m.denyX {
		if !m.allowY || m.team[src.ns] != "y" {
			return false
		}
		if m.needRole && m.role[src.key()] != "client" {
			return false
		}
		if m.tcpOnly && !tcp {
			return false
		}
	}
	return true
}

// matrix is one round of probes: src key -> dst key -> kind -> ok.
type matrix map[string]map[string]map[string]bool

func checkNetworkPolicy(t *testing.T, repo, prefix string) {
	model := &policyModel{team: map[string]string{}, role: map[string]string{}}
	pods := startMatrixPods(t, prefix, []string{"x", "y", "z"}, func(ns, name string) map[string]string {
		model.team[ns] = ns
		if name == "c" {
			return nil
		}
		model.role[ns+"/"+name] = "client"
		return map[string]string{"role": "client"}
	})
	nsOf := func(short string) string { return prefix + "-" + short }
	expectMatrix := func(what string) { t.Helper(); expectPolicyMatrix(t, pods, model.allowed, what) }

	expectMatrix("no policy")

	apply(t, fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: %s}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`, nsOf("x")))
	model.denyX = true
	expectMatrix("default deny in x")
	checkDenialsOnNode(t, pods, nsOf("x"), "default deny in x")

	allow := func(needRole, tcpOnly bool) string {
		y := fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-y, namespace: %s}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: "y"}}
`, nsOf("x"))
		if needRole {
			y += "      podSelector: {matchLabels: {role: client}}\n"
		}
		if tcpOnly {
			y += "    ports:\n    - {protocol: TCP, port: 8080}\n"
		}
		return y
	}
	apply(t, allow(false, false))
	model.allowY = true
	expectMatrix("allow x from namespace team=y")

	apply(t, allow(true, true))
	model.needRole, model.tcpOnly = true, true
	expectMatrix("update: from role=client in team=y, TCP 8080 only")

	mustKubectl(t, "-n", nsOf("y"), "label", "pod", "b", "role=server", "--overwrite")
	model.role["y/b"] = "server"
	expectMatrix("relabel pod y/b role=server")

	mustKubectl(t, "label", "ns", nsOf("z"), "team=y", "--overwrite")
	model.team["z"] = "y"
	expectMatrix("relabel namespace z team=y")

	mustKubectl(t, "-n", nsOf("x"), "delete", "networkpolicy", "deny-all", "allow-y")
	model.denyX, model.allowY = false, false
	expectMatrix("policies deleted")

	// Egress: y's pods reach nothing but DNS.
	apply(t, fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: egress-dns-only, namespace: %s}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - ports:
    - {protocol: UDP, port: 53}
    - {protocol: TCP, port: 53}
`, nsOf("y")))
	model.egressY = true
	expectMatrix("egress of y denied but DNS")
	for _, p := range pods {
		if p.ns != "y" {
			continue
		}
		out, err := kubectl("-n", p.full, "exec", p.name, "--", "/podtool", "probe", "2s", "dns:kubernetes.default.svc.cluster.local")
		if err != nil || !strings.Contains(out, " ok") {
			t.Errorf("%s: DNS with egress denied but DNS: %q (%v)", p.key(), out, err)
		}
	}
	mustKubectl(t, "-n", nsOf("y"), "delete", "networkpolicy", "egress-dns-only")
	model.egressY = false
	expectMatrix("egress policy deleted")
}

// startMatrixPods starts the matrix's pods: pods a, b and c in each of
// the namespaces prefix-<short> (labelled team=<short>), spread over the
// nodes, each with a Service of its own, and returns them with their
// addresses once the Services' endpoints are ready. labels gives each
// pod's extra labels.
func startMatrixPods(t *testing.T, prefix string, namespaces []string, labels func(ns, name string) map[string]string) []*mpod {
	t.Helper()
	nodes := []string{node1()}
	if node2() != "" {
		nodes = append(nodes, node2())
	}
	var pods []*mpod
	var m strings.Builder
	for i, ns := range namespaces {
		full := prefix + "-" + ns
		// Quoted: YAML reads a bare y as true.
		fmt.Fprintf(&m, "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: %s, labels: {team: %q}}\n", full, ns)
		for j, name := range []string{"a", "b", "c"} {
			p := &mpod{ns: ns, name: name, full: full, node: nodes[(i*3+j)%len(nodes)]}
			pods = append(pods, p)
			m.WriteString(podManifestOn(full, name, "", p.node, labels(ns, name)))
			fmt.Fprintf(&m, `---
apiVersion: v1
kind: Service
metadata: {name: %s, namespace: %s}
spec:
  selector: {app: %s}
  ports:
  - {name: http, protocol: TCP, port: 80, targetPort: 8080}
  - {name: echo, protocol: UDP, port: 90, targetPort: 9090}
`, name, full, name)
		}
	}
	t.Cleanup(func() {
		for _, ns := range namespaces {
			kubectl("delete", "ns", prefix+"-"+ns, "--wait=false")
		}
	})
	apply(t, m.String())
	for _, ns := range namespaces {
		mustKubectl(t, "-n", prefix+"-"+ns, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=3m")
	}
	for _, p := range pods {
		p.ip = getPod(t, p.full, p.name).Status.PodIP
		p.svc = strings.TrimSpace(mustKubectl(t, "-n", p.full, "get", "svc", p.name, "-o", "jsonpath={.spec.clusterIP}"))
	}
	// kube-proxy programs a Service once its endpoints are ready.
	eventually(t, time.Minute, "the Services' endpoints", func() error {
		for _, p := range pods {
			out, err := kubectl("-n", p.full, "get", "endpointslices", "-l", "kubernetes.io/service-name="+p.name,
				"-o", "jsonpath={.items[*].endpoints[*].addresses[*]}")
			if err != nil || strings.TrimSpace(out) != p.ip {
				return fmt.Errorf("Service %s/%s: endpoints %q (%v), want %s", p.full, p.name, out, err, p.ip)
			}
		}
		return nil
	})
	return pods
}

// expectPolicyMatrix probes the whole matrix until it is what allowed
// says (a change reaches every stack within moments; a probe lost once,
// 1 s timeout, gets another round) or 20 s have passed.
func expectPolicyMatrix(t *testing.T, pods []*mpod, allowed func(src, dst *mpod, kind string) bool, what string) {
	t.Helper()
	want := matrix{}
	for _, s := range pods {
		want[s.key()] = map[string]map[string]bool{}
		for _, d := range pods {
			if s == d {
				continue
			}
			want[s.key()][d.key()] = map[string]bool{}
			for _, k := range probeKinds {
				want[s.key()][d.key()][k] = allowed(s, d, k)
			}
		}
	}
	var got matrix
	var diff []string
	start := time.Now()
	for round := 1; ; round++ {
		got = probeMatrix(t, pods)
		diff = diffMatrix(want, got)
		if len(diff) == 0 {
			t.Logf("%s: the full matrix (%d probes) as expected after %s (round %d)", what, len(pods)*(len(pods)-1)*len(probeKinds), time.Since(start).Round(100*time.Millisecond), round)
			return
		}
		if time.Since(start) > 20*time.Second {
			break
		}
	}
	t.Errorf("%s: %d probes differ from the expected matrix:\n%s\ngot:\n%s", what, len(diff), strings.Join(diff, "\n"), formatMatrix(pods, got))
}

// probeMatrix runs one round: each pod probes every other pod at once
// (one kubectl exec per pod, all pods in parallel).
func probeMatrix(t *testing.T, pods []*mpod) matrix {
	t.Helper()
	got := matrix{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, s := range pods {
		var targets []string
		index := map[string][2]string{} // target -> dst key, kind
		for _, d := range pods {
			if s == d {
				continue
			}
			for _, k := range probeKinds {
				var tg string
				switch k {
				case "pod/tcp":
					tg = "tcp:" + net.JoinHostPort(d.ip, "8080")
				case "pod/udp":
					tg = "udp:" + net.JoinHostPort(d.ip, "9090")
				case "svc/tcp":
					tg = "tcp:" + net.JoinHostPort(d.svc, "80")
				case "svc/udp":
					tg = "udp:" + net.JoinHostPort(d.svc, "90")
				}
				targets = append(targets, tg)
				index[tg] = [2]string{d.key(), k}
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := kubectl(append([]string{"-n", s.full, "exec", s.name, "--", "/podtool", "probe", "1s"}, targets...)...)
			row := map[string]map[string]bool{}
			for _, line := range strings.Split(out, "\n") {
				f := strings.Fields(line)
				if len(f) != 2 {
					continue
				}
				if at, ok := index[f[0]]; ok {
					if row[at[0]] == nil {
						row[at[0]] = map[string]bool{}
					}
					row[at[0]][at[1]] = f[1] == "ok"
				}
			}
			if err != nil {
				t.Logf("probes from %s: %v", s.key(), err)
			}
			mu.Lock()
			got[s.key()] = row
			mu.Unlock()
		}()
	}
	wg.Wait()
	return got
}

func diffMatrix(want, got matrix) []string {
	var out []string
	for s, row := range want {
		for d, kinds := range row {
			for k, w := range kinds {
				g, ok := got[s][d][k]
				if !ok || g != w {
					out = append(out, fmt.Sprintf("  %s -> %s %s: got %s, want %s", s, d, k, verdict(g, ok), verdict(w, true)))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

func verdict(ok, known bool) string {
	switch {
	case !known:
		return "no answer from the prober"
	case ok:
		return "reachable"
	}
	return "blocked"
}

// formatMatrix draws one table per probe kind, upstream-style: rows are
// sources, columns destinations, "." reachable, "X" blocked.
func formatMatrix(pods []*mpod, m matrix) string {
	var b strings.Builder
	for _, k := range probeKinds {
		fmt.Fprintf(&b, "%s\n%-5s", k, "")
		for _, d := range pods {
			fmt.Fprintf(&b, " %-4s", d.key())
		}
		b.WriteString("\n")
		for _, s := range pods {
			fmt.Fprintf(&b, "%-5s", s.key())
			for _, d := range pods {
				c := "-"
				if s != d {
					c = "?"
					if ok, known := m[s.key()][d.key()][k]; known {
						c = map[bool]string{true: ".", false: "X"}[ok]
					}
				}
				fmt.Fprintf(&b, " %-4s", c)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// checkPolicyPropagation measures how long a policy change takes to be in
// force in every pod's stack on both nodes: n pods, a default deny
// applied, then deleted, then an Admin-tier ClusterNetworkPolicy's deny
// applied and deleted, while Services' endpoints churn. When a stack
// holds a change is its own word: the time of its log line "network
// policy in force" (read from its log file, which costs the stacks
// nothing, where polling every stack's status would load the node the
// agents push on). Each change is timed from kubectl invoked and from
// the API server's answer (kubectl returned: the write is done), and
// split by the agents' round lines (change seen, waiting for the round,
// compiling, writing the files, pushing). Reported, not asserted (the
// machine is shared).
func checkPolicyPropagation(t *testing.T, prefix string, n int) {
	ns := prefix + "-lat"
	nodes := []string{node1()}
	if node2() != "" {
		nodes = append(nodes, node2())
	}
	var m strings.Builder
	fmt.Fprintf(&m, "apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", ns)
	for i := range n {
		m.WriteString(podManifestOn(ns, fmt.Sprintf("p%d", i), "", nodes[i%len(nodes)], nil))
	}
	// Services whose endpoints churn while the policy changes: the
	// agents must push a policy change to every pod no slower for the
	// EndpointSlice events around it.
	for k := range churnServices {
		fmt.Fprintf(&m, `---
apiVersion: v1
kind: Service
metadata: {name: churn-%d, namespace: %s}
spec:
  selector: {churn: s%d}
  ports:
  - {protocol: TCP, port: 80, targetPort: 8080}
`, k, ns, k)
	}
	t.Cleanup(func() { kubectl("delete", "ns", ns, "--wait=false") })
	apply(t, m.String())
	// (not kubectl's two-minute bound: 200 pods' ADDs on two nodes of
	// two vCPUs take longer when the machine is busy)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	if _, err := run(ctx, "", "kubectl", "-n", ns, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=10m"); err != nil {
		t.Fatal(err)
	}
	stopChurn := churnEndpoints(t, ns, n)
	defer stopChurn()

	stacks := propagationStacks(t, ns)
	measure := func(what string, change func(), want policyWant) {
		t.Helper()
		for _, s := range stacks {
			s.mark()
		}
		cpu0, busy0 := stacksCPU(stacks), machineBusy()
		invoked := time.Now()
		change()
		acked := time.Now()
		inForce := make([]time.Time, len(stacks))
		pending := len(stacks)
		for pending > 0 && time.Since(invoked) < time.Minute {
			time.Sleep(100 * time.Millisecond)
			for i, s := range stacks {
				if !inForce[i].IsZero() {
					continue
				}
				at, err := s.inForce(want)
				if err != nil {
					t.Errorf("%s: reading the log of %s's stack: %v", what, s.pod, err)
					inForce[i] = invoked.Add(time.Hour)
				}
				if !at.IsZero() {
					inForce[i] = at
				}
				if !inForce[i].IsZero() {
					pending--
				}
			}
		}
		// The stacks' own word, once: what their logs told is in force.
		for i, s := range stacks {
			if inForce[i].IsZero() {
				t.Errorf("%s: the stack of %s logged no policy with %s within a minute", what, s.pod, want)
				continue
			}
			if got, err := stackPolicyState(unixClient(s.socket)); err != nil || got != want.inStatus() {
				t.Errorf("%s: the stack of %s logged the change but its status says %s (%v)", what, s.pod, got, err)
			}
		}
		fromInvoked := make([]time.Duration, 0, len(stacks))
		fromAcked := make([]time.Duration, 0, len(stacks))
		byNode := map[string][]time.Duration{}
		for i, at := range inForce {
			if at.IsZero() {
				continue
			}
			fromInvoked = append(fromInvoked, at.Sub(invoked))
			fromAcked = append(fromAcked, at.Sub(acked))
			byNode[stacks[i].node] = append(byNode[stacks[i].node], at.Sub(acked))
		}
		if len(fromAcked) == 0 {
			return
		}
		t.Logf("%s: %d pods on %d nodes, %d Services' endpoints churning (%d changes so far); kubectl took %s; "+
			"from kubectl invoked to the stack holding it: %s; from the API server's answer: %s",
			what, len(fromAcked), len(nodes), churnServices, churned.Load(), acked.Sub(invoked).Round(time.Millisecond),
			quantiles(fromInvoked), quantiles(fromAcked))
		for _, node := range nodes {
			t.Logf("%s: node %s: %d stacks, from the API server's answer: %s", what, node, len(byNode[node]), quantiles(byNode[node]))
		}
		last := invoked.Add(slices.Max(fromInvoked))
		logAgentRounds(t, what, invoked, acked, last.Add(time.Second))
		// What the stacks of node 1 (the test's PID namespace) spent
		// meanwhile, and the machine's CPUs: whether the pushes wait for
		// CPU, and how much of it the stacks take.
		time.Sleep(time.Until(last.Add(time.Second)))
		t.Logf("%s: CPU from kubectl invoked to the last stack's change and a second more: node %s's %d stacks %s, the machine's CPUs busy %s of %s",
			what, node1(), len(byNode[node1()]), stacksCPU(stacks)-cpu0, machineBusy()-busy0, time.Since(invoked).Round(time.Millisecond))
	}
	// Not waiting for a deleted object to be gone: kubectl returns with
	// the API server's answer, as apply does.
	measure("default deny applied", func() {
		apply(t, fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: %s}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`, ns))
	}, policyWant{isolated: true})
	measure("default deny deleted", func() {
		mustKubectl(t, "-n", ns, "delete", "networkpolicy", "deny-all", "--wait=false")
	}, policyWant{})
	// A cluster policy's change takes the same way, from another watch:
	// an Admin-tier Deny of everything into the namespace.
	cnp := ns + "-admin-deny"
	t.Cleanup(func() { kubectl("delete", "clusternetworkpolicy", cnp, "--ignore-not-found") })
	measure("Admin-tier ClusterNetworkPolicy applied", func() {
		apply(t, fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: %s}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: %s}}}
  ingress:
  - {name: deny-all, action: Deny, from: [{namespaces: {}}]}
`, cnp, ns))
	}, policyWant{admin: 1})
	measure("Admin-tier ClusterNetworkPolicy deleted", func() {
		mustKubectl(t, "delete", "clusternetworkpolicy", cnp, "--wait=false")
	}, policyWant{})
}

// quantiles formats the p50, p99 and max of ds (sorted in place).
func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "no samples"
	}
	slices.Sort(ds)
	q := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	return fmt.Sprintf("p50 %s, p99 %s, max %s", q(0.5).Round(time.Millisecond), q(0.99).Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
}

// propStack is one pod's stack as the propagation check follows it: its
// control socket and its log, read from where the last mark left it.
type propStack struct {
	pod, node   string
	socket, log string
	pid         int // in node 1's PID namespace; 0: not known yet
	offset      int64
	partial     []byte
}

// podNodeList is a pod list as far as the propagation check reads it:
// each pod's name and node.
type podNodeList struct {
	Items []struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			NodeName string `json:"nodeName"`
		} `json:"spec"`
	} `json:"items"`
}

// propagationStacks finds the stacks of the pods of ns on both nodes.
func propagationStacks(t *testing.T, ns string) []*propStack {
	t.Helper()
	var list podNodeList
	if err := kubectlJSON(&list, "-n", ns, "get", "pods"); err != nil {
		t.Fatal(err)
	}
	var stacks []*propStack
	for _, it := range list.Items {
		runDir, stateDir, logDir := "/run/cni-usernet", "/var/lib/cni-usernet", "/var/log/cni-usernet"
		if it.Spec.NodeName != node1() {
			runDir, stateDir, logDir = node2Dir(runDir), node2Dir(stateDir), node2Dir(logDir)
		}
		a, err := attachmentOf(stateDir, ns, it.Metadata.Name)
		if err != nil {
			t.Fatal(err)
		}
		// The recorded paths are the node's; node 2's lie elsewhere here.
		stacks = append(stacks, &propStack{pod: it.Metadata.Name, node: it.Spec.NodeName,
			socket: filepath.Join(runDir, filepath.Base(a.ControlSocket)), log: filepath.Join(logDir, filepath.Base(a.LogPath))})
	}
	return stacks
}

// stacksCPU is the CPU time the stacks of node 1 used so far (user and
// system), from /proc (node 2's stacks log PIDs of its own namespace).
func stacksCPU(stacks []*propStack) time.Duration {
	var ticks int64
	for _, s := range stacks {
		if s.node != node1() {
			continue
		}
		if s.pid == 0 {
			s.pid = logPID(s.log)
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.pid))
		if s.pid == 0 || err != nil {
			continue
		}
		// The fields after the command's closing parenthesis: utime and
		// stime are the 12th and 13th.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		for _, i := range []int{11, 12} {
			if n, err := strconv.ParseInt(f[i], 10, 64); err == nil {
				ticks += n
			}
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ, 100 on Linux
}

// machineBusy is the CPU time the machine's CPUs spent not idle so far,
// from /proc/stat.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	var ticks int64
	for i, f := range strings.Fields(line)[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(f, 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// logPID is the PID a stack's log lines name, or 0.
func logPID(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	var l struct {
		PID int `json:"pid"`
	}
	json.NewDecoder(f).Decode(&l)
	return l.PID
}

// mark makes the next inForce read only what the stack logs from now on.
func (s *propStack) mark() {
	s.offset, s.partial = 0, nil
	if fi, err := os.Stat(s.log); err == nil {
		s.offset = fi.Size()
	}
}

// policyWant is what the propagation check waits for in a stack's
// policy: whether NetworkPolicy isolates its ingress, and how many
// policies (in the status) or rules (in the log line; one each here) of
// the Admin tier it holds.
type policyWant struct {
	isolated bool
	admin    int
}

// inStatus is w as a stack's status says it: there, ingress is isolated
// when anything can be denied, by NetworkPolicy or by a tier's rule.
func (w policyWant) inStatus() policyWant {
	return policyWant{isolated: w.isolated || w.admin > 0, admin: w.admin}
}

func (w policyWant) String() string {
	return fmt.Sprintf("ingress isolated %v and %d Admin-tier policies", w.isolated, w.admin)
}

// inForce reads the stack's log from where it was left: the time of the
// first line that tells of a policy as wanted put in force, or zero.
func (s *propStack) inForce(want policyWant) (time.Time, error) {
	f, err := os.Open(s.log)
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, s.offset, 1<<30))
	if err != nil {
		return time.Time{}, err
	}
	s.offset += int64(len(b))
	b = append(s.partial, b...)
	end := bytes.LastIndexByte(b, '\n') + 1
	s.partial = slices.Clone(b[end:])
	for line := range bytes.SplitSeq(b[:end], []byte("\n")) {
		var l struct {
			Time            time.Time `json:"time"`
			Msg             string    `json:"msg"`
			IngressIsolated bool      `json:"ingressIsolated"`
			IngressAdmin    int       `json:"ingressAdmin"`
		}
		if json.Unmarshal(line, &l) == nil && l.Msg == "network policy in force" && (policyWant{l.IngressIsolated, l.IngressAdmin}) == want {
			return l.Time, nil
		}
	}
	return time.Time{}, nil
}

// logAgentRounds logs the agents' rounds that pushed between from and to,
// relative to the API server's answer (acked): when each agent saw the
// change, how long it waited for its round, and where the round's time
// went (summed over its workers: compiling, the policy files, the PUTs).
func logAgentRounds(t *testing.T, what string, from, acked, to time.Time) {
	t.Helper()
	var list podNodeList
	if err := kubectlJSON(&list, "-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=cni-usernet"); err != nil {
		t.Logf("%s: listing the agents: %v", what, err)
		return
	}
	for _, it := range list.Items {
		out, err := kubectl("-n", "kube-system", "logs", it.Metadata.Name, "-c", "agent", "--since-time="+from.Add(-time.Second).UTC().Format(time.RFC3339))
		if err != nil {
			t.Logf("%s: the logs of agent %s: %v", what, it.Metadata.Name, err)
			continue
		}
		for line := range strings.SplitSeq(out, "\n") {
			var l struct {
				Time       time.Time `json:"time"`
				Msg        string    `json:"msg"`
				Compiled   int       `json:"compiled"`
				Pushed     int       `json:"pushed"`
				ChangeSeen time.Time `json:"changeSeen"`
				WaitedMs   float64   `json:"waitedMs"`
				TookMs     float64   `json:"tookMs"`
				LastPushMs float64   `json:"lastPushMs"`
				CompileMs  float64   `json:"compileMs"`
				FileMs     float64   `json:"fileMs"`
				PutMs      float64   `json:"putMs"`
				LockMs     float64   `json:"lockMs"`
			}
			if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "policies pushed" || l.Time.Before(from) || l.Time.After(to) {
				continue
			}
			seen := "-"
			if !l.ChangeSeen.IsZero() {
				seen = l.ChangeSeen.Sub(acked).Round(time.Millisecond).String()
			}
			t.Logf("%s: agent on %s: round ended %s after the API's answer: change seen at %s, waited %.0f ms for the round; "+
				"compiled %d, pushed %d; took %.0f ms (last push at %.0f ms); summed over the workers: compile %.0f ms, files %.0f ms, PUTs %.0f ms, waiting for a pod's lock %.0f ms",
				what, it.Spec.NodeName, l.Time.Sub(acked).Round(time.Millisecond), seen, l.WaitedMs,
				l.Compiled, l.Pushed, l.TookMs, l.LastPushMs, l.CompileMs, l.FileMs, l.PutMs, l.LockMs)
		}
	}
}

// churnServices is how many Services of the propagation check have
// endpoints that change while it measures.
const churnServices = 50

// churned counts the endpoint changes churnEndpoints made.
var churned atomic.Int64

// churnEvery paces the endpoint churn: each change moves one pod between
// two Services. A label change by kubectl is a process of its own: run
// back to back they reached about 3 changes a second and kept the lab's
// two CPUs, the ones the agents and stacks push with, all but fully
// busy while a change propagated. The churn goes through one API client
// instead, at a steady rate above that.
const churnEvery = 200 * time.Millisecond

// churnEndpoints moves the pods of ns (p0..p<n-1>) from one churn Service
// to the next, one label change every churnEvery, until the returned stop
// is called: each change moves a pod's address between two Services'
// EndpointSlices.
func churnEndpoints(t *testing.T, ns string, n int) (stop func()) {
	t.Helper()
	api := newAPIPatcher(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(churnEvery)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			pod, svc := fmt.Sprintf("p%d", i%n), fmt.Sprintf("s%d", i%churnServices)
			patch := fmt.Sprintf(`{"metadata":{"labels":{"churn":%q}}}`, svc)
			if err := api.patch(ctx, "/api/v1/namespaces/"+ns+"/pods/"+pod, patch); err == nil {
				churned.Add(1)
			} else if ctx.Err() == nil {
				t.Logf("endpoint churn: %v", err)
			}
		}
	}()
	return func() {
		cancel()
		<-done
		t.Logf("endpoint churn: %d label changes across %d Services", churned.Load(), churnServices)
	}
}

// apiPatcher sends merge patches to the API server with KUBECONFIG's
// credentials, over one connection.
type apiPatcher struct {
	server string
	token  string
	client *http.Client
}

func newAPIPatcher(t *testing.T) *apiPatcher {
	t.Helper()
	cfg, err := kube.ReadKubeconfig(os.Getenv("KUBECONFIG"))
	if err != nil {
		t.Fatalf("reading KUBECONFIG for the endpoint churn: %v", err)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.TLSServerName}
	if len(cfg.CAPEM) > 0 {
		tc.RootCAs = x509.NewCertPool()
		tc.RootCAs.AppendCertsFromPEM(cfg.CAPEM)
	}
	if len(cfg.CertPEM) > 0 {
		cert, err := tls.X509KeyPair(cfg.CertPEM, cfg.KeyPEM)
		if err != nil {
			t.Fatalf("the client certificate of KUBECONFIG: %v", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	token := cfg.Token
	if cfg.TokenFile != "" {
		b, err := os.ReadFile(cfg.TokenFile)
		if err != nil {
			t.Fatalf("the token file of KUBECONFIG: %v", err)
		}
		token = strings.TrimSpace(string(b))
	}
	return &apiPatcher{server: strings.TrimSuffix(cfg.Server, "/"), token: token,
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}}
}

func (a *apiPatcher) patch(ctx context.Context, path, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, a.server+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/merge-patch+json")
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("patching %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("patching %s: %s: %s", path, resp.Status, msg)
	}
	return nil
}

// stackSocketOf finds the control socket of pod ns/name's attachment in a
// node's state directory.
func stackSocketOf(stateDir, runDir, ns, name string) (string, error) {
	a, err := attachmentOf(stateDir, ns, name)
	if err != nil {
		return "", err
	}
	// The recorded path is the node's; node 2's lies elsewhere here.
	return filepath.Join(runDir, filepath.Base(a.ControlSocket)), nil
}

// attachmentOf finds pod ns/name's attachment in a node's state directory.
func attachmentOf(stateDir, ns, name string) (*state.Attachment, error) {
	atts, errs := state.Store{Dir: stateDir}.List()
	for _, a := range atts {
		if a.PodNS == ns && a.PodName == name {
			return a, nil
		}
	}
	return nil, fmt.Errorf("no attachment of %s/%s in %s (%v)", ns, name, stateDir, errs)
}

func unixClient(sock string) *http.Client {
	return &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

// stackPolicyState reads whether the stack's policy isolates ingress and
// how many Admin-tier policies it holds.
func stackPolicyState(c *http.Client) (policyWant, error) {
	resp, err := c.Get("http://stack/status")
	if err != nil {
		return policyWant{}, err
	}
	defer resp.Body.Close()
	var st struct {
		Policy *struct {
			IngressIsolated bool `json:"ingressIsolated"`
			Layers          *struct {
				Admin int `json:"admin"`
			} `json:"layers"`
		} `json:"policy"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return policyWant{}, err
	}
	if st.Policy == nil {
		return policyWant{}, fmt.Errorf("no policy in the status")
	}
	w := policyWant{isolated: st.Policy.IngressIsolated}
	if st.Policy.Layers != nil {
		w.admin = st.Policy.Layers.Admin
	}
	return w, nil
}

// policyPods is how many pods the propagation measurement runs
// (E2E_POLICY_PODS; the issue asks for 100).
func policyPods() int {
	if n, err := strconv.Atoi(os.Getenv("E2E_POLICY_PODS")); err == nil && n > 0 {
		return n
	}
	return 200
}

// checkDenialsOnNode reads `cni-usernet denials` on node 1, as
// docs/troubleshooting.md ("Policy denies what it should allow") tells an
// operator to: the probes just denied show up for the pods of ns on that
// node, naming the isolating policy and the reason "no rule admits".
func checkDenialsOnNode(t *testing.T, pods []*mpod, ns, what string) {
	t.Helper()
	findDenial(t, pods, ns, what, fmt.Sprintf("an ingress denial by %s/deny-all (\"no rule admits\")", ns), func(r denialRow) bool {
		return r.Direction == "ingress" && strings.Contains(r.Policies, ns+"/deny-all") && r.Reason == "no rule admits"
	})
}

// denialRow is a row of `cni-usernet denials --json`, as far as the
// checks read it.
type denialRow struct{ Pod, Direction, Layer, Policies, Reason string }

// findDenial reads `cni-usernet denials` on node 1 for the first pod of
// ns there and wants a row of it that match accepts (want says which).
func findDenial(t *testing.T, pods []*mpod, ns, what, want string, match func(denialRow) bool) {
	t.Helper()
	for _, p := range pods {
		if p.full != ns || p.node != node1() {
			continue
		}
		key := p.full + "/" + p.name
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := run(ctx, "", installed, "denials", "--json", "--pod", key)
		cancel()
		if err != nil {
			t.Errorf("%s: cni-usernet denials --pod %s: %v", what, key, err)
			return
		}
		var rows []denialRow
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Errorf("%s: decoding cni-usernet denials --json: %v\n%s", what, err, out)
			return
		}
		for _, r := range rows {
			if r.Pod == key && match(r) {
				t.Logf("%s: %s's denials on node %s name layer %q, policies %s: %s", what, r.Pod, node1(), r.Layer, r.Policies, r.Reason)
				return
			}
		}
		t.Errorf("%s: cni-usernet denials on node %s shows no %s for %s:\n%s", what, node1(), want, key, out)
		return
	}
	t.Logf("%s: no pod of %s on node %s to read denials of", what, ns, node1())
}

// checkTerminatingPeer: a pod being deleted stays a peer of the policies
// that admit it until its address is released. db admits only app=web;
// web, in a 40 s preStop after `kubectl delete`, opens a new connection to
// db, as a draining client does, and gets through on both nodes' agents'
// view (db and web on different nodes when there are two).
func checkTerminatingPeer(t *testing.T, prefix string) {
	ns := prefix + "-term"
	n2 := node2()
	if n2 == "" {
		n2 = node1()
	}
	web := strings.Replace(podManifestOn(ns, "web", "", n2, map[string]string{"role": "web"}),
		"  terminationGracePeriodSeconds: 1\n", "  terminationGracePeriodSeconds: 60\n", 1)
	web = strings.Replace(web, "    args: [serve]\n", "    args: [serve]\n    lifecycle: {preStop: {exec: {command: [sleep, \"40\"]}}}\n", 1)
	t.Cleanup(func() { kubectl("delete", "ns", ns, "--wait=false") })
	apply(t, fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", ns)+
		podManifestOn(ns, "db", "", node1(), nil)+web+fmt.Sprintf(`---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-from-web, namespace: %s}
spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: web}}
`, ns))
	mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=3m")
	db := getPod(t, ns, "db").Status.PodIP
	fetch := func(what string) bool {
		out, _ := kubectl("-n", ns, "exec", "web", "--", "/podtool", "probe", "2s", "tcp:"+net.JoinHostPort(db, "8080"))
		ok := strings.Contains(out, " ok")
		t.Logf("%s: web → db %s: %s", what, db, strings.TrimSpace(out))
		return ok
	}
	eventually(t, 30*time.Second, "web reaching db before its deletion", func() error {
		if !fetch("before deletion") {
			return fmt.Errorf("web cannot reach db while running")
		}
		return nil
	})
	mustKubectl(t, "-n", ns, "delete", "pod", "web", "--wait=false")
	eventually(t, 30*time.Second, "web terminating", func() error {
		if p := getPod(t, ns, "web"); p.Metadata.DeletionTimestamp == "" {
			return fmt.Errorf("web has no deletionTimestamp yet")
		}
		return nil
	})
	// The agents have seen the deletion by now (their watches are in
	// step within moments); web is in its preStop, its address held.
	time.Sleep(5 * time.Second)
	if !fetch("terminating, in preStop") {
		t.Errorf("web, terminating but still holding its address, could not open a new connection to db, which admits it: a terminating pod must stay a peer until its address is released")
	}
	mustKubectl(t, "-n", ns, "delete", "pod", "web", "--grace-period=0", "--force")
}
