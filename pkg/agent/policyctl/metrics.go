package policyctl

import "github.com/prometheus/client_golang/prometheus"

// Metrics count what the policy controller does.
type Metrics struct {
	pods       prometheus.Gauge
	pending    prometheus.Gauge
	pushErrors prometheus.Counter
	duration   *prometheus.HistogramVec
	// clusterPolicies and clusterUnsupported count the
	// ClusterNetworkPolicies the agent sees (when it watches them).
	clusterPolicies    *prometheus.GaugeVec
	clusterUnsupported prometheus.Gauge
}

// NewMetrics returns the controller's metrics, registered nowhere:
// Collectors gives them to a registry.
func NewMetrics() *Metrics {
	return &Metrics{
		pods: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cni_usernet_policy_pods",
			Help: "Local pods whose stack holds their current network policy, as of the agent's last pass.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cni_usernet_policy_pods_pending",
			Help: "Local pods whose current network policy could not be pushed to their stack at the agent's last pass (retried).",
		}),
		pushErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cni_usernet_policy_push_errors_total",
			Help: "Failed writes or pushes of a pod's network policy to its stack.",
		}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cni_usernet_policy_sync_duration_seconds",
			Help: "Time to compile the local pods' network policies and push those that changed, by trigger: change (a watched object changed) or add (a new pod's ADD).",
			// One pod takes well under a millisecond to compile; a
			// pass over a node's pods with pushes, milliseconds to tens.
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"trigger"}),
		clusterPolicies: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cni_usernet_policy_cluster_policies",
			Help: "ClusterNetworkPolicies the agent sees, by tier (Admin, Baseline, other: a tier it does not know, enforced as Admin); none while their CRD is not installed or --cluster-network-policy is off.",
		}, []string{"tier"}),
		clusterUnsupported: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cni_usernet_policy_cluster_policies_unsupported",
			Help: "ClusterNetworkPolicies that hold fields the agent does not implement (experimental or unknown): the rules that hold them fail closed.",
		}),
	}
}

// Collectors are the metrics, for a prometheus.Registry.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.pods, m.pending, m.pushErrors, m.duration, m.clusterPolicies, m.clusterUnsupported}
}
