package policyctl

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// A pod's stack follows the API: open, default deny, allow from a label,
// the allowed pod relabelled, the policy deleted; file first, generations
// rising.
func TestPolicyFollowsTheAPI(t *testing.T) {
	e := newPolicyEnv(t)
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathPods, podObj("x", "a", "10.244.1.10", map[string]string{"app": "a"}))
	e.api.put(pathPods, podObj("x", "b", "10.244.2.20", map[string]string{"app": "b"}))
	sock, att := localPod(t, e.store, e.dir, "x", "a", "10.244.1.10")
	st := newFakeStack(t, sock, policy.Closed(testNode))
	e.start(t)

	waitFor(t, "the open policy", 5*time.Second, holds(st, false))
	fileMatches(t, att, st)
	e.api.put(pathPolicies, ingressPolicy("x", "deny", ""))
	waitFor(t, "default deny", 5*time.Second, holds(st, true))
	e.api.put(pathPolicies, ingressPolicy("x", "deny", "b"))
	waitFor(t, "allow from app=b", 5*time.Second, holds(st, true, "10.244.2.20/32"))
	e.api.put(pathPods, podObj("x", "b", "10.244.2.20", map[string]string{"app": "other"}))
	waitFor(t, "b relabelled out", 5*time.Second, holds(st, true))
	e.api.del(pathPolicies, "x/deny")
	waitFor(t, "the policy deleted", 5*time.Second, holds(st, false))
	fileMatches(t, att, st)

	pushes := st.pushed()
	for i := 1; i < len(pushes); i++ {
		if pushes[i].Generation <= pushes[i-1].Generation {
			t.Errorf("push %d: generation %d after %d, want rising", i, pushes[i].Generation, pushes[i-1].Generation)
		}
	}
	if len(pushes) != 5 {
		t.Errorf("pushes: got %d, want 5 (one per change)", len(pushes))
	}
	if got := testutil.ToFloat64(e.m.pods); got != 1 {
		t.Errorf("cni_usernet_policy_pods: got %v, want 1", got)
	}
	// A change that changes no pod's policy pushes nothing.
	e.api.put(pathServices, &netpolicy.Service{Metadata: netpolicy.ObjectMeta{Namespace: "y", Name: "s"}})
	time.Sleep(300 * time.Millisecond)
	if n := len(st.pushed()); n != 5 {
		t.Errorf("after an unrelated change: %d pushes, want still 5", n)
	}
}

// Nothing is compiled before every watch has listed: a policy cache that
// is still empty would open pods that policies close.
func TestPolicyNothingBeforeEveryCacheSynced(t *testing.T) {
	e := newPolicyEnv(t)
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathPods, podObj("x", "a", "10.244.1.10", nil))
	e.api.put(pathPolicies, ingressPolicy("x", "deny", ""))
	e.api.setFailing(pathPolicies, true)
	sock, _ := localPod(t, e.store, e.dir, "x", "a", "10.244.1.10")
	st := newFakeStack(t, sock, policy.Closed(testNode))
	e.start(t)
	time.Sleep(time.Second)
	if n := len(st.pushed()); n != 0 {
		t.Fatalf("pushed %d policies before the policies were listed: first %+v", n, st.pushed()[0])
	}
	if !strings.Contains(e.logs.String(), "networkpolicies.networking.k8s.io") {
		t.Errorf("the log does not say which cache is missing:\n%s", e.logs)
	}
	e.api.setFailing(pathPolicies, false)
	waitFor(t, "default deny once listed", 5*time.Second, holds(st, true))
	for _, p := range st.pushed() {
		if !p.Ingress.Isolated {
			t.Errorf("pushed an open policy: %+v", p)
		}
	}
}

