package main

import (
	"fmt"
	"net/netip"
	"strconv"
)

// clusterSpec is the size of a synthetic cluster.
type clusterSpec struct {
	// Pods, Services and Policies are counted over the whole cluster,
	// besides kube-system's DNS (two pods, one Service). Policies include
	// the one default-deny-egress-but-DNS policy of every namespace.
	Pods, Services, Policies, Namespaces int
	// Endpoints is the ready endpoints of each Service (its first pods).
	Endpoints int
	// Local is the pods on the agent's node, spread over the namespaces.
	Local int
	// ClusterPolicies is how many ClusterNetworkPolicies the cluster
	// holds (clusterPolicy); zero: none, and their collection is not
	// served (a cluster without the CRD).
	ClusterPolicies int
}

func (s clusterSpec) podsPerNS() int  { return s.Pods / s.Namespaces }
func (s clusterSpec) podsPerApp() int { return s.Pods / s.Services }
func (s clusterSpec) appsPerNS() int  { return s.podsPerNS() / s.podsPerApp() }

func (s clusterSpec) validate() error {
	switch {
	case s.Pods <= 0 || s.Services <= 0 || s.Namespaces <= 0 || s.Local <= 0:
		return fmt.Errorf("cluster %+v: every count must be positive", s)
	case s.Pods%s.Namespaces != 0 || s.Pods%s.Services != 0:
		return fmt.Errorf("cluster %+v: pods must divide into namespaces and Services evenly", s)
	case s.podsPerNS()%s.podsPerApp() != 0 || s.appsPerNS() < 8:
		return fmt.Errorf("cluster %+v: a namespace must hold at least 8 whole apps (one Service each)", s)
	case s.Endpoints > s.podsPerApp() || s.Endpoints <= 0:
		return fmt.Errorf("cluster %+v: endpoints per Service must be 1 to the pods of its app", s)
	case s.Local > s.Pods/2 || s.Pods/s.Local < s.podsPerApp()+3:
		return fmt.Errorf("cluster %+v: too many local pods for the cluster", s)
	case s.Policies < s.Namespaces:
		return fmt.Errorf("cluster %+v: at least one policy per namespace (the default deny)", s)
	}
	return nil
}

// The shape of the synthetic cluster. Pod j lives in namespace
// j/podsPerNS and runs app j/podsPerApp, every app with its own Service
// whose first Endpoints pods are its ready endpoints; the pods alternate
// tier frontend and backend. In every namespace:
//   - default-deny-egress: egress isolated, DNS to kube-system allowed;
//   - the other policies, spread over the namespaces, each select one app
//     (never the namespace's first app) and let in its namespace's
//     frontend pods and every pod of one other team's namespaces on the
//     named port http; every fourth also lets its app out to the
//     namespace's first app ("db") on 8080.
//
// So a local pod's rules reach its own namespace's db Service and
// kube-dns, and no other Service: an EndpointSlice change of any other
// app is one no local pod's rules reach.
const (
	nodeName   = "bench-node"
	remoteNode = "node-%d" // the other nodes, 50 of them
	httpPort   = 8080
)

var (
	podBase     = netip.MustParseAddr("10.64.0.1")  // pod j: podBase + j
	addedBase   = netip.MustParseAddr("10.72.0.1")  // pods the events add
	serviceBase = netip.MustParseAddr("10.96.16.1") // Service s: serviceBase + s
	dnsIP       = netip.MustParseAddr("10.96.0.10")
)

func addrAdd(a netip.Addr, n int) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// cluster is the synthetic cluster: the objects to serve, and what the
// events change.
type cluster struct {
	spec   clusterSpec
	uid    int
	Nodes  []*node
	NSes   []*namespace
	Pods   []*pod
	Svcs   []*service
	Slices []*endpointSlice
	Pols   []*networkPolicy
	CNPs   []*clusterNetworkPolicy
	// local are the indexes in Pods of the agent's node's pods.
	local []int
	added int // pods and policies the events added so far
}

const created = "2026-01-01T00:00:00Z"

func (c *cluster) meta(ns, name string, labels map[string]string) objectMeta {
	c.uid++
	return objectMeta{Namespace: ns, Name: name, Labels: labels, CreationTimestamp: created,
		UID: fmt.Sprintf("00000000-0000-4000-8000-%012x", c.uid)}
}

func nsName(i int) string  { return fmt.Sprintf("ns-%04d", i) }
func appName(a int) string { return fmt.Sprintf("app-%05d", a) }
func team(i int) string    { return "team-" + strconv.Itoa(i%10) }

