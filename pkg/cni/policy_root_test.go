package cni_test

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/cni-usernet/cni-usernet/pkg/api/agentapi"
	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// fakeAgent serves the node agent's socket in the env's run directory with
// handle; closing it removes the socket.
func fakeAgent(t *testing.T, env *nettest.Env, handle http.HandlerFunc) func() {
	t.Helper()
	dir := filepath.Join(env.Dir, "run")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", agentapi.Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handle}
	go srv.Serve(ln)
	var once sync.Once
	stop := func() { once.Do(func() { srv.Close() }) }
	t.Cleanup(stop)
	return stop
}

// With "networkPolicy" on, ADD fails with code 11 (try again later) and
// undoes everything when the agent cannot put the pod's policy in its
// stack: no agent, or one whose caches have not synced.
func TestAddNetworkPolicyAgentUnavailable(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, map[string]any{"networkPolicy": true})
	t.Run("no agent", func(t *testing.T) {
		te := addFails(t, env, conf, "noagent")
		wantCode(t, te, types.ErrTryAgainLater)
		wantMessage(t, te.Msg, "network policy", agentapi.Path(filepath.Join(env.Dir, "run")))
	})
	t.Run("caches not synced", func(t *testing.T) {
		stop := fakeAgent(t, env, func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "the agent's caches have not synced with the API server yet: pods", http.StatusServiceUnavailable)
		})
		pod := nettest.NewNS(t)
		_, err := env.Exec("cni-usernet", "ADD", conf, "unsynced", pod, "eth0")
		stop()
		if err == nil {
			t.Fatal("ADD succeeded without the pod's policy")
		}
		te := cniErr(t, err)
		wantCode(t, te, types.ErrTryAgainLater)
		wantMessage(t, te.Msg, "not synced", "pods")
		env.AssertNoLeaks(t)
		assertNSClean(t, pod)
	})
	t.Run("no pod in CNI_ARGS", func(t *testing.T) {
		// The later keys override the pod the env names.
		env.PodArgs = ";K8S_POD_NAMESPACE=;K8S_POD_NAME="
		defer func() { env.PodArgs = "" }()
		te := addFails(t, env, conf, "nopod")
		wantCode(t, te, types.ErrInvalidNetworkConfig)
		wantMessage(t, te.Msg, `"networkPolicy"`, "K8S_POD_NAME")
	})
}

// With an agent that puts the policy in the stack, ADD succeeds once the
// stack holds it: the request names the pod, its addresses, the stack's
// socket and its policy file.
func TestAddNetworkPolicyAgentAnswers(t *testing.T) {
	env := nettest.NewEnv(t)
	conf := env.Conf(latest, map[string]any{"networkPolicy": true})
	var got agentapi.PolicyRequest
	stop := fakeAgent(t, env, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != agentapi.PolicyPath {
			http.NotFound(w, r)
			return
		}
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		// As the agent does: the file, then the push.
		p := &policy.PodPolicy{Version: policy.FormatVersion, Generation: 42}
		b, _ := policy.Marshal(p)
		if err := os.WriteFile(got.PolicyPath, b, 0o600); err != nil {
			http.Error(w, err.Error(), 503)
			return
		}
		gen, err := control.PutPolicy(got.ControlSocket, 5*time.Second, p)
		if err != nil {
			http.Error(w, err.Error(), 503)
			return
		}
		json.NewEncoder(w).Encode(agentapi.PolicyAnswer{Generation: gen})
	})
	pod := env.NewPod(conf)
	att := loadState(t, env, pod.ID)
	if got.Namespace != "test" || got.Pod != pod.ID || got.ContainerID != pod.ID || got.IfName != "eth0" ||
		len(got.PodIPs) != len(att.IPs) || got.ControlSocket != att.ControlSocket ||
		got.PolicyPath != filepath.Join(filepath.Dir(att.ConfigPath), "policy.json") {
		t.Errorf("request %+v does not match the attachment %+v", got, att)
	}
	if b, err := os.ReadFile(got.PolicyPath); err != nil || !strings.Contains(string(b), `"generation":42`) {
		t.Errorf("policy file: %s, %v", b, err)
	}
	// The stack holds it, and its pod is reachable (the policy allows
	// everything).
	var st control.Status
	if err := control.FetchStatus(att.ControlSocket, 5*time.Second, &st); err != nil || st.Policy == nil || st.Policy.Generation != 42 {
		t.Errorf("the stack's policy: got %+v (%v), want generation 42", st.Policy, err)
	}
	if err := env.Del(conf, pod.ID, pod.NS); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	stop()
	env.AssertNoLeaks(t)
}