// The API server away: the stacks keep what they hold, nothing is pushed;
// once it is back, what changed meanwhile arrives.
func TestPolicyAPIServerGone(t *testing.T) {
	e := newPolicyEnv(t)
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathPods, podObj("x", "a", "10.244.1.10", nil))
	e.api.put(pathPolicies, ingressPolicy("x", "deny", ""))
	sock, _ := localPod(t, e.store, e.dir, "x", "a", "10.244.1.10")
	st := newFakeStack(t, sock, policy.Closed(testNode))
	e.start(t)
	waitFor(t, "default deny", 5*time.Second, holds(st, true))
	n := len(st.pushed())

	// The watches fail again and again.
	e.api.setDown(true)
	time.Sleep(1500 * time.Millisecond)
	if got := len(st.pushed()); got != n || !st.current().Ingress.Isolated {
		t.Fatalf("while the API server is away: %d pushes (want %d), stack isolated %v (want true)", got, n, st.current().Ingress.Isolated)
	}
	if c := strings.Count(e.logs.String(), "keeping the last cache"); c < 1 || c > 5 {
		t.Errorf("lines about the unreachable server: got %d, want one per watch (rate-limited):\n%s", c, e.logs)
	}
	// The policy goes while the agent cannot see it.
	e.api.del(pathPolicies, "x/deny")
	time.Sleep(300 * time.Millisecond)
	if !st.current().Ingress.Isolated {
		t.Fatal("opened while the API server is away")
	}
	e.api.setDown(false)
	waitFor(t, "the deletion once back", 5*time.Second, holds(st, false))
}

// A pod the agent has never seen while the API server is away: its
// NetworkPolicy cannot be known, so ADD's request fails closed and says
// so; a pod cached before the outage gets the policy of its last view.
func TestPolicyUnknownPodWhileAPIServerAway(t *testing.T) {
	e := newPolicyEnv(t)
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathPods, podObj("x", "a", "10.244.1.10", nil))
	e.api.put(pathPolicies, ingressPolicy("x", "deny", ""))
	c, _ := e.start(t)
	if err := c.WaitSynced(context.Background(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	e.api.setDown(true)
	waitFor(t, "the pods' watch failing", 10*time.Second, func() bool { return c.cache.pods.Err() != nil })

	sock := filepath.Join(e.dir, "b.sock")
	st := newFakeStack(t, sock, policy.Closed(testNode))
	_, err := c.applyNow(context.Background(), target{
		key: state.Key("c-b", "eth0"), namespace: "x", pod: "b", ips: []netip.Addr{netip.MustParseAddr("10.244.1.11")},
		socket: sock, file: filepath.Join(t.TempDir(), "b.json"),
	}, 200*time.Millisecond)
	if err == nil || !errors.Is(err, errPodNotCached) || !strings.Contains(err.Error(), "API server cannot be reached") || !strings.Contains(err.Error(), "fail closed") {
		t.Fatalf("unknown pod, API server away: got %v, want a refusal saying the API server cannot be reached and that it fails closed", err)
	}
	if got := len(st.pushed()); got != 0 {
		t.Errorf("unknown pod: %d pushes to its stack, want none", got)
	}

	sockA := filepath.Join(e.dir, "a2.sock")
	stA := newFakeStack(t, sockA, policy.Closed(testNode))
	gen, err := c.applyNow(context.Background(), target{
		key: state.Key("c-a2", "eth0"), namespace: "x", pod: "a", ips: []netip.Addr{netip.MustParseAddr("10.244.1.10")},
		socket: sockA, file: filepath.Join(t.TempDir(), "a.json"),
	}, 200*time.Millisecond)
	if err != nil {
		t.Fatalf("cached pod, API server away: %v", err)
	}
	if held := stA.current(); held.Generation != gen || !held.Ingress.Isolated {
		t.Errorf("cached pod: stack holds generation %d (isolated %v), want %d isolated by the cached policy", held.Generation, held.Ingress.Isolated, gen)
	}
}

// An agent killed between writing a pod's file and pushing it: the next
// agent pushes the file's policy (same rules, same generation), never an
// open one before its caches are complete, and continues above it.
func TestPolicyAgentRestartedMidPush(t *testing.T) {
	e := newPolicyEnv(t)
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathPods, podObj("x", "a", "10.244.1.10", nil))
	e.api.put(pathPods, podObj("x", "b", "10.244.2.20", map[string]string{"app": "b"}))
	e.api.put(pathPolicies, ingressPolicy("x", "deny", ""))
	sock, att := localPod(t, e.store, e.dir, "x", "a", "10.244.1.10")
	st := newFakeStack(t, sock, policy.Closed(testNode))
	_, stop := e.start(t)
	waitFor(t, "default deny", 5*time.Second, holds(st, true))

	// The stack stops answering; the change is written, not pushed.
	st.setRefuse(true)
	e.api.put(pathPolicies, ingressPolicy("x", "deny", "b"))
	waitFor(t, "the file of the change", 5*time.Second, func() bool {
		f, err := policy.ReadFile(policyPath(att))
		return err == nil && slices.Equal(ingressPeers(f), []string{"10.244.2.20/32"})
	})
	stop()
	written, _ := policy.ReadFile(policyPath(att))
	if held := st.current(); held.Generation >= written.Generation || len(ingressPeers(held)) != 0 {
		t.Fatalf("the stack holds generation %d with peers %v; want the older deny-all", held.Generation, ingressPeers(held))
	}

	// The restarted agent lists the policies late.
	st.setRefuse(false)
	e.api.setFailing(pathPolicies, true)
	before := len(st.pushed())
	c2, _ := e.start(t)
	time.Sleep(500 * time.Millisecond)
	if got := len(st.pushed()); got != before {
		t.Fatalf("the restarted agent pushed before its caches synced")
	}
	e.api.setFailing(pathPolicies, false)
	waitFor(t, "the file's policy pushed", 5*time.Second, holds(st, true, "10.244.2.20/32"))
	if g := st.current().Generation; g != written.Generation {
		t.Errorf("pushed generation %d, want the file's %d", g, written.Generation)
	}
	for _, p := range st.pushed() {
		if !p.Ingress.Isolated {
			t.Errorf("a push opened the pod: generation %d", p.Generation)
		}
	}
	if g := c2.push.nextGeneration(); g <= written.Generation {
		t.Errorf("the restarted agent's next generation %d is not above the file's %d", g, written.Generation)
	}
}

