package netpolicy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// The upstream network policy e2e tests' cluster (test/e2e/network/netpol):
// namespaces x, y, z, each with pods a, b, c serving 80 and 81 on TCP, UDP
// and SCTP under named ports; every pod is dual-stack here. z/c is the odd
// one: its serve-80-tcp is 8080 and it declares no serve-81-tcp, for the
// named ports that resolve on each destination pod.
var (
	namespaces = []string{"x", "y", "z"}
	podNames   = []string{"a", "b", "c"}
	nodeAddrs  = []netip.Addr{netip.MustParseAddr("192.168.0.10"), netip.MustParseAddr("fd00:ffff::10")}
)

func podAddr4(ns, pod string) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(1 + strings.Index("xyz", ns)), 0, byte(1 + strings.Index("abc", pod))})
}

func podAddr6(ns, pod string) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("fd00:%d::%d", 1+strings.Index("xyz", ns), 1+strings.Index("abc", pod)))
}

func servePorts() []ContainerPort {
	var ps []ContainerPort
	for _, port := range []int32{80, 81} {
		for _, proto := range []string{"TCP", "UDP", "SCTP"} {
			ps = append(ps, ContainerPort{Name: fmt.Sprintf("serve-%d-%s", port, strings.ToLower(proto)), ContainerPort: port, Protocol: proto})
		}
	}
	return ps
}

func testPod(ns, name string) *Pod {
	ports := servePorts()
	if ns == "z" && name == "c" {
		ports = []ContainerPort{{Name: "serve-80-tcp", ContainerPort: 8080}, {Name: "serve-80-udp", ContainerPort: 8080, Protocol: "UDP"}}
	}
	return &Pod{
		Metadata: ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"pod": name}},
		// The ports split over two containers: a named port is any
		// container's.
		Spec:   PodSpec{Containers: []Container{{Ports: ports[:2]}, {Ports: ports[2:]}}},
		Status: PodStatus{Phase: "Running", PodIPs: []PodIP{{IP: podAddr4(ns, name).String()}, {IP: podAddr6(ns, name).String()}}},
	}
}

func xyz() *Snapshot {
	s := &Snapshot{
		Policies:       map[string]*NetworkPolicy{},
		Pods:           map[string]*Pod{},
		Namespaces:     map[string]*Namespace{},
		Services:       map[string]*Service{},
		EndpointSlices: map[string]*EndpointSlice{},
	}
	for _, ns := range namespaces {
		s.Namespaces[ns] = &Namespace{Metadata: ObjectMeta{Name: ns, Labels: map[string]string{"ns": ns, namespaceLabelKey: ns}}}
		for _, p := range podNames {
			s.Pods[ns+"/"+p] = testPod(ns, p)
		}
	}
	return s
}

func addPolicies(s *Snapshot, nps ...*NetworkPolicy) {
	for _, np := range nps {
		s.Policies[np.Metadata.Namespace+"/"+np.Metadata.Name] = np
	}
}

