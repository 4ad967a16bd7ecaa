package netpolicy

import (
	"encoding/json"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// FuzzCompile decodes a NetworkPolicy from arbitrary JSON, adds it to the
// x/y/z cluster (with its Services) and compiles every pod: no panic, and
// every result valid, deterministic and readable by the stack.
func FuzzCompile(f *testing.F) {
	for _, seed := range []string{
		`{"metadata":{"name":"deny","namespace":"x"},"spec":{"podSelector":{}}}`,
		`{"metadata":{"name":"deny-all","namespace":"x"},"spec":{"podSelector":{},"policyTypes":["Ingress","Egress"]}}`,
		`{"metadata":{"name":"p","namespace":"x"},"spec":{"podSelector":{"matchLabels":{"pod":"a"}},"ingress":[{"from":[{"namespaceSelector":{"matchExpressions":[{"key":"ns","operator":"NotIn","values":["x"]}]},"podSelector":{"matchLabels":{"pod":"b"}}}],"ports":[{"port":"serve-80-tcp"},{"protocol":"UDP","port":53,"endPort":60}]}]}}`,
		`{"metadata":{"name":"e","namespace":"y"},"spec":{"podSelector":{},"egress":[{"to":[{"ipBlock":{"cidr":"10.0.0.0/8","except":["10.1.0.0/16","fd00::/8"]}},{"ipBlock":{"cidr":"fd00::/16"}}],"ports":[{"port":"serve-81-tcp"},{"port":443}]}]}}`,
		`{"metadata":{"name":"bad","namespace":"z"},"spec":{"podSelector":{"matchExpressions":[{"key":"pod","operator":"Bogus"}]},"ingress":[{"from":[{"ipBlock":{"cidr":"300.0.0.0/8"}}],"ports":[{"protocol":"ICMP"}]}],"policyTypes":["Sideways"]}}`,
		`{"metadata":{"name":"named","namespace":"x"},"spec":{"podSelector":{},"policyTypes":["Egress"],"egress":[{"ports":[{"port":"serve-80-tcp"},{"port":"serve-80-udp","protocol":"UDP"}]}]}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var np NetworkPolicy
		if err := json.Unmarshal(data, &np); err != nil {
			return
		}
		if np.Metadata.Namespace == "" {
			np.Metadata.Namespace = "x"
		}
		s := xyz()
		withServices(s)
		addPolicies(s, &np)
		ps, _ := compileAll(t, s)
		for key, p := range ps {
			b, err := policy.Marshal(p)
			if err != nil {
				t.Fatalf("%s: marshal: %v", key, err)
			}
			back, err := policy.Unmarshal(b)
			if err != nil {
				t.Fatalf("%s: the stack refuses the compiled policy: %v", key, err)
			}
			if !policy.Equal(p, back) {
				t.Fatalf("%s: policy changes through JSON", key)
			}
		}
	})
}

// FuzzCompilePod decodes a Pod from arbitrary JSON (labels, container
// ports, addresses, phase) into a cluster whose policies resolve named
// ports on it both ways, compiles it and every other pod: no panic, and
// every result valid and deterministic.
func FuzzCompilePod(f *testing.F) {
	for _, seed := range []string{
		`{"metadata":{"name":"d","namespace":"y","labels":{"pod":"a"}},"spec":{"containers":[{"ports":[{"name":"serve-80-tcp","containerPort":8080}]}]},"status":{"phase":"Running","podIPs":[{"ip":"10.2.0.9"},{"ip":"fd00:2::9"}]}}`,
		`{"metadata":{"name":"e","namespace":"x","labels":{"pod":"b"}},"spec":{"hostNetwork":true,"containers":[{"ports":[{"name":"serve-81-tcp","containerPort":-1,"protocol":"SCTP"}]}]},"status":{"podIPs":[{"ip":"::ffff:10.1.0.9"},{"ip":"fe80::1%eth0"}]}}`,
		`{"metadata":{"name":"f","namespace":"z","deletionTimestamp":"2026-12-02T06:00:00Z"},"spec":{"containers":[{"ports":[{"name":"serve-80-tcp","containerPort":70000}]}]},"status":{"podIPs":[{"ip":"10.3.0.9"}]}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var pod Pod
		if err := json.Unmarshal(data, &pod); err != nil {
			return
		}
		s := xyz()
		withServices(s)
		addPolicies(s,
			netpol("x", "egress-named", NetworkPolicySpec{PolicyTypes: []string{"Egress"}, Egress: []NetworkPolicyEgressRule{
				{Ports: []NetworkPolicyPort{namePort("", "serve-80-tcp"), namePort("SCTP", "serve-81-tcp")}},
				{To: []NetworkPolicyPeer{block("10.0.0.0/8", "10.1.0.0/16"), block("::/0")}, Ports: []NetworkPolicyPort{namePort("", "serve-81-tcp")}},
			}}),
			netpol(pod.Metadata.Namespace, "ingress-named", NetworkPolicySpec{Ingress: []NetworkPolicyIngressRule{
				{From: []NetworkPolicyPeer{{NamespaceSelector: labels(), PodSelector: labels("pod", "a")}}, Ports: []NetworkPolicyPort{namePort("", "serve-80-tcp"), namePort("SCTP", "serve-81-tcp")}},
			}}),
		)
		s.Pods[pod.Metadata.Namespace+"/"+pod.Metadata.Name] = &pod
		compileAll(t, s)
	})
}
