package policyctl

import (
	"slices"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// samePolicy reports whether a and b enforce the same thing (Generation
// aside), field by field: a round compares every compiled pod's policy
// with what its stack holds, and policy.Equal encodes both to JSON for
// it, two encodings of a policy that can be large per pod and round.
// Compiled policies are sorted throughout, so the same rules are in the
// same order.
func samePolicy(a, b *policy.PodPolicy) bool {
	return a.Version == b.Version && sameDirection(&a.Ingress, &b.Ingress) && sameDirection(&a.Egress, &b.Egress) &&
		slices.Equal(a.Node, b.Node) && slices.EqualFunc(a.Services, b.Services, sameService)
}

func sameDirection(a, b *policy.Direction) bool {
	return a.Isolated == b.Isolated && slices.Equal(a.Policies, b.Policies) && slices.EqualFunc(a.Rules, b.Rules, sameRule)
}

func sameRule(a, b policy.Rule) bool {
	return a.Policy == b.Policy && slices.Equal(a.Ports, b.Ports) && slices.EqualFunc(a.Peers, b.Peers, samePeer)
}

func samePeer(a, b policy.Peer) bool {
	return a.CIDR == b.CIDR && slices.Equal(a.Except, b.Except)
}

func sameService(a, b policy.Service) bool {
	return a.Name == b.Name && a.Protocol == b.Protocol && a.VIP == b.VIP && slices.Equal(a.Backends, b.Backends)
}
