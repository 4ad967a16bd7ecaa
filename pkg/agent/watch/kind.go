package watch

// Kind is a collection of API objects, as a list or a watch names it.
type Kind struct {
	// Group is the API group, "" for the core group.
	Group, Version string
	// Resource is the plural resource name, as RBAC rules write it.
	Resource string
}

// The collections the node agent watches for NetworkPolicy.
var (
	NetworkPolicies = Kind{"networking.k8s.io", "v1", "networkpolicies"}
	Pods            = Kind{"", "v1", "pods"}
	Namespaces      = Kind{"", "v1", "namespaces"}
	Services        = Kind{"", "v1", "services"}
	EndpointSlices  = Kind{"discovery.k8s.io", "v1", "endpointslices"}
)

func (k Kind) String() string {
	if k.Group == "" {
		return k.Resource
	}
	return k.Resource + "." + k.Group
}
