package watch

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
)

// collection is how one collection is listed, watched and trimmed.
type collection[T any] struct {
	kind Kind
	// item is the kind a watch event's object is taken for when it does
	// not say.
	item schema.GroupVersionKind
	// accept and acceptList override the media types asked for
	// (metadata only); empty: the typed objects.
	accept, acceptList string
	newList            func() runtime.Object
	// transform turns an API object into what the cache keeps: the
	// fields the compiler reads and nothing else (no managedFields, no
	// annotations, no spec the compiler does not look at). It is called
	// once per object a list or an event brings.
	transform func(runtime.Object) (*T, error)
	// optional: the collection's resource may not be served (a CRD not
	// installed). A list answered 404 is then an empty list, and the
	// informer says once that it is absent.
	optional bool
}

func (c *collection[T]) kindGV() schema.GroupVersion {
	return schema.GroupVersion{Group: c.kind.Group, Version: c.kind.Version}
}

// collections are the five the policy controller watches, by kind.
var collections = map[Kind]any{
	Pods: &collection[netpolicy.Pod]{
		kind: Pods, item: corev1.SchemeGroupVersion.WithKind("Pod"),
		newList: func() runtime.Object { return &corev1.PodList{} }, transform: typed(pod),
	},
	// Labels are all the compiler reads of a namespace: the server sends
	// metadata only.
	Namespaces: &collection[netpolicy.Namespace]{
		kind: Namespaces, item: metav1.SchemeGroupVersion.WithKind("PartialObjectMetadata"),
		accept: acceptMeta, acceptList: acceptMetaList,
		newList:   func() runtime.Object { return &metav1.PartialObjectMetadataList{} },
		transform: namespace,
	},
	Services: &collection[netpolicy.Service]{
		kind: Services, item: corev1.SchemeGroupVersion.WithKind("Service"),
		newList: func() runtime.Object { return &corev1.ServiceList{} }, transform: typed(service),
	},
	EndpointSlices: &collection[netpolicy.EndpointSlice]{
		kind: EndpointSlices, item: discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"),
		newList: func() runtime.Object { return &discoveryv1.EndpointSliceList{} }, transform: typed(endpointSlice),
	},
	NetworkPolicies: &collection[netpolicy.NetworkPolicy]{
		kind: NetworkPolicies, item: networkingv1.SchemeGroupVersion.WithKind("NetworkPolicy"),
		newList: func() runtime.Object { return &networkingv1.NetworkPolicyList{} }, transform: typed(networkPolicy),
	},
}

// typed adapts a transform of one API type.
func typed[A any, T any](f func(*A) *T) func(runtime.Object) (*T, error) {
	return func(o runtime.Object) (*T, error) {
		a, ok := any(o).(*A)
		if !ok {
			return nil, fmt.Errorf("got a %T, want a %T", o, a)
		}
		return f(a), nil
	}
}

// objectMeta is the metadata the cache keeps. Labels are kept, interned,
// only for the kinds whose labels the compiler reads (pods and
// namespaces, which selectors select); see sliceMeta and bareMeta for the
// others.
func objectMeta(m *metav1.ObjectMeta) netpolicy.ObjectMeta {
	om := bareMeta(m)
	om.Labels = m.Labels
	om.InternLabels()
	return om
}

// bareMeta is metadata without labels: a Service's or a NetworkPolicy's
// labels select nothing the compiler looks at, and at 10k Services
// holding them cost more than any other field.
func bareMeta(m *metav1.ObjectMeta) netpolicy.ObjectMeta {
	om := netpolicy.ObjectMeta{
		Name: m.Name, Namespace: netpolicy.Intern(m.Namespace), UID: string(m.UID),
		ResourceVersion: m.ResourceVersion,
	}
	if m.DeletionTimestamp != nil {
		ts := m.DeletionTimestamp.UTC().Format(time.RFC3339)
		om.DeletionTimestamp = &ts
	}
	return om
}

func pod(p *corev1.Pod) *netpolicy.Pod {
	out := &netpolicy.Pod{
		Metadata: objectMeta(&p.ObjectMeta),
		Spec:     netpolicy.PodSpec{NodeName: netpolicy.Intern(p.Spec.NodeName), HostNetwork: p.Spec.HostNetwork},
		Status:   netpolicy.PodStatus{Phase: netpolicy.Intern(string(p.Status.Phase))},
	}
	for _, c := range p.Spec.Containers {
		// Only named ports matter (a policy's named port resolves through
		// them); a container without ports still takes its place, as the
		// API lists it.
		var ports []netpolicy.ContainerPort
		for _, cp := range c.Ports {
			ports = append(ports, netpolicy.ContainerPort{Name: netpolicy.Intern(cp.Name), ContainerPort: cp.ContainerPort, Protocol: netpolicy.Intern(string(cp.Protocol))})
		}
		out.Spec.Containers = append(out.Spec.Containers, netpolicy.Container{Ports: ports})
	}
	for _, ip := range p.Status.PodIPs {
		out.Status.PodIPs = append(out.Status.PodIPs, netpolicy.PodIP{IP: ip.IP})
	}
	return out
}

// namespace takes the metadata a metadata-only answer brings, or a whole
// Namespace from a server that sent it anyway.
func namespace(o runtime.Object) (*netpolicy.Namespace, error) {
	switch n := o.(type) {
	case *metav1.PartialObjectMetadata:
		return &netpolicy.Namespace{Metadata: objectMeta(&n.ObjectMeta)}, nil
	case *corev1.Namespace:
		return &netpolicy.Namespace{Metadata: objectMeta(&n.ObjectMeta)}, nil
	}
	m, err := meta.Accessor(o)
	if err != nil {
		return nil, fmt.Errorf("a namespace's metadata: %w", err)
	}
	om := netpolicy.ObjectMeta{Name: m.GetName(), UID: string(m.GetUID()), ResourceVersion: m.GetResourceVersion(), Labels: m.GetLabels()}
	om.InternLabels()
	return &netpolicy.Namespace{Metadata: om}, nil
}