// A stack that cannot take its policy: an Event on the pod, a log line,
// the push error counted, and retries until it works.
func TestPolicyPushFailureEventAndRetry(t *testing.T) {
	e := newPolicyEnv(t)
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathPods, podObj("x", "a", "10.244.1.10", nil))
	e.api.put(pathPolicies, ingressPolicy("x", "deny", ""))
	sock, att := localPod(t, e.store, e.dir, "x", "a", "10.244.1.10")
	e.start(t)
	waitFor(t, "an Event", 5*time.Second, func() bool { return len(e.api.postedEvents()) > 0 })
	ev := e.api.postedEvents()[0]
	obj, _ := ev["involvedObject"].(map[string]any)
	if ev["reason"] != "NetworkPolicyNotApplied" || ev["type"] != "Warning" || obj["name"] != "a" || obj["uid"] != "uid-a" {
		t.Errorf("event: got %v", ev)
	}
	if !strings.Contains(e.logs.String(), "cannot apply the pod's network policy") {
		t.Errorf("no log line about the failure:\n%s", e.logs)
	}
	waitFor(t, "retries", 5*time.Second, func() bool { return testutil.ToFloat64(e.m.pushErrors) >= 3 })
	if got := len(e.api.postedEvents()); got != 1 {
		t.Errorf("events: got %d, want 1 (rate-limited)", got)
	}
	// The file was written already: a stack started now would read it.
	if f, err := policy.ReadFile(policyPath(att)); err != nil || !f.Ingress.Isolated {
		t.Errorf("policy file before any push: %v, %v", f, err)
	}
	st := newFakeStack(t, sock, policy.Closed(testNode))
	waitFor(t, "the retry to succeed", 5*time.Second, holds(st, true))
	waitFor(t, "nothing pending", 5*time.Second, func() bool { return testutil.ToFloat64(e.m.pending) == 0 })
}

