// SPDX-License-Identifier: Apache-2.0

package watch

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
)

var cnpKind = fakeapi.Kind{Group: "policy.networking.k8s.io", Version: "v1beta1", Resource: "clusternetworkpolicies", Kind: "ClusterNetworkPolicy"}

// startCNPs runs a ClusterNetworkPolicy informer against f until the test
// ends; its log goes to log.
func startCNPs(t *testing.T, f *fakeapi.Server, log *logBuf, onChange func(old, new *netpolicy.ClusterNetworkPolicy)) *Informer[netpolicy.ClusterNetworkPolicy] {
	t.Helper()
	cfg := &rest.Config{Host: f.URL(), BearerToken: "tok", TLSClientConfig: rest.TLSClientConfig{CAData: f.CAPEM()}}
	inf, err := New(Options[netpolicy.ClusterNetworkPolicy]{Config: cfg, Kind: ClusterNetworkPolicies, OnChange: onChange,
		Log: slog.New(slog.NewTextHandler(log, nil)), Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); inf.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return inf
}

// TestClusterNetworkPoliciesAbsent: a cluster without the CRD (the API
// server answers 404) is a synced, empty collection, said once however
// often the informer looks again.
func TestClusterNetworkPoliciesAbsent(t *testing.T) {
	f := fakeapi.NewTest(t, fakeapi.Options{Token: "tok"}) // the default kinds: no CRD
	log := &logBuf{}
	inf := startCNPs(t, f, log, nil)
	eventually(t, "the absent collection synced", inf.HasSynced)
	_, unknown := f.Counts()
	eventually(t, "three lists", func() bool {
		_, unknown = f.Counts()
		return unknown["GET /apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies"] >= 3
	})
	if !inf.Absent() || inf.Len() != 0 || inf.Err() != nil {
		t.Errorf("absent %v, len %d, err %v: want absent, empty, no error", inf.Absent(), inf.Len(), inf.Err())
	}
	if n := strings.Count(log.String(), "does not serve this resource"); n != 1 {
		t.Errorf("the absence said %d times, want once:\n%s", n, log.String())
	}
	if strings.Contains(log.String(), "cannot list or watch") {
		t.Errorf("an absent CRD logged as an outage:\n%s", log.String())
	}
}

// TestClusterNetworkPoliciesWatched: the policies are trimmed to the
// compiler's types, their unknown fields listed; a 404 while the cache
// holds policies (an API server that has not loaded its CRDs yet) keeps
// them.
func TestClusterNetworkPoliciesWatched(t *testing.T) {
	f := fakeapi.NewTest(t, fakeapi.Options{Token: "tok", Kinds: append(slices.Clone(fakeapi.Kinds), cnpKind)})
	var obj map[string]any
	doc := `{"metadata":{"name":"no-y","resourceVersion":"1","managedFields":[{"manager":"kubectl"}]},
		"spec":{"tier":"Admin","priority":10,"subject":{"namespaces":{"matchLabels":{"ns":"x"}}},
		"ingress":[{"name":"r","action":"Deny","from":[{"namespaces":{"matchLabels":{"ns":"y"}},"services":{}}],
		  "protocols":[{"tcp":{"destinationPort":{"range":{"start":80,"end":81}}}}]}]},
		"status":{"conditions":[]}}`
	if err := json.Unmarshal([]byte(doc), &obj); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Store.Put("clusternetworkpolicies", obj); err != nil {
		t.Fatal(err)
	}
	log := &logBuf{}
	inf := startCNPs(t, f, log, nil)
	eventually(t, "the policy cached", func() bool { return inf.Len() == 1 })
	got, _ := inf.Get("no-y")
	if got.Spec.Tier != "Admin" || got.Spec.Priority != 10 || got.Spec.Subject.Namespaces == nil ||
		got.Spec.Ingress[0].Protocols[0].TCP.DestinationPort.Range.End != 81 || got.Spec.Ingress[0].Name != "r" {
		t.Errorf("decoded %+v", got.Spec)
	}
	if want := []string{"spec.ingress[0].from[0].services"}; !slices.Equal(got.Unknown, want) {
		t.Errorf("unknown fields %q, want %q", got.Unknown, want)
	}
	if inf.Absent() {
		t.Error("a served collection is absent")
	}
	f.SetFault("/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies", &fakeapi.Fault{Code: http.StatusNotFound, Reason: "NotFound", Message: "not yet"})
	eventually(t, "the 404 seen", func() bool { return inf.Err() != nil })
	if inf.Len() != 1 || inf.Absent() {
		t.Errorf("after a 404 with policies cached: len %d, absent %v; want the policy kept", inf.Len(), inf.Absent())
	}
}

// TestClusterNetworkPoliciesForbidden: an agent whose ClusterRole lacks
// the rule gets 403 whether the CRD is installed or not. Where discovery
// does not list the resource it is absent, as for a 404 (no policy can be
// missed); where it does, the 403 is an outage and the collection never
// counts as synced, so that no pod starts without the admin's denials.
func TestClusterNetworkPoliciesForbidden(t *testing.T) {
	forbidden := &fakeapi.Fault{Code: http.StatusForbidden, Reason: "Forbidden",
		Message: `clusternetworkpolicies.policy.networking.k8s.io is forbidden: User "system:serviceaccount:kube-system:cni-usernet" cannot list resource "clusternetworkpolicies"`}
	path := "/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies"

	t.Run("NotServed", func(t *testing.T) {
		f := fakeapi.NewTest(t, fakeapi.Options{Token: "tok"}) // no CRD
		f.SetFault(path, forbidden)
		log := &logBuf{}
		inf := startCNPs(t, f, log, nil)
		eventually(t, "the absent collection synced", inf.HasSynced)
		if !inf.Absent() || inf.Len() != 0 || inf.Err() != nil {
			t.Errorf("absent %v, len %d, err %v: want absent, empty, no error", inf.Absent(), inf.Len(), inf.Err())
		}
		if f.Count("get /apis/policy.networking.k8s.io/v1beta1") == 0 {
			t.Error("discovery was not asked")
		}
	})

	t.Run("Served", func(t *testing.T) {
		f := fakeapi.NewTest(t, fakeapi.Options{Token: "tok", Kinds: append(slices.Clone(fakeapi.Kinds), cnpKind)})
		f.SetFault(path, forbidden)
		log := &logBuf{}
		inf := startCNPs(t, f, log, nil)
		eventually(t, "the 403 reported", func() bool { return inf.Err() != nil })
		eventually(t, "discovery asked twice", func() bool { return f.Count("get /apis/policy.networking.k8s.io/v1beta1") >= 2 })
		if inf.HasSynced() || inf.Absent() {
			t.Errorf("synced %v, absent %v under a 403 for a served resource: want neither", inf.HasSynced(), inf.Absent())
		}
		f.SetFault(path, nil)
		eventually(t, "synced once allowed", inf.HasSynced)
		if inf.Absent() || inf.Err() != nil {
			t.Errorf("absent %v, err %v once allowed", inf.Absent(), inf.Err())
		}
	})
}

// TestClusterNetworkPolicyStatusRead: the watch keeps a policy's
// generation and the agents' own condition of its status, not the other
// implementations' ones.
func TestClusterNetworkPolicyStatusRead(t *testing.T) {
	f := fakeapi.NewTest(t, fakeapi.Options{Token: "tok", Kinds: append(slices.Clone(fakeapi.Kinds), cnpKind)})
	doc := `{"metadata":{"name":"p","generation":7},"spec":{"tier":"Admin","priority":1,"subject":{"namespaces":{}}},
		"status":{"conditions":[
		  {"type":"other.example/Accepted","status":"True","reason":"Other","message":"theirs","lastTransitionTime":"2020-01-01T00:00:00Z"},
		  {"type":"cni-usernet.io/Implemented","status":"False","reason":"NotImplemented","message":"ours","observedGeneration":6,"lastTransitionTime":"2021-02-03T04:05:06Z"}]}}`
	if _, err := f.Store.Put("clusternetworkpolicies", json.RawMessage(doc)); err != nil {
		t.Fatal(err)
	}
	inf := startCNPs(t, f, &logBuf{}, nil)
	eventually(t, "the policy cached", func() bool { return inf.Len() == 1 })
	got, _ := inf.Get("p")
	want := netpolicy.ClusterPolicyCondition{Status: "False", Reason: "NotImplemented", Message: "ours", ObservedGeneration: 6,
		LastTransitionTime: time.Date(2021, 2, 3, 4, 5, 6, 0, time.UTC)}
	if got.Generation != 7 || got.Implemented == nil || *got.Implemented != want {
		t.Errorf("generation %d, condition %+v; want 7, %+v", got.Generation, got.Implemented, want)
	}
}
