package netpolicy

import (
	"fmt"
	"net/netip"
	"testing"
)

// benchCluster is a cluster of nsCount namespaces of podsPerNs pods each,
// with policies policies spread evenly over the namespaces, and one local
// pod per namespace until there are local of them. Its policies are of
// the kinds clusters run: per-app ingress from the front tier, from
// chosen apps of chosen teams' namespaces and from a CIDR, on a numeric
// and a named port; egress to an app in production namespaces on a named
// port plus DNS; and a default deny in every tenth.
func benchCluster(nsCount, podsPerNs, policies, local int) (*Snapshot, []LocalPod) {
	s := &Snapshot{
		Policies:       map[string]*NetworkPolicy{},
		Pods:           map[string]*Pod{},
		Namespaces:     map[string]*Namespace{},
		Services:       map[string]*Service{},
		EndpointSlices: map[string]*EndpointSlice{},
	}
	var locals []LocalPod
	for n := range nsCount {
		ns := fmt.Sprintf("ns%03d", n)
		env := "dev"
		if n%2 == 0 {
			env = "prod"
		}
		s.Namespaces[ns] = &Namespace{Metadata: ObjectMeta{Name: ns, Labels: map[string]string{"team": fmt.Sprintf("t%d", n%10), "env": env}}}
		for j := range podsPerNs {
			tier := "back"
			if j%2 == 0 {
				tier = "front"
			}
			a := netip.AddrFrom4([4]byte{10, byte(n / 250), byte(n % 250), byte(j + 1)})
			pod := &Pod{
				Metadata: ObjectMeta{Name: fmt.Sprintf("pod%02d", j), Namespace: ns, Labels: map[string]string{"app": fmt.Sprintf("app%d", j%5), "tier": tier}},
				Spec: PodSpec{Containers: []Container{{Ports: []ContainerPort{
					{Name: "http", ContainerPort: int32(8080 + j%3)}, {Name: "metrics", ContainerPort: 9090}, {Name: "dns", ContainerPort: 53, Protocol: "UDP"},
				}}}},
				Status: PodStatus{Phase: "Running", PodIPs: []PodIP{{IP: a.String()}}},
			}
			s.Pods[ns+"/"+pod.Metadata.Name] = pod
			if j == 0 && len(locals) < local {
				locals = append(locals, LocalPod{Pod: pod, IPs: []netip.Addr{a}})
			}
		}
		svc := &Service{
			Metadata: ObjectMeta{Name: "svc", Namespace: ns},
			Spec:     ServiceSpec{ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", n/250, n%250+1)}, Ports: []ServicePort{{Name: "http", Port: 80}}},
		}
		s.Services[ns+"/svc"] = svc
		name, port := "http", int32(8080)
		var eps []Endpoint
		for j := range podsPerNs {
			eps = append(eps, Endpoint{Addresses: []string{s.Pods[fmt.Sprintf("%s/pod%02d", ns, j)].Status.PodIPs[0].IP}})
		}
		s.EndpointSlices[ns+"/svc-1"] = &EndpointSlice{
			Metadata:    ObjectMeta{Name: "svc-1", Namespace: ns, Labels: map[string]string{ServiceNameLabel: "svc"}},
			AddressType: "IPv4", Endpoints: eps, Ports: []EndpointPort{{Name: &name, Port: &port}},
		}
	}
	udp := "UDP"
	for i := range policies {
		ns := fmt.Sprintf("ns%03d", i%nsCount)
		spec := NetworkPolicySpec{
			PodSelector: *labels("app", fmt.Sprintf("app%d", i%5)),
			PolicyTypes: []string{"Ingress", "Egress"},
			Ingress: []NetworkPolicyIngressRule{{
				From: []NetworkPolicyPeer{
					{PodSelector: labels("tier", "front")},
					{NamespaceSelector: labels("team", fmt.Sprintf("t%d", i%10)), PodSelector: expr("app", "In", fmt.Sprintf("app%d", (i+1)%5), fmt.Sprintf("app%d", (i+2)%5))},
					block(fmt.Sprintf("172.%d.%d.0/24", 16+i/256%16, i%256), fmt.Sprintf("172.%d.%d.128/25", 16+i/256%16, i%256)),
				},
				Ports: []NetworkPolicyPort{numPort("", int32(8000+i%100)), namePort("", "http")},
			}},
			Egress: []NetworkPolicyEgressRule{{
				To:    []NetworkPolicyPeer{{NamespaceSelector: labels("env", "prod"), PodSelector: labels("app", fmt.Sprintf("app%d", (i+3)%5))}},
				Ports: []NetworkPolicyPort{namePort("", "http")},
			}, {
				To:    []NetworkPolicyPeer{{NamespaceSelector: labels("team", "t0")}},
				Ports: []NetworkPolicyPort{{Protocol: &udp, Port: &IntOrString{Int: 53}}},
			}},
		}
		if i%10 == 0 {
			spec = NetworkPolicySpec{PolicyTypes: []string{"Ingress", "Egress"}}
		}
		addPolicies(s, netpol(ns, fmt.Sprintf("policy%05d", i), spec))
	}
	return s, locals
}

// benchCompile measures what the agent does after a change: a new
// Compiler over the snapshot, then every local pod compiled.
func benchCompile(b *testing.B, nsCount, podsPerNs, policies, local int) {
	s, locals := benchCluster(nsCount, podsPerNs, policies, local)
	node := []netip.Addr{netip.MustParseAddr("192.168.0.10")}
	b.ReportAllocs()
	b.ResetTimer()
	rules := 0
	for i := 0; i < b.N; i++ {
		c := NewCompiler(s, locals)
		rules = 0
		for _, lp := range locals {
			p, _ := c.Compile(lp, node, uint64(i))
			rules += len(p.Ingress.Rules) + len(p.Egress.Rules)
		}
	}
	b.ReportMetric(float64(rules)/float64(len(locals)), "rules/pod")
}

// 100 namespaces of 20 pods (2,000 pods), 100 local pods, one per
// namespace.
func BenchmarkCompile1000Policies100Pods(b *testing.B)  { benchCompile(b, 100, 20, 1000, 100) }
func BenchmarkCompile10000Policies100Pods(b *testing.B) { benchCompile(b, 100, 20, 10000, 100) }

// Every policy in the local pods' namespace: each pod is selected by a
// fifth of them.
func BenchmarkCompile1000PoliciesOneNamespace100Pods(b *testing.B) {
	benchCompile(b, 1, 100, 1000, 100)
}