func service(s *corev1.Service) *netpolicy.Service {
	out := &netpolicy.Service{Metadata: bareMeta(&s.ObjectMeta), Spec: netpolicy.ServiceSpec{
		Type: string(s.Spec.Type), ClusterIPs: s.Spec.ClusterIPs, ExternalIPs: s.Spec.ExternalIPs,
	}}
	if len(out.Spec.ClusterIPs) == 0 && s.Spec.ClusterIP != "" {
		out.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
	}
	for _, p := range s.Spec.Ports {
		out.Spec.Ports = append(out.Spec.Ports, netpolicy.ServicePort{Name: p.Name, Protocol: string(p.Protocol), Port: p.Port, NodePort: p.NodePort})
	}
	for _, in := range s.Status.LoadBalancer.Ingress {
		lb := netpolicy.LoadBalancerIngress{IP: in.IP}
		if in.IPMode != nil {
			lb.IPMode = string(*in.IPMode)
		}
		out.Status.LoadBalancer.Ingress = append(out.Status.LoadBalancer.Ingress, lb)
	}
	return out
}

// sliceMeta is an EndpointSlice's metadata with the one label the
// compiler reads: its Service's name (one Service's slices alone share
// it: not worth interning).
func sliceMeta(m *metav1.ObjectMeta) netpolicy.ObjectMeta {
	om := bareMeta(m)
	if svc, ok := m.Labels[netpolicy.ServiceNameLabel]; ok {
		om.Labels = map[string]string{netpolicy.ServiceNameLabel: svc}
	}
	return om
}

func endpointSlice(s *discoveryv1.EndpointSlice) *netpolicy.EndpointSlice {
	out := &netpolicy.EndpointSlice{Metadata: sliceMeta(&s.ObjectMeta), AddressType: string(s.AddressType)}
	for _, e := range s.Endpoints {
		out.Endpoints = append(out.Endpoints, netpolicy.Endpoint{Addresses: e.Addresses, Conditions: netpolicy.EndpointConditions{Ready: e.Conditions.Ready}})
	}
	for _, p := range s.Ports {
		ep := netpolicy.EndpointPort{Name: p.Name, Port: p.Port}
		if p.Protocol != nil {
			proto := string(*p.Protocol)
			ep.Protocol = &proto
		}
		out.Ports = append(out.Ports, ep)
	}
	return out
}

func networkPolicy(np *networkingv1.NetworkPolicy) *netpolicy.NetworkPolicy {
	out := &netpolicy.NetworkPolicy{
		Metadata: bareMeta(&np.ObjectMeta),
		Spec:     netpolicy.NetworkPolicySpec{PodSelector: selector(np.Spec.PodSelector)},
	}
	for _, t := range np.Spec.PolicyTypes {
		out.Spec.PolicyTypes = append(out.Spec.PolicyTypes, string(t))
	}
	for _, r := range np.Spec.Ingress {
		out.Spec.Ingress = append(out.Spec.Ingress, netpolicy.NetworkPolicyIngressRule{Ports: policyPorts(r.Ports), From: peers(r.From)})
	}
	for _, r := range np.Spec.Egress {
		out.Spec.Egress = append(out.Spec.Egress, netpolicy.NetworkPolicyEgressRule{Ports: policyPorts(r.Ports), To: peers(r.To)})
	}
	return out
}

func selector(s metav1.LabelSelector) netpolicy.LabelSelector {
	out := netpolicy.LabelSelector{MatchLabels: s.MatchLabels}
	for _, r := range s.MatchExpressions {
		out.MatchExpressions = append(out.MatchExpressions, netpolicy.LabelSelectorRequirement{Key: r.Key, Operator: string(r.Operator), Values: r.Values})
	}
	return out
}

func selectorPtr(s *metav1.LabelSelector) *netpolicy.LabelSelector {
	if s == nil {
		return nil
	}
	out := selector(*s)
	return &out
}

func peers(in []networkingv1.NetworkPolicyPeer) []netpolicy.NetworkPolicyPeer {
	var out []netpolicy.NetworkPolicyPeer
	for _, p := range in {
		np := netpolicy.NetworkPolicyPeer{PodSelector: selectorPtr(p.PodSelector), NamespaceSelector: selectorPtr(p.NamespaceSelector)}
		if p.IPBlock != nil {
			np.IPBlock = &netpolicy.IPBlock{CIDR: p.IPBlock.CIDR, Except: p.IPBlock.Except}
		}
		out = append(out, np)
	}
	return out
}

func policyPorts(in []networkingv1.NetworkPolicyPort) []netpolicy.NetworkPolicyPort {
	var out []netpolicy.NetworkPolicyPort
	for _, p := range in {
		np := netpolicy.NetworkPolicyPort{EndPort: p.EndPort}
		if p.Protocol != nil {
			proto := string(*p.Protocol)
			np.Protocol = &proto
		}
		if p.Port != nil {
			v := netpolicy.IntOrString{IsString: p.Port.Type == intstr.String, Int: p.Port.IntVal, Str: p.Port.StrVal}
			np.Port = &v
		}
		out = append(out, np)
	}
	return out
}
