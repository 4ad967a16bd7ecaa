// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"

	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
)

// cnpKind is policy.networking.k8s.io ClusterNetworkPolicy, served when
// the cluster has some (--cluster-policies).
var cnpKind = fakeapi.Kind{Group: "policy.networking.k8s.io", Version: "v1beta1", Resource: "clusternetworkpolicies", Kind: "ClusterNetworkPolicy"}

// clusterNetworkPolicy is v1beta1 ClusterNetworkPolicy, the fields the
// benchmark writes.
type clusterNetworkPolicy struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		Tier     string     `json:"tier"`
		Priority int32      `json:"priority"`
		Subject  cnpSubject `json:"subject"`
		Ingress  []cnpRule  `json:"ingress,omitempty"`
		Egress   []cnpRule  `json:"egress,omitempty"`
	} `json:"spec"`
}

type cnpSubject struct {
	Namespaces *labelSelector `json:"namespaces,omitempty"`
}

type cnpPeer struct {
	Namespaces *labelSelector `json:"namespaces,omitempty"`
	Pods       *struct {
		NamespaceSelector labelSelector `json:"namespaceSelector"`
		PodSelector       labelSelector `json:"podSelector"`
	} `json:"pods,omitempty"`
}

type cnpPort struct {
	DestinationPort *struct {
		Number int32 `json:"number,omitempty"`
	} `json:"destinationPort,omitempty"`
}

type cnpProtocol struct {
	TCP *cnpPort `json:"tcp,omitempty"`
}

// cnpRule is an ingress rule (From) or an egress one (To).
type cnpRule struct {
	Name      string        `json:"name,omitempty"`
	Action    string        `json:"action"`
	From      []cnpPeer     `json:"from,omitempty"`
	To        []cnpPeer     `json:"to,omitempty"`
	Protocols []cnpProtocol `json:"protocols,omitempty"`
}

func (o *clusterNetworkPolicy) meta() *objectMeta            { return &o.Metadata }
func (o *clusterNetworkPolicy) SetResourceVersion(rv string) { o.Metadata.SetResourceVersion(rv) }

// clusterPolicy is the q-th ClusterNetworkPolicy: Admin and Baseline in
// turn, each selecting one team's namespaces (a tenth of the cluster) and
// denying ingress from another team's frontend pods on TCP port, an
// Admin one passing its egress to kube-system's DNS to the next layer
// first: what an operator's guardrails look like. Every local pod is in
// the subject of some; none of them changes what the NetworkPolicies'
// probes reach (port is no port the apps serve).
func (c *cluster) clusterPolicy(q int, port int32) *clusterNetworkPolicy {
	p := &clusterNetworkPolicy{APIVersion: "policy.networking.k8s.io/v1beta1", Kind: "ClusterNetworkPolicy",
		Metadata: c.meta("", fmt.Sprintf("guard-%04d", q), nil)}
	p.Metadata.Generation = 1
	p.Spec.Tier, p.Spec.Priority = "Admin", int32(q%1000)
	if q%2 == 1 {
		p.Spec.Tier = "Baseline"
	}
	p.Spec.Subject.Namespaces = &labelSelector{map[string]string{"team": team(q)}}
	from := cnpPeer{Pods: &struct {
		NamespaceSelector labelSelector `json:"namespaceSelector"`
		PodSelector       labelSelector `json:"podSelector"`
	}{labelSelector{map[string]string{"team": team(q + 5)}}, labelSelector{map[string]string{"tier": "frontend"}}}}
	tcp := cnpProtocol{TCP: &cnpPort{DestinationPort: &struct {
		Number int32 `json:"number,omitempty"`
	}{port}}}
	p.Spec.Ingress = []cnpRule{{Name: "no-admin-port", Action: "Deny", From: []cnpPeer{from}, Protocols: []cnpProtocol{tcp}}}
	if p.Spec.Tier == "Admin" {
		p.Spec.Egress = []cnpRule{{Name: "dns-to-tenants", Action: "Pass",
			To: []cnpPeer{{Namespaces: &labelSelector{map[string]string{"kubernetes.io/metadata.name": "kube-system"}}}}}}
	}
	return p
}
