// SPDX-License-Identifier: Apache-2.0

package netpolicy

import (
	"strings"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// namedPort is a rule's protocols of one destinationNamedPort.
func namedPortProto(name string) []ClusterNetworkPolicyProtocol {
	return []ClusterNetworkPolicyProtocol{{DestinationNamedPort: name}}
}

// In the xyz cluster every pod names its TCP 80 "serve-80-tcp" and its
// UDP 80 "serve-80-udp", but z/c, whose "serve-80-tcp" is TCP 8080 and
// "serve-80-udp" UDP 8080.

// TestClusterPolicyIngressNamedPort: an ingress rule's named port is the
// subject pod's own port of that name, with the protocol the pod gives
// it: the rule denies TCP 80 into most pods and TCP 8080 into z/c.
func TestClusterPolicyIngressNamedPort(t *testing.T) {
	s := xyz()
	r := fromNS("Deny", "y")
	r.Protocols = namedPortProto("serve-80-tcp")
	addCNPs(s, cnp("no-y-web", tierAdmin, 1, ClusterNetworkPolicySubject{Namespaces: &LabelSelector{}}, []ClusterNetworkPolicyIngressRule{r}, nil))
	ps, warnings := compileAll(t, s)
	if len(warnings) > 0 {
		t.Errorf("warnings: %v", warnings)
	}
	checkStack(t, ps, 80, newTruth(true).set("y/", "", false).set("y/", "z/c", true))
	checkStack(t, ps, 8080, newTruth(true).set("y/", "z/c", false))
	checkStack(t, ps, 81, newTruth(true))
	checkStackOn(t, ps, policy.ProtoUDP, 80, newTruth(true))
}

// TestClusterPolicyEgressNamedPort: an egress rule's named port is each
// destination pod's, and its protocol theirs: UDP here, so TCP stays
// open, and z/c is denied on 8080 where the others are denied on 80.
func TestClusterPolicyEgressNamedPort(t *testing.T) {
	s := xyz()
	addCNPs(s, cnp("no-dns-from-x", tierAdmin, 1, nsSubject("x"), nil, []ClusterNetworkPolicyEgressRule{{Action: "Deny",
		To: []ClusterNetworkPolicyPeer{{Namespaces: &LabelSelector{}}}, Protocols: namedPortProto("serve-80-udp")}}))
	ps, _ := compileAll(t, s)
	checkStackOn(t, ps, policy.ProtoUDP, 80, newTruth(true).set("x/", "", false).set("x/", "z/c", true))
	checkStackOn(t, ps, policy.ProtoUDP, 8080, newTruth(true).set("x/", "z/c", false))
	checkStack(t, ps, 80, newTruth(true))
}

// TestClusterPolicyNamedPortMixed: numbered and named ports in one rule
// match on both; a rule whose only port is a name no destination pod
// declares matches nothing, so an Accept of it opens nothing that
// NetworkPolicy closed (it is not "every port"), and a Deny of it denies
// nothing.
func TestClusterPolicyNamedPortMixed(t *testing.T) {
	s := xyz()
	addPolicies(s, netpol("x", "deny-ingress", NetworkPolicySpec{PodSelector: LabelSelector{}, PolicyTypes: []string{"Ingress"}}))
	accept := fromNS("Accept", "y")
	accept.Protocols = namedPortProto("no-such-port")
	deny := fromNS("Deny", "z")
	deny.Protocols = namedPortProto("no-such-port")
	mixed := ClusterNetworkPolicyEgressRule{Action: "Deny", To: []ClusterNetworkPolicyPeer{{Namespaces: labels("ns", "z")}},
		Protocols: append(namedPortProto("serve-80-tcp"), ClusterNetworkPolicyProtocol{TCP: &ClusterNetworkPolicyPorts{DestinationPort: &ClusterNetworkPolicyPort{Number: 81}}})}
	addCNPs(s,
		cnp("accept-nothing", tierAdmin, 1, nsSubject("x"), []ClusterNetworkPolicyIngressRule{accept}, nil),
		cnp("deny-nothing", tierAdmin, 2, nsSubject("y"), []ClusterNetworkPolicyIngressRule{deny}, nil),
		cnp("y-not-to-z-web", tierAdmin, 3, nsSubject("y"), nil, []ClusterNetworkPolicyEgressRule{mixed}),
	)
	ps, _ := compileAll(t, s)
	intoX := newTruth(true).set("", "x/", false)
	checkStack(t, ps, 80, intoX.set("y/", "z/", false).set("y/", "z/c", true))
	checkStack(t, ps, 81, newTruth(true).set("", "x/", false).set("y/", "z/", false))
	checkStack(t, ps, 8080, newTruth(true).set("", "x/", false).set("y/", "z/c", false))
	if got := ps["x/a"].Ingress.Admin; len(got) != 0 {
		t.Errorf("x/a holds Admin rules for a port it does not name: %+v", got)
	}
}

// TestClusterPolicyNamedPortSupported: destinationNamedPort is not among
// the parts reported as not implemented.
func TestClusterPolicyNamedPortSupported(t *testing.T) {
	r := fromNS("Accept", "y")
	r.Protocols = namedPortProto("web")
	p := cnp("named", tierAdmin, 1, nsSubject("x"), []ClusterNetworkPolicyIngressRule{r}, nil)
	if u := p.Unsupported(); len(u) > 0 {
		t.Errorf("unsupported: %s", strings.Join(u, "; "))
	}
}
