package policyctl

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cni-usernet/cni-usernet/pkg/api/agentapi"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// The plugin's request on the agent's socket: 503 until the caches
// synced, then compiled, written and pushed before the answer; a pod the
// watch delivers during the wait is served.
func TestAgentSocketPolicy(t *testing.T) {
	e := newPolicyEnv(t)
	e.api.put(pathNamespaces, nsObj("x", nil))
	e.api.put(pathPolicies, ingressPolicy("x", "deny", ""))
	e.api.setFailing(pathPods, true)
	c, _ := e.start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sockPath := filepath.Join(e.dir, "agent.sock")
	if err := ServeSocket(ctx, sockPath, c); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(sockPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("agent socket: %v, %v, want mode 0600", fi, err)
	}
	stackSock := filepath.Join(e.dir, "a.sock")
	st := newFakeStack(t, stackSock, policy.Closed(testNode))
	file := filepath.Join(t.TempDir(), "policy.json")
	req := agentapi.PolicyRequest{
		ContainerID: "c-a", IfName: "eth0", Namespace: "x", Pod: "a", PodIPs: []string{"10.244.1.10/24"},
		ControlSocket: stackSock, PolicyPath: file,
	}
	_, err := agentapi.RequestPolicy(ctx, sockPath, 10*time.Second, req)
	if !errors.Is(err, agentapi.ErrUnavailable) || !strings.Contains(err.Error(), "not synced") || !strings.Contains(err.Error(), "pods") {
		t.Fatalf("before the pods are listed: got %v, want unavailable, naming the pods cache", err)
	}
	if err := c.WaitSynced(context.Background(), 200*time.Millisecond); err == nil || !strings.Contains(err.Error(), "pods") {
		t.Errorf("waitSynced without the pods: got %v, want an error naming them", err)
	}
	e.api.setFailing(pathPods, false)
	if err := c.WaitSynced(context.Background(), 5*time.Second); err != nil {
		t.Fatalf("waitSynced: %v", err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		e.api.put(pathPods, podObj("x", "a", "10.244.1.10", nil))
	}()
	gen, err := agentapi.RequestPolicy(ctx, sockPath, 10*time.Second, req)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	if held := st.current(); held.Generation != gen || !held.Ingress.Isolated {
		t.Errorf("answered generation %d; the stack holds %d (isolated %v)", gen, held.Generation, held.Ingress.Isolated)
	}
	if f, err := policy.ReadFile(file); err != nil || f.Generation != gen {
		t.Errorf("policy file: %+v, %v, want generation %d", f, err, gen)
	}
	// Bad requests say what is wrong.
	bad := req
	bad.PodIPs = []string{"not an address"}
	if _, err := agentapi.RequestPolicy(ctx, sockPath, 10*time.Second, bad); err == nil || errors.Is(err, agentapi.ErrUnavailable) || !strings.Contains(err.Error(), "400") {
		t.Errorf("bad address: got %v, want a 400", err)
	}
	// A stack that does not answer: 503 with the reason.
	st.stop()
	e.api.put(pathPods, podObj("x", "b", "10.244.2.20", map[string]string{"app": "b"}))
	e.api.put(pathPolicies, ingressPolicy("x", "deny", "b"))
	waitFor(t, "the change in the cache", 5*time.Second, func() bool {
		np, _ := c.cache.policies.Get("x/deny")
		return np != nil && len(np.Spec.Ingress) == 1
	})
	if _, err := agentapi.RequestPolicy(ctx, sockPath, 10*time.Second, req); !errors.Is(err, agentapi.ErrUnavailable) || !strings.Contains(err.Error(), stackSock) {
		t.Errorf("stack gone: got %v, want unavailable naming the stack's socket", err)
	}
	if testutil.CollectAndCount(e.m.duration) == 0 {
		t.Error("no duration observed")
	}
}
