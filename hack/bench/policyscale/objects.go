package main

import "strconv"

// The Kubernetes objects the fake API server serves, as the API server
// writes them in JSON (the fields an agent may read, whichever decoder it
// uses: its own trimmed types or client-go's). The harness writes its own
// rather than importing k8s.io/api: it must not share code with the agent
// it measures, and the benchmark's module needs nothing more.

type objectMeta struct {
	Name              string            `json:"name"`
	Namespace         string            `json:"namespace,omitempty"`
	UID               string            `json:"uid"`
	ResourceVersion   string            `json:"resourceVersion,omitempty"`
	Generation        int64             `json:"generation,omitempty"`
	CreationTimestamp string            `json:"creationTimestamp"`
	Labels            map[string]string `json:"labels,omitempty"`
}

type namespace struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		Finalizers []string `json:"finalizers,omitempty"`
	} `json:"spec"`
	Status struct {
		Phase string `json:"phase"`
	} `json:"status"`
}

type containerPort struct {
	Name          string `json:"name,omitempty"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol"`
}

type container struct {
	Name  string          `json:"name"`
	Image string          `json:"image"`
	Ports []containerPort `json:"ports,omitempty"`
}

type podIP struct {
	IP string `json:"ip"`
}

type pod struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		NodeName   string      `json:"nodeName,omitempty"`
		Containers []container `json:"containers"`
	} `json:"spec"`
	Status struct {
		Phase  string  `json:"phase"`
		HostIP string  `json:"hostIP,omitempty"`
		PodIP  string  `json:"podIP,omitempty"`
		PodIPs []podIP `json:"podIPs,omitempty"`
	} `json:"status"`
}

type servicePort struct {
	Name       string `json:"name,omitempty"`
	Protocol   string `json:"protocol"`
	Port       int32  `json:"port"`
	TargetPort int32  `json:"targetPort"`
}

type service struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		Type       string            `json:"type"`
		Selector   map[string]string `json:"selector,omitempty"`
		ClusterIP  string            `json:"clusterIP"`
		ClusterIPs []string          `json:"clusterIPs"`
		IPFamilies []string          `json:"ipFamilies"`
		Ports      []servicePort     `json:"ports"`
	} `json:"spec"`
}

type objectReference struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

type endpointConditions struct {
	Ready *bool `json:"ready,omitempty"`
}

type endpoint struct {
	Addresses  []string           `json:"addresses"`
	Conditions endpointConditions `json:"conditions"`
	NodeName   string             `json:"nodeName,omitempty"`
	TargetRef  *objectReference   `json:"targetRef,omitempty"`
}

type endpointPort struct {
	Name     *string `json:"name,omitempty"`
	Protocol *string `json:"protocol,omitempty"`
	Port     *int32  `json:"port,omitempty"`
}

type endpointSlice struct {
	Metadata    objectMeta     `json:"metadata"`
	AddressType string         `json:"addressType"`
	Endpoints   []endpoint     `json:"endpoints"`
	Ports       []endpointPort `json:"ports"`
}

type labelSelector struct {
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

type intOrString struct {
	s string
	i int32
}

func (v intOrString) MarshalJSON() ([]byte, error) {
	if v.s != "" {
		return []byte(`"` + v.s + `"`), nil
	}
	return []byte(strconv.Itoa(int(v.i))), nil
}

type policyPort struct {
	Protocol string       `json:"protocol"`
	Port     *intOrString `json:"port,omitempty"`
}

type policyPeer struct {
	PodSelector       *labelSelector `json:"podSelector,omitempty"`
	NamespaceSelector *labelSelector `json:"namespaceSelector,omitempty"`
}

type ingressRule struct {
	From  []policyPeer `json:"from,omitempty"`
	Ports []policyPort `json:"ports,omitempty"`
}

type egressRule struct {
	To    []policyPeer `json:"to,omitempty"`
	Ports []policyPort `json:"ports,omitempty"`
}

type networkPolicy struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		PodSelector labelSelector `json:"podSelector"`
		Ingress     []ingressRule `json:"ingress,omitempty"`
		Egress      []egressRule  `json:"egress,omitempty"`
		PolicyTypes []string      `json:"policyTypes"`
	} `json:"spec"`
}

type nodeAddress struct {
	Type    string `json:"type"`
	Address string `json:"address"`
}

type node struct {
	Metadata objectMeta `json:"metadata"`
	Spec     struct {
		PodCIDR  string   `json:"podCIDR,omitempty"`
		PodCIDRs []string `json:"podCIDRs,omitempty"`
	} `json:"spec"`
	Status struct {
		Addresses []nodeAddress `json:"addresses"`
	} `json:"status"`
}

func (o *namespace) meta() *objectMeta     { return &o.Metadata }
func (o *pod) meta() *objectMeta           { return &o.Metadata }
func (o *service) meta() *objectMeta       { return &o.Metadata }
func (o *endpointSlice) meta() *objectMeta { return &o.Metadata }
func (o *networkPolicy) meta() *objectMeta { return &o.Metadata }
func (o *node) meta() *objectMeta          { return &o.Metadata }

// object is one API object the server stores.
type object interface{ meta() *objectMeta }

// SetResourceVersion lets the fake API server's store version an object
// before it encodes it, once.
func (m *objectMeta) SetResourceVersion(rv string) { m.ResourceVersion = rv }

func (o *namespace) SetResourceVersion(rv string)     { o.Metadata.SetResourceVersion(rv) }
func (o *pod) SetResourceVersion(rv string)           { o.Metadata.SetResourceVersion(rv) }
func (o *service) SetResourceVersion(rv string)       { o.Metadata.SetResourceVersion(rv) }
func (o *endpointSlice) SetResourceVersion(rv string) { o.Metadata.SetResourceVersion(rv) }
func (o *networkPolicy) SetResourceVersion(rv string) { o.Metadata.SetResourceVersion(rv) }
func (o *node) SetResourceVersion(rv string)          { o.Metadata.SetResourceVersion(rv) }

// nodeNameOf is the spec.nodeName field selectors on pods compare.
func nodeNameOf(o object) string {
	if p, ok := o.(*pod); ok {
		return p.Spec.NodeName
	}
	return ""
}

func ptr[T any](v T) *T { return &v }
