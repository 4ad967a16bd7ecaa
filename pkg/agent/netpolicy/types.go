// Package netpolicy compiles Kubernetes NetworkPolicies into each local
// pod's policy.PodPolicy: selectors, namespaces and named ports resolved
// against the cluster's pods, Services resolved to their endpoints.
//
// Its input types are the API objects trimmed to the fields the compiler
// reads, with the API's JSON names: the agent's watches (pkg/agent/watch)
// convert each object into them and keep nothing else in memory, and
// tests write them as JSON.
package netpolicy

import "net/netip"

// ObjectMeta is the part of metadata the compiler reads.
type ObjectMeta struct {
	Name            string            `json:"name"`
	Namespace       string            `json:"namespace,omitempty"`
	UID             string            `json:"uid,omitempty"`
	ResourceVersion string            `json:"resourceVersion,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
	// DeletionTimestamp is set on an object being deleted.
	DeletionTimestamp *string `json:"deletionTimestamp,omitempty"`
	// labelSet keeps Labels' entry in the interned sets while this
	// object holds them (InternLabels); nil when they are not interned.
	labelSet *labelSet
}

// LabelSelector is metav1.LabelSelector.
type LabelSelector struct {
	MatchLabels      map[string]string          `json:"matchLabels,omitempty"`
	MatchExpressions []LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// LabelSelectorRequirement is metav1.LabelSelectorRequirement: Operator is
// In, NotIn, Exists or DoesNotExist.
type LabelSelectorRequirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

// IntOrString is intstr.IntOrString as JSON carries it: a number or a
// string (a named port).
type IntOrString struct {
	IsString bool
	Int      int32
	Str      string
}

// NetworkPolicy is networking.k8s.io/v1 NetworkPolicy.
type NetworkPolicy struct {
	Metadata ObjectMeta        `json:"metadata"`
	Spec     NetworkPolicySpec `json:"spec"`
}

// NetworkPolicySpec is networking.k8s.io/v1 NetworkPolicySpec.
type NetworkPolicySpec struct {
	PodSelector LabelSelector              `json:"podSelector"`
	Ingress     []NetworkPolicyIngressRule `json:"ingress,omitempty"`
	Egress      []NetworkPolicyEgressRule  `json:"egress,omitempty"`
	// PolicyTypes: "Ingress", "Egress". Empty: Ingress, plus Egress when
	// the policy has egress rules (the API's defaulting, which the API
	// server applies on write; kept here for objects that lack it).
	PolicyTypes []string `json:"policyTypes,omitempty"`
}

// NetworkPolicyIngressRule is networking.k8s.io/v1 NetworkPolicyIngressRule.
type NetworkPolicyIngressRule struct {
	Ports []NetworkPolicyPort `json:"ports,omitempty"`
	From  []NetworkPolicyPeer `json:"from,omitempty"`
}

// NetworkPolicyEgressRule is networking.k8s.io/v1 NetworkPolicyEgressRule.
type NetworkPolicyEgressRule struct {
	Ports []NetworkPolicyPort `json:"ports,omitempty"`
	To    []NetworkPolicyPeer `json:"to,omitempty"`
}

// NetworkPolicyPort is networking.k8s.io/v1 NetworkPolicyPort. Protocol
// nil is TCP; Port nil is every port.
type NetworkPolicyPort struct {
	Protocol *string      `json:"protocol,omitempty"`
	Port     *IntOrString `json:"port,omitempty"`
	EndPort  *int32       `json:"endPort,omitempty"`
}

// NetworkPolicyPeer is networking.k8s.io/v1 NetworkPolicyPeer: exactly one
// of IPBlock or the selectors.
type NetworkPolicyPeer struct {
	PodSelector       *LabelSelector `json:"podSelector,omitempty"`
	NamespaceSelector *LabelSelector `json:"namespaceSelector,omitempty"`
	IPBlock           *IPBlock       `json:"ipBlock,omitempty"`
}

// IPBlock is networking.k8s.io/v1 IPBlock.
type IPBlock struct {
	CIDR   string   `json:"cidr"`
	Except []string `json:"except,omitempty"`
}

// Namespace is a v1 Namespace: its name and labels.
type Namespace struct {
	Metadata ObjectMeta `json:"metadata"`
}

// Pod is a v1 Pod trimmed to what selection and named ports need.
type Pod struct {
	Metadata ObjectMeta `json:"metadata"`
	Spec     PodSpec    `json:"spec"`
	Status   PodStatus  `json:"status"`
}

// PodSpec is the part of v1 PodSpec the compiler reads.
type PodSpec struct {
	NodeName    string      `json:"nodeName,omitempty"`
	HostNetwork bool        `json:"hostNetwork,omitempty"`
	Containers  []Container `json:"containers,omitempty"`
}

// Container is a v1 Container's ports.
type Container struct {
	Ports []ContainerPort `json:"ports,omitempty"`
}

// ContainerPort is a v1 ContainerPort. Protocol empty is TCP.
type ContainerPort struct {
	Name          string `json:"name,omitempty"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol,omitempty"`
}