// newCluster builds the cluster s describes.
func newCluster(s clusterSpec) (*cluster, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	c := &cluster{spec: s}
	c.addNodes()
	c.addNamespace("kube-system", map[string]string{"kubernetes.io/metadata.name": "kube-system"})
	for i := range s.Namespaces {
		c.addNamespace(nsName(i), map[string]string{"kubernetes.io/metadata.name": nsName(i), "team": team(i)})
	}
	stride := s.Pods / s.Local
	// The local pod of each stride runs its namespace's second app (the
	// first is the db that egress rules reach).
	off := s.podsPerApp() + 2
	for j := range s.Pods {
		where := fmt.Sprintf(remoteNode, j%50)
		if j%stride == off && len(c.local) < s.Local {
			where = nodeName
			c.local = append(c.local, j)
		}
		c.Pods = append(c.Pods, c.newPod(nsName(j/s.podsPerNS()), fmt.Sprintf("pod-%06d", j),
			appName(j/s.podsPerApp()), j%2 == 0, addrAdd(podBase, j), where))
	}
	for a := range s.Services {
		c.addService(a)
	}
	// After the apps' pods, Services and slices: index j of Pods is pod
	// j, index a of Slices app a's.
	c.addDNS()
	for i := range s.Namespaces {
		c.Pols = append(c.Pols, c.defaultDeny(nsName(i)))
	}
	for q := range s.Policies - s.Namespaces {
		c.Pols = append(c.Pols, c.appPolicy(q))
	}
	for q := range s.ClusterPolicies {
		c.CNPs = append(c.CNPs, c.clusterPolicy(q, 2222))
	}
	return c, nil
}

func (c *cluster) addNodes() {
	n := &node{Metadata: c.meta("", nodeName, map[string]string{"kubernetes.io/hostname": nodeName})}
	n.Spec.PodCIDR, n.Spec.PodCIDRs = "10.244.0.0/24", []string{"10.244.0.0/24"}
	n.Status.Addresses = []nodeAddress{{"InternalIP", "192.168.0.10"}, {"Hostname", nodeName}}
	c.Nodes = append(c.Nodes, n)
	for i := range 50 {
		name := fmt.Sprintf(remoteNode, i)
		r := &node{Metadata: c.meta("", name, map[string]string{"kubernetes.io/hostname": name})}
		cidr := fmt.Sprintf("10.244.%d.0/24", i+1)
		r.Spec.PodCIDR, r.Spec.PodCIDRs = cidr, []string{cidr}
		r.Status.Addresses = []nodeAddress{{"InternalIP", fmt.Sprintf("192.168.0.%d", 20+i)}}
		c.Nodes = append(c.Nodes, r)
	}
}

func (c *cluster) addNamespace(name string, labels map[string]string) {
	ns := &namespace{Metadata: c.meta("", name, labels)}
	ns.Spec.Finalizers = []string{"kubernetes"}
	ns.Status.Phase = "Active"
	c.NSes = append(c.NSes, ns)
}

func (c *cluster) newPod(ns, name, app string, frontend bool, ip netip.Addr, where string) *pod {
	tier := "backend"
	if frontend {
		tier = "frontend"
	}
	p := &pod{Metadata: c.meta(ns, name, map[string]string{"app": app, "tier": tier, "pod-template-hash": "5d8f7c9b6"})}
	p.Spec.NodeName = where
	p.Spec.Containers = []container{{Name: "app", Image: "registry.example/app:1.0",
		Ports: []containerPort{{Name: "http", ContainerPort: httpPort, Protocol: "TCP"}}}}
	p.Status.Phase = "Running"
	p.Status.HostIP = "192.168.0.10"
	p.Status.PodIP = ip.String()
	p.Status.PodIPs = []podIP{{ip.String()}}
	return p
}

