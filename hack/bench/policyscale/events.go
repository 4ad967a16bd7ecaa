package main

import (
	"fmt"
	"net/netip"
)

// The events the benchmark injects, each into the namespace of the first
// local pod (pod L below), which the fake API server then sends down the
// agent's watches.
const (
	// A remote pod of L's namespace flips its tier between frontend and
	// backend: it leaves (or joins) the frontend peers of the ingress
	// rule that selects L. One local pod's policy changes.
	evLabel = "pod-label-change"
	// A new frontend pod in L's namespace, on another node: it joins the
	// same peers. One local pod's policy changes.
	evPodAdded = "pod-added"
	// An endpoint of a Service in L's namespace that no local pod's
	// egress rules allow (neither the db nor DNS) turns unready, or ready
	// again. No local pod's rules reach it.
	evEndpoint = "unrelated-endpoint-change"
	// A new policy in L's namespace selecting L's app, letting in the
	// backend tier on a new port. One local pod's policy changes.
	evPolicy = "policy-added"
	// A new ClusterNetworkPolicy (--cluster-policies) whose subject is
	// L's team's namespaces, denying another team's frontend pods a new
	// port: every local pod is compiled again, those of L's team get a
	// push.
	evClusterPolicy = "cluster-policy-added"
)

// eventKinds are the events in the order they run and are reported;
// evClusterPolicy only in a cluster with ClusterNetworkPolicies.
var eventKinds = []string{evLabel, evPodAdded, evEndpoint, evPolicy, evClusterPolicy}

// change is one object to Put in the API server's store.
type change struct {
	resource string // as the API paths name it: "pods"
	typ      string // ADDED or MODIFIED
	obj      object
}

// event makes the change of one event of kind; each call makes the next
// one (a label flipped back, another pod, another policy).
func (c *cluster) event(kind string) (change, error) {
	s := c.spec
	l := c.local[0]
	ns := l / s.podsPerNS()
	nsApp := ns * s.appsPerNS()
	switch kind {
	case evLabel:
		p := c.Pods[l+1]
		if p.Metadata.Labels["tier"] == "frontend" {
			p.Metadata.Labels["tier"] = "backend"
		} else {
			p.Metadata.Labels["tier"] = "frontend"
		}
		return change{"pods", "MODIFIED", p}, nil
	case evPodAdded:
		c.added++
		p := c.newPod(nsName(ns), fmt.Sprintf("added-%05d", c.added), appName(nsApp+3), true,
			addrAdd(addedBase, c.added), fmt.Sprintf(remoteNode, c.added%50))
		c.Pods = append(c.Pods, p)
		return change{"pods", "ADDED", p}, nil
	case evEndpoint:
		es := c.Slices[nsApp+5]
		r := es.Endpoints[0].Conditions.Ready
		es.Endpoints[0].Conditions.Ready = ptr(r != nil && !*r)
		return change{"endpointslices", "MODIFIED", es}, nil
	case evPolicy:
		c.added++
		p := &networkPolicy{Metadata: c.meta(nsName(ns), fmt.Sprintf("added-%05d", c.added), nil)}
		p.Metadata.Generation = 1
		p.Spec.PodSelector = labelSelector{map[string]string{"app": c.Pods[l].Metadata.Labels["app"]}}
		p.Spec.PolicyTypes = []string{"Ingress"}
		p.Spec.Ingress = []ingressRule{{
			From:  []policyPeer{{PodSelector: &labelSelector{map[string]string{"tier": "backend"}}}},
			Ports: []policyPort{{"TCP", &intOrString{i: int32(9000 + c.added%1000)}}},
		}}
		c.Pols = append(c.Pols, p)
		return change{"networkpolicies", "ADDED", p}, nil
	case evClusterPolicy:
		c.added++
		p := c.clusterPolicy(s.ClusterPolicies+c.added, int32(9000+c.added%1000))
		// Its subject: L's namespace's team.
		p.Spec.Subject.Namespaces.MatchLabels["team"] = team(ns)
		p.Metadata.Name = fmt.Sprintf("added-%05d", c.added)
		c.CNPs = append(c.CNPs, p)
		return change{"clusternetworkpolicies", "ADDED", p}, nil
	}
	return change{}, fmt.Errorf("unknown event %q", kind)
}

// reachedBy says whether a local pod's egress rules allow an address: the
// db of its namespace or DNS. The unit tests check the unrelated endpoint
// change against it.
func (c *cluster) reachedBy(local int, addr netip.Addr) bool {
	s := c.spec
	ns := c.local[local] / s.podsPerNS()
	for k := range s.podsPerApp() {
		if c.Pods[ns*s.podsPerNS()+k].Status.PodIP == addr.String() {
			return true
		}
	}
	for _, p := range c.Pods[s.Pods:] {
		if p.Metadata.Namespace == "kube-system" && p.Status.PodIP == addr.String() {
			return true
		}
	}
	return false
}