// PodStatus is the part of v1 PodStatus the compiler reads.
type PodStatus struct {
	Phase  string  `json:"phase,omitempty"`
	PodIPs []PodIP `json:"podIPs,omitempty"`
}

// PodIP is a v1 PodIP.
type PodIP struct {
	IP string `json:"ip"`
}

// Service is a v1 Service trimmed to the addresses kube-proxy answers
// for it (cluster IPs, external IPs, load balancer IPs, node ports) and
// its ports.
type Service struct {
	Metadata ObjectMeta    `json:"metadata"`
	Spec     ServiceSpec   `json:"spec"`
	Status   ServiceStatus `json:"status,omitempty"`
}

// ServiceSpec is the part of v1 ServiceSpec the compiler reads.
type ServiceSpec struct {
	// Type is ClusterIP (empty too), NodePort, LoadBalancer or
	// ExternalName; kube-proxy follows a load balancer's IPs only for
	// LoadBalancer.
	Type string `json:"type,omitempty"`
	// ClusterIPs holds "None" for a headless Service (no VIP to resolve).
	ClusterIPs []string `json:"clusterIPs,omitempty"`
	// ExternalIPs are addresses kube-proxy takes as the Service's too.
	ExternalIPs []string      `json:"externalIPs,omitempty"`
	Ports       []ServicePort `json:"ports,omitempty"`
}

// ServicePort is a v1 ServicePort.
type ServicePort struct {
	Name     string `json:"name,omitempty"`
	Protocol string `json:"protocol,omitempty"`
	Port     int32  `json:"port"`
	// NodePort is the port every node's addresses answer on for the
	// Service (NodePort and LoadBalancer); 0: none.
	NodePort int32 `json:"nodePort,omitempty"`
	// TargetPort is resolved through the EndpointSlice's ports, by Name.
}

// ServiceStatus is the part of v1 ServiceStatus the compiler reads.
type ServiceStatus struct {
	LoadBalancer LoadBalancerStatus `json:"loadBalancer,omitempty"`
}

// LoadBalancerStatus is v1 LoadBalancerStatus.
type LoadBalancerStatus struct {
	Ingress []LoadBalancerIngress `json:"ingress,omitempty"`
}

// LoadBalancerIngress is v1 LoadBalancerIngress: an IP (a hostname alone
// is nothing kube-proxy can answer for). IPMode "Proxy" is a load
// balancer that kube-proxy does not short-cut: traffic to its IP goes to
// it.
type LoadBalancerIngress struct {
	IP     string `json:"ip,omitempty"`
	IPMode string `json:"ipMode,omitempty"`
}

// EndpointSlice is discovery.k8s.io/v1 EndpointSlice.
type EndpointSlice struct {
	Metadata    ObjectMeta     `json:"metadata"`
	AddressType string         `json:"addressType"`
	Endpoints   []Endpoint     `json:"endpoints,omitempty"`
	Ports       []EndpointPort `json:"ports,omitempty"`
}

// ServiceNameLabel is the label that ties an EndpointSlice to its Service.
const ServiceNameLabel = "kubernetes.io/service-name"

// Endpoint is a discovery.k8s.io/v1 Endpoint.
type Endpoint struct {
	Addresses  []string           `json:"addresses"`
	Conditions EndpointConditions `json:"conditions,omitempty"`
}

// EndpointConditions is discovery.k8s.io/v1 EndpointConditions. Ready nil
// is ready.
type EndpointConditions struct {
	Ready *bool `json:"ready,omitempty"`
}

// EndpointPort is a discovery.k8s.io/v1 EndpointPort; Name matches the
// ServicePort's.
type EndpointPort struct {
	Name     *string `json:"name,omitempty"`
	Protocol *string `json:"protocol,omitempty"`
	Port     *int32  `json:"port,omitempty"`
}

// Snapshot is the cluster as the agent's watches last saw it: the
// compiler's whole input besides the pod being compiled. Keys are
// "namespace/name" (a Namespace's: its name).
type Snapshot struct {
	Policies map[string]*NetworkPolicy
	// ClusterPolicies are the ClusterNetworkPolicies, by name; nil when
	// the agent does not watch them.
	ClusterPolicies map[string]*ClusterNetworkPolicy
	Pods            map[string]*Pod
	Namespaces      map[string]*Namespace
	Services        map[string]*Service
	EndpointSlices  map[string]*EndpointSlice
}

// LocalPod is a pod on this node being compiled: its API object (for
// labels and its containers' named ports) and its addresses as its
// attachment has them (the API may not have them yet during ADD).
type LocalPod struct {
	Pod *Pod
	IPs []netip.Addr
}
