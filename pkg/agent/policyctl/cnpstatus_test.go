// SPDX-License-Identifier: Apache-2.0

package policyctl

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
)

// otherCondition is another implementation's condition on the same
// objects, which the agent must leave as it is.
var otherCondition = map[string]any{"type": "other.example/Accepted", "status": "True", "reason": "Accepted",
	"message": "another implementation's", "lastTransitionTime": "2020-01-01T00:00:00Z"}

// cnpDoc is p as the API server stores it: with a generation and the
// conditions given.
func cnpDoc(t *testing.T, p *netpolicy.ClusterNetworkPolicy, generation int64, conditions ...any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	json.Unmarshal(b, &doc)
	doc["metadata"].(map[string]any)["generation"] = generation
	if conditions == nil {
		conditions = []any{}
	}
	doc["status"] = map[string]any{"conditions": conditions}
	b, _ = json.Marshal(doc)
	return b
}

// storedCNP is the stored object's generation and conditions.
type storedCNP struct {
	Metadata struct {
		Generation      int64
		ResourceVersion string
	}
	Status struct{ Conditions []metav1.Condition }
}

func (s storedCNP) ours() *metav1.Condition {
	for i, c := range s.Status.Conditions {
		if c.Type == netpolicy.ImplementedCondition {
			return &s.Status.Conditions[i]
		}
	}
	return nil
}

