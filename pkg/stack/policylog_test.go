// SPDX-License-Identifier: Apache-2.0

package stack

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// The line tells a ClusterNetworkPolicy change from none: a push that
// only adds Admin-tier rules leaves both Isolated flags as they were.
func TestLogPolicyInForceCountsTierRules(t *testing.T) {
	var buf bytes.Buffer
	p := &policy.PodPolicy{Generation: 7,
		Ingress: policy.Direction{Admin: make([]policy.TierRule, 2), Baseline: make([]policy.TierRule, 1)},
		Egress:  policy.Direction{Isolated: true, Baseline: make([]policy.TierRule, 3)}}
	logPolicyInForce(slog.New(slog.NewJSONHandler(&buf, nil)), p)
	var l struct {
		Msg                             string
		Generation                      uint64
		IngressIsolated, EgressIsolated bool
		IngressAdmin, IngressBaseline   int
		EgressAdmin, EgressBaseline     int
	}
	if err := json.Unmarshal(buf.Bytes(), &l); err != nil {
		t.Fatalf("%v: %s", err, buf.Bytes())
	}
	want := l
	want.Msg, want.Generation, want.IngressIsolated, want.EgressIsolated = "network policy in force", 7, false, true
	want.IngressAdmin, want.IngressBaseline, want.EgressAdmin, want.EgressBaseline = 2, 1, 0, 3
	if l != want {
		t.Fatalf("logged %+v, want %+v", l, want)
	}
}