// A stack holding a generation above the agent's (its clock set back, its
// files lost) gets pushes above it, not refusals forever.
func TestPolicyStackAhead(t *testing.T) {
	e := newPolicyEnv(t)
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathPods, podObj("x", "a", "10.244.1.10", nil))
	sock, _ := localPod(t, e.store, e.dir, "x", "a", "10.244.1.10")
	ahead := policy.Closed(testNode)
	ahead.Generation = uint64(time.Now().Add(time.Hour).UnixMicro())
	st := newFakeStack(t, sock, ahead)
	e.start(t)
	waitFor(t, "a push above the stack's generation", 5*time.Second, holds(st, false))
	if g := st.current().Generation; g <= ahead.Generation {
		t.Errorf("generation %d, want above %d", g, ahead.Generation)
	}
}

// 10,000 NetworkPolicies and 100 local pods: the first pass compiles and
// pushes every pod; the time is reported (not asserted: the machine is
// shared), then one policy changes and only the pods it selects get a push.
func TestPolicyTenThousandPolicies(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 policies")
	}
	e := newPolicyEnv(t)
	const namespaces, policiesPerNS, local = 100, 100, 100
	for n := range namespaces {
		ns := fmt.Sprintf("ns%d", n)
		e.api.put(pathNamespaces, nsObj(ns, map[string]string{"team": strconv.Itoa(n % 10)}))
		for p := range policiesPerNS {
			np := ingressPolicy(ns, fmt.Sprintf("p%d", p), "")
			np.Spec.PodSelector = netpolicy.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", p%10)}}
			np.Spec.Ingress = []netpolicy.NetworkPolicyIngressRule{{
				From:  []netpolicy.NetworkPolicyPeer{{NamespaceSelector: &netpolicy.LabelSelector{MatchLabels: map[string]string{"team": strconv.Itoa(p % 10)}}}},
				Ports: []netpolicy.NetworkPolicyPort{{Port: &netpolicy.IntOrString{Int: int32(1000 + p)}}},
			}}
			e.api.put(pathPolicies, np)
		}
	}
	stacks := make([]*fakeStack, local)
	for i := range local {
		ns, name := fmt.Sprintf("ns%d", i), fmt.Sprintf("pod%d", i)
		ip := fmt.Sprintf("10.244.%d.%d", i/200, 10+i%200)
		e.api.put(pathPods, podObj(ns, name, ip, map[string]string{"app": fmt.Sprintf("a%d", i%10)}))
		sock, _ := localPod(t, e.store, e.dir, ns, name, ip)
		stacks[i] = newFakeStack(t, sock, policy.Closed(testNode))
	}
	// Remote pods, selected by the namespace selectors.
	for i := range 1000 {
		ns := fmt.Sprintf("ns%d", i%namespaces)
		e.api.put(pathPods, podObj(ns, fmt.Sprintf("remote%d", i), fmt.Sprintf("10.245.%d.%d", i/200, 10+i%200), map[string]string{"app": "r"}))
	}
	start := time.Now()
	e.start(t)
	waitFor(t, "every stack's first push", 2*time.Minute, func() bool {
		for _, s := range stacks {
			if p := s.current(); p == nil || p.Generation == 0 {
				return false
			}
		}
		return true
	})
	first := time.Since(start)
	for i, s := range stacks {
		if !s.current().Ingress.Isolated {
			t.Fatalf("pod %d not isolated", i)
		}
	}
	t.Logf("10,000 policies, 1,100 pods, 100 local: list + first compile and push of every local pod: %s", first.Round(time.Millisecond))
	// One policy of ns0 changes: only ns0's pods selected by it get a push.
	before := make([]int, local)
	for i, s := range stacks {
		before[i] = len(s.pushed())
	}
	changeAt := time.Now()
	np := ingressPolicy("ns0", "p0", "")
	np.Spec.PodSelector = netpolicy.LabelSelector{MatchLabels: map[string]string{"app": "a0"}}
	e.api.put(pathPolicies, np)
	waitFor(t, "the change pushed", time.Minute, func() bool { return len(stacks[0].pushed()) > before[0] })
	t.Logf("one policy changed: pushed to the pod it selects %s later (debounce 50 ms included)", time.Since(changeAt).Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond)
	for i := 1; i < local; i++ {
		if len(stacks[i].pushed()) != before[i] {
			t.Errorf("pod %d got a push for a policy of another namespace", i)
		}
	}
}
