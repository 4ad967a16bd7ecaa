// SPDX-License-Identifier: Apache-2.0

package stack

import (
	"log/slog"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// logPolicyInForce is the stack's word that p now decides its
// connections, at its start and at each push. Tools that time a policy
// change (the lab's propagation check) read this line, so it carries
// what tells one change from another: whether NetworkPolicy isolates
// each direction, and how many ClusterNetworkPolicy rules each tier
// holds in it.
func logPolicyInForce(log *slog.Logger, p *policy.PodPolicy) {
	log.Info("network policy in force", "generation", p.Generation,
		"ingressIsolated", p.Ingress.Isolated, "egressIsolated", p.Egress.Isolated,
		"ingressAdmin", len(p.Ingress.Admin), "ingressBaseline", len(p.Ingress.Baseline),
		"egressAdmin", len(p.Egress.Admin), "egressBaseline", len(p.Egress.Baseline))
}