func getCNP(t *testing.T, e *policyEnv, name string) storedCNP {
	t.Helper()
	var s storedCNP
	if err := json.Unmarshal(e.api.Store.Get("clusternetworkpolicies", "", name), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// respec replaces the spec of the stored policy p names, with generation
// (as the API server bumps it), keeping its status.
func respec(t *testing.T, e *policyEnv, p *netpolicy.ClusterNetworkPolicy, generation int64) {
	t.Helper()
	var conds []any
	for _, c := range getCNP(t, e, p.Metadata.Name).Status.Conditions {
		conds = append(conds, c)
	}
	e.api.put(pathCNPs, cnpDoc(t, p, generation, conds...))
}

// statusPatches are the PATCH requests sent to the status of name.
func statusPatches(e *policyEnv, name string) []fakeapi.Request {
	var out []fakeapi.Request
	for _, r := range e.api.Requests() {
		if r.Method == http.MethodPatch && r.Path == pathCNPs+"/"+name+"/status" {
			out = append(out, r)
		}
	}
	return out
}

func nodesPeer(name string) *netpolicy.ClusterNetworkPolicy {
	p := adminDenyFrom(name, "x", "y")
	p.Spec.Ingress = nil
	p.Spec.Egress = []netpolicy.ClusterNetworkPolicyEgressRule{{Action: "Pass", To: []netpolicy.ClusterNetworkPolicyPeer{{Nodes: &netpolicy.LabelSelector{}}}}}
	return p
}

// statusEnv is a controller watching ClusterNetworkPolicies whose status
// writes wait at most 50 ms, with one local pod x/a.
func statusEnv(t *testing.T) (*policyEnv, *fakeStack) {
	e := newPolicyEnv(t)
	withCRD(t, e)
	e.statusDelay = 50 * time.Millisecond
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathPods, podObj("x", "a", "10.244.1.10", nil))
	sock, _ := localPod(t, e.store, e.dir, "x", "a", "10.244.1.10")
	return e, newFakeStack(t, sock, policy.Closed(testNode))
}

func waitCondition(t *testing.T, e *policyEnv, name, status string, generation int64) storedCNP {
	t.Helper()
	var s storedCNP
	waitFor(t, name+"'s condition "+status, 5*time.Second, func() bool {
		s = getCNP(t, e, name)
		c := s.ours()
		return c != nil && string(c.Status) == status && c.ObservedGeneration == generation
	})
	return s
}

// A policy the agent implements in full gets the True condition; one
// with a part it does not gets False, naming the part and saying how it
// fails; another implementation's condition stays.
func TestClusterPolicyStatusCondition(t *testing.T) {
	e, _ := statusEnv(t)
	e.api.put(pathCNPs, cnpDoc(t, adminDenyFrom("ok", "x", "y"), 1, otherCondition))
	e.api.put(pathCNPs, cnpDoc(t, nodesPeer("fqdn"), 4, otherCondition))
	e.start(t)

	ok := waitCondition(t, e, "ok", "True", 1)
	if c := ok.ours(); c.Reason != "Implemented" || c.LastTransitionTime.IsZero() {
		t.Errorf("the supported policy's condition: %+v; want reason Implemented and a transition time", c)
	}
	bad := waitCondition(t, e, "fqdn", "False", 4)
	c := bad.ours()
	if c.Reason != "NotImplemented" || !strings.Contains(c.Message, "spec.egress[0] peer 0: nodes") ||
		!strings.Contains(c.Message, "fail closed (an Accept there matches nothing, a Deny or Pass denies everything)") {
		t.Errorf("the unsupported policy's condition: reason %q, message %q; want NotImplemented naming the part and how it fails", c.Reason, c.Message)
	}
	for _, s := range []storedCNP{ok, bad} {
		if len(s.Status.Conditions) != 2 || s.Status.Conditions[0].Type != "other.example/Accepted" || s.Status.Conditions[0].Message != "another implementation's" {
			t.Errorf("the other implementation's condition is not kept: %+v", s.Status.Conditions)
		}
	}
}

// The write is a server-side apply of the agent's condition alone, under
// its field manager, forced (every node's agent writes the same).
func TestClusterPolicyStatusApply(t *testing.T) {
	e, _ := statusEnv(t)
	e.api.put(pathCNPs, cnpDoc(t, nodesPeer("fqdn"), 1, otherCondition))
	e.start(t)
	waitCondition(t, e, "fqdn", "False", 1)
	ps := statusPatches(e, "fqdn")
	if len(ps) != 1 {
		t.Fatalf("%d patches, want 1", len(ps))
	}
	p := ps[0]
	if ct := p.Header.Get("Content-Type"); ct != "application/apply-patch+yaml" {
		t.Errorf("Content-Type %q, want application/apply-patch+yaml", ct)
	}
	if p.Query.Get("fieldManager") != "cni-usernet" || p.Query.Get("force") != "true" {
		t.Errorf("query %v, want fieldManager=cni-usernet and force=true", p.Query)
	}
	var body struct {
		APIVersion, Kind string
		Metadata         map[string]any
		Spec             any
		Status           struct{ Conditions []metav1.Condition }
	}
	if err := json.Unmarshal(p.Body, &body); err != nil {
		t.Fatalf("the patch %q: %v", p.Body, err)
	}
	if body.APIVersion != "policy.networking.k8s.io/v1beta1" || body.Kind != "ClusterNetworkPolicy" ||
		len(body.Metadata) != 1 || body.Metadata["name"] != "fqdn" || body.Spec != nil {
		t.Errorf("the patch %s: want apiVersion, kind, metadata.name and status alone", p.Body)
	}
	if cs := body.Status.Conditions; len(cs) != 1 || cs[0].Type != netpolicy.ImplementedCondition {
		t.Errorf("the patch's conditions %+v, want %s alone", cs, netpolicy.ImplementedCondition)
	}
}

// The write comes back through the watch: it starts no policy round and
// no further write; nor does another manager's status update.
func TestClusterPolicyStatusNoLoop(t *testing.T) {
	e, st := statusEnv(t)
	counts := &counter{n: map[string]int{}}
	e.compiled = counts.add
	e.api.put(pathCNPs, cnpDoc(t, adminDenyFrom("no-y", "x", "y"), 1))
	c, _ := e.start(t)
	waitFor(t, "the pod's policy", 5*time.Second, func() bool { p := st.current(); return p != nil && p.Generation != 0 })
	waitCondition(t, e, "no-y", "True", 1)
	// cached is whether the watch brought the stored object back.
	cached := func() bool {
		p, ok := c.cache.cnps.Get("no-y")
		return ok && p.Metadata.ResourceVersion == getCNP(t, e, "no-y").Metadata.ResourceVersion
	}
	waitFor(t, "the written status in the cache", 5*time.Second, cached)
	counts.take()
	time.Sleep(500 * time.Millisecond) // ten times the longest wait of a write
	if n := len(statusPatches(e, "no-y")); n != 1 {
		t.Errorf("%d patches after the write came back, want 1", n)
	}
	if got := counts.take(); len(got) != 0 {
		t.Errorf("the status write started a round: compiled %v", got)
	}
	// Another implementation reports on the same object.
	if _, err := e.api.Store.PatchStatus("clusternetworkpolicies", "", "no-y", map[string]json.RawMessage{
		"conditions": json.RawMessage(`[{"type":"other.example/Accepted","status":"False","reason":"X","message":"y","lastTransitionTime":"2021-01-01T00:00:00Z"}]`)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the other manager's status in the cache", 5*time.Second, cached)
	time.Sleep(500 * time.Millisecond)
	if got := counts.take(); len(got) != 0 {
		t.Errorf("another manager's status update started a round: compiled %v", got)
	}
	if n := len(statusPatches(e, "no-y")); n != 1 {
		t.Errorf("%d patches after another manager's update, want 1", n)
	}
}

// An agent whose ClusterRole lacks patch on the status says so once and
// writes no more until it restarts, whatever changes.
func TestClusterPolicyStatusForbidden(t *testing.T) {
	e, _ := statusEnv(t)
	for _, name := range []string{"a", "b"} {
		e.api.put(pathCNPs, cnpDoc(t, adminDenyFrom(name, "x", "y"), 1))
		e.api.SetFault(pathCNPs+"/"+name+"/status", &fakeapi.Fault{Code: http.StatusForbidden, Reason: "Forbidden",
			Message: `clusternetworkpolicies.policy.networking.k8s.io "` + name + `" is forbidden: cannot patch resource "clusternetworkpolicies/status"`})
	}
	e.start(t)
	waitFor(t, "a refused patch", 5*time.Second, func() bool { return e.api.Refused() > 0 })
	time.Sleep(300 * time.Millisecond)
	// A spec change would be a reason to write again.
	p := adminDenyFrom("a", "x", "y")
	p.Spec.Priority = 7
	respec(t, e, p, 2)
	time.Sleep(500 * time.Millisecond)
	if n := len(statusPatches(e, "a")) + len(statusPatches(e, "b")); n != 1 {
		t.Errorf("%d patches under 403, want 1", n)
	}
	if n := strings.Count(e.logs.String(), "may not write the status of ClusterNetworkPolicies"); n != 1 {
		t.Errorf("the 403 logged %d times, want once:\n%s", n, e.logs.String())
	}
}

// The condition follows the spec: each generation observed, the
// transition time kept while the status stays and new when it changes.
func TestClusterPolicyStatusFollowsSpec(t *testing.T) {
	e, _ := statusEnv(t)
	p := adminDenyFrom("p", "x", "y")
	e.api.put(pathCNPs, cnpDoc(t, p, 1))
	e.start(t)
	waitCondition(t, e, "p", "True", 1)
	// An old transition time, to tell kept from new.
	old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	ours := getCNP(t, e, "p").ours()
	ours.LastTransitionTime = metav1.NewTime(old)
	b, _ := json.Marshal([]metav1.Condition{*ours})
	if _, err := e.api.Store.PatchStatus("clusternetworkpolicies", "", "p", map[string]json.RawMessage{"conditions": b}); err != nil {
		t.Fatal(err)
	}

	p.Spec.Priority = 9
	respec(t, e, p, 2)
	if c := waitCondition(t, e, "p", "True", 2).ours(); !c.LastTransitionTime.Time.Equal(old) {
		t.Errorf("the status stayed True, its transition time moved: %v, want %v", c.LastTransitionTime, old)
	}

	p.Spec.Ingress[0].From = []netpolicy.ClusterNetworkPolicyPeer{{DomainNames: []string{"example.com"}}}
	respec(t, e, p, 3)
	c := waitCondition(t, e, "p", "False", 3).ours()
	if !strings.Contains(c.Message, "spec.ingress[0] peer 0: domainNames") {
		t.Errorf("message %q does not name the part", c.Message)
	}
	if time.Since(c.LastTransitionTime.Time) > time.Minute {
		t.Errorf("the status turned False, its transition time is %v, want now", c.LastTransitionTime)
	}
}
