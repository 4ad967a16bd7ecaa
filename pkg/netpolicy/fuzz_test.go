package netpolicy

import (
	"encoding/json"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/policy"
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