func netpol(ns, name string, spec NetworkPolicySpec) *NetworkPolicy {
	return &NetworkPolicy{Metadata: ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
}

func labels(kv ...string) *LabelSelector {
	s := &LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func expr(key, op string, values ...string) *LabelSelector {
	return &LabelSelector{MatchExpressions: []LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

func numPort(proto string, port int32) NetworkPolicyPort {
	p := NetworkPolicyPort{Port: &IntOrString{Int: port}}
	if proto != "" {
		p.Protocol = &proto
	}
	return p
}

func namePort(proto, name string) NetworkPolicyPort {
	p := NetworkPolicyPort{Port: &IntOrString{IsString: true, Str: name}}
	if proto != "" {
		p.Protocol = &proto
	}
	return p
}

func rangePort(port, end int32) NetworkPolicyPort {
	return NetworkPolicyPort{Port: &IntOrString{Int: port}, EndPort: &end}
}

func block(cidr string, except ...string) NetworkPolicyPeer {
	return NetworkPolicyPeer{IPBlock: &IPBlock{CIDR: cidr, Except: except}}
}

// compileAll compiles every pod of s as a local pod, checking that each
// result is valid and that compiling again from a new Compiler (the maps
// iterated in another order) gives the same policy.
func compileAll(t testing.TB, s *Snapshot) (map[string]*policy.PodPolicy, []Warning) {
	t.Helper()
	var local []LocalPod
	for _, key := range slices.Sorted(maps.Keys(s.Pods)) {
		local = append(local, LocalPod{Pod: s.Pods[key]})
	}
	c1, c2 := NewCompiler(s, local), NewCompiler(s, local)
	out := make(map[string]*policy.PodPolicy)
	var warnings []Warning
	for _, lp := range local {
		key := lp.Pod.Metadata.Namespace + "/" + lp.Pod.Metadata.Name
		p, w := c1.Compile(lp, nodeAddrs, 7)
		if err := p.Validate(); err != nil {
			t.Fatalf("%s: compiled policy invalid: %v", key, err)
		}
		again, _ := c2.Compile(lp, nodeAddrs, 7)
		if !policy.Equal(p, again) {
			t.Fatalf("%s: two compiles differ:\n%+v\n%+v", key, p, again)
		}
		out[key] = p
		warnings = append(warnings, w...)
	}
	return out, warnings
}

// allows is the verdict a stack takes on a new connection or flow with
// peer on proto/port in direction d, as docs/policy.md defines it.
func allows(d *policy.Direction, peer netip.Addr, proto policy.Protocol, port uint16) bool {
	if !d.Isolated {
		return true
	}
	for _, r := range d.Rules {
		peerOK := len(r.Peers) == 0 || slices.ContainsFunc(r.Peers, func(p policy.Peer) bool { return peerContains(p, peer) })
		portOK := len(r.Ports) == 0 || slices.ContainsFunc(r.Ports, func(pr policy.PortRange) bool {
			return pr.Protocol == proto && (pr.First == 0 || pr.First <= port && port <= pr.Last)
		})
		if peerOK && portOK {
			return true
		}
	}
	return false
}

// reachable is whether from's connection to to's address reaches it: from's
// egress allows it and to's ingress does (both pods are local here).
func reachable(ps map[string]*policy.PodPolicy, from, to string, dst netip.Addr, proto policy.Protocol, port uint16) bool {
	ns, pod, _ := strings.Cut(from, "/")
	src := podAddr4(ns, pod)
	if dst.Is6() {
		src = podAddr6(ns, pod)
	}
	return allows(&ps[from].Egress, dst, proto, port) && allows(&ps[to].Ingress, src, proto, port)
}

// truth is a reachability matrix over the nine pods, from → to, like the
// upstream tests' Reachability: everything starts at one value and the
// test states the exceptions.
type truth map[[2]string]bool

func allPods() []string {
	var out []string
	for _, ns := range namespaces {
		for _, p := range podNames {
			out = append(out, ns+"/"+p)
		}
	}
	return out
}

func newTruth(v bool) truth {
	t := truth{}
	for _, a := range allPods() {
		for _, b := range allPods() {
			t[[2]string{a, b}] = v
		}
	}
	return t
}

// set sets every pair whose source matches from and destination matches to
// ("x/a" one pod, "x/" a namespace, "" every pod).
func (t truth) set(from, to string, v bool) truth {
	for k := range t {
		if strings.HasPrefix(k[0], from) && strings.HasPrefix(k[1], to) {
			t[k] = v
		}
	}
	return t
}

// check compares the matrix the compiled policies give with t, for every
// pod pair on proto/port over IPv4 and IPv6 (with t6 for IPv6 when not
// nil), loopback aside (as upstream: a pod's traffic to itself never
// reaches its wire leg).
func (t truth) check(tb testing.TB, ps map[string]*policy.PodPolicy, proto policy.Protocol, port uint16, t6 truth) {
	tb.Helper()
	var bad []string
	for _, from := range allPods() {
		for _, to := range allPods() {
			if from == to {
				continue
			}
			ns, pod, _ := strings.Cut(to, "/")
			for _, dst := range []netip.Addr{podAddr4(ns, pod), podAddr6(ns, pod)} {
				got := reachable(ps, from, to, dst, proto, port)
				want := t[[2]string{from, to}]
				if dst.Is6() && t6 != nil {
					want = t6[[2]string{from, to}]
				}
				if got != want {
					bad = append(bad, fmt.Sprintf("%s -> %s (%s) %s/%d: got %v, want %v", from, to, dst, proto, port, got, want))
				}
			}
		}
	}
	if len(bad) > 0 {
		tb.Errorf("reachability differs in %d probes:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}