func (c *cluster) addDNS() {
	var eps []endpoint
	for i := range 2 {
		ip := addrAdd(netip.MustParseAddr("10.63.255.1"), i)
		p := c.newPod("kube-system", fmt.Sprintf("coredns-%d", i), "coredns", false, ip, fmt.Sprintf(remoteNode, i))
		p.Metadata.Labels = map[string]string{"k8s-app": "kube-dns"}
		p.Spec.Containers[0].Ports = []containerPort{{Name: "dns", ContainerPort: 53, Protocol: "UDP"}, {Name: "dns-tcp", ContainerPort: 53, Protocol: "TCP"}}
		c.Pods = append(c.Pods, p)
		eps = append(eps, endpoint{Addresses: []string{ip.String()}, Conditions: endpointConditions{Ready: ptr(true)},
			NodeName: p.Spec.NodeName, TargetRef: &objectReference{"Pod", "kube-system", p.Metadata.Name}})
	}
	s := &service{Metadata: c.meta("kube-system", "kube-dns", map[string]string{"k8s-app": "kube-dns"})}
	s.Spec.Type = "ClusterIP"
	s.Spec.Selector = map[string]string{"k8s-app": "kube-dns"}
	s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = dnsIP.String(), []string{dnsIP.String()}, []string{"IPv4"}
	s.Spec.Ports = []servicePort{{"dns", "UDP", 53, 53}, {"dns-tcp", "TCP", 53, 53}}
	c.Svcs = append(c.Svcs, s)
	es := &endpointSlice{Metadata: c.meta("kube-system", "kube-dns-x7k2p",
		map[string]string{"kubernetes.io/service-name": "kube-dns", "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}),
		AddressType: "IPv4", Endpoints: eps,
		Ports: []endpointPort{{ptr("dns"), ptr("UDP"), ptr(int32(53))}, {ptr("dns-tcp"), ptr("TCP"), ptr(int32(53))}}}
	c.Slices = append(c.Slices, es)
}

// addService adds app a's Service and its EndpointSlice.
func (c *cluster) addService(a int) {
	s := c.spec
	first := a * s.podsPerApp()
	ns := nsName(first / s.podsPerNS())
	name := "svc-" + appName(a)
	vip := addrAdd(serviceBase, a).String()
	svc := &service{Metadata: c.meta(ns, name, map[string]string{"app": appName(a)})}
	svc.Spec.Type = "ClusterIP"
	svc.Spec.Selector = map[string]string{"app": appName(a)}
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs, svc.Spec.IPFamilies = vip, []string{vip}, []string{"IPv4"}
	svc.Spec.Ports = []servicePort{{"http", "TCP", 80, httpPort}}
	c.Svcs = append(c.Svcs, svc)
	es := &endpointSlice{Metadata: c.meta(ns, name+"-abcde",
		map[string]string{"kubernetes.io/service-name": name, "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}),
		AddressType: "IPv4", Ports: []endpointPort{{ptr("http"), ptr("TCP"), ptr(int32(httpPort))}}}
	for k := range s.Endpoints {
		p := c.Pods[first+k]
		es.Endpoints = append(es.Endpoints, endpoint{Addresses: []string{p.Status.PodIP}, Conditions: endpointConditions{Ready: ptr(true)},
			NodeName: p.Spec.NodeName, TargetRef: &objectReference{"Pod", ns, p.Metadata.Name}})
	}
	c.Slices = append(c.Slices, es)
}

// defaultDeny isolates every pod of ns for egress but DNS.
func (c *cluster) defaultDeny(ns string) *networkPolicy {
	p := &networkPolicy{Metadata: c.meta(ns, "default-deny-egress", nil)}
	p.Metadata.Generation = 1
	p.Spec.PolicyTypes = []string{"Egress"}
	p.Spec.Egress = []egressRule{{
		To: []policyPeer{{NamespaceSelector: &labelSelector{map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
			PodSelector: &labelSelector{map[string]string{"k8s-app": "kube-dns"}}}},
		Ports: []policyPort{{"UDP", &intOrString{i: 53}}, {"TCP", &intOrString{i: 53}}},
	}}
	return p
}

// appPolicy is the q-th of the policies besides the default denies.
func (c *cluster) appPolicy(q int) *networkPolicy {
	s := c.spec
	n := q % s.Namespaces
	round := q / s.Namespaces
	// Apps 1 .. appsPerNS-1 of the namespace, never its db (app 0).
	app := n*s.appsPerNS() + 1 + round%(s.appsPerNS()-1)
	p := &networkPolicy{Metadata: c.meta(nsName(n), fmt.Sprintf("allow-%s-%d", appName(app), round), nil)}
	p.Metadata.Generation = 1
	p.Spec.PodSelector = labelSelector{map[string]string{"app": appName(app)}}
	p.Spec.PolicyTypes = []string{"Ingress"}
	p.Spec.Ingress = []ingressRule{{
		From: []policyPeer{
			{PodSelector: &labelSelector{map[string]string{"tier": "frontend"}}},
			// Never the policy's own team, so that a pod's tier decides.
			{NamespaceSelector: &labelSelector{map[string]string{"team": team(n + 3)}}},
		},
		Ports: []policyPort{{"TCP", &intOrString{s: "http"}}},
	}}
	if q%4 == 0 {
		p.Spec.PolicyTypes = append(p.Spec.PolicyTypes, "Egress")
		p.Spec.Egress = []egressRule{{
			To:    []policyPeer{{PodSelector: &labelSelector{map[string]string{"app": appName(n * s.appsPerNS())}}}},
			Ports: []policyPort{{"TCP", &intOrString{i: httpPort}}},
		}}
	}
	return p
}

// localPod is the i-th pod on the agent's node.
func (c *cluster) localPod(i int) *pod { return c.Pods[c.local[i]] }
