package cni_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cni-usernet/cni-usernet/pkg/api/kube"
	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// fakeAPI is an API server that takes the token test-token, holds the
// pods of namespace test and records the Events posted to it.
type fakeAPI struct {
	t *testing.T
	*fakeapi.Server
}

// newFakeAPI listens on the loopback of the node namespace, where the
// plugin runs.
func newFakeAPI(t *testing.T, node ns.NetNS) *fakeAPI {
	ln := nettest.Listen(t, node, "tcp", "127.0.0.1:0")
	return &fakeAPI{t: t, Server: fakeapi.NewTest(t, fakeapi.Options{Token: "test-token", Listener: ln})}
}

// setPod stores pod test/name, of UID uid-x, with annotations.
func (f *fakeAPI) setPod(name string, annotations map[string]string) {
	if _, err := f.Store.Put("pods", map[string]any{"metadata": map[string]any{
		"namespace": "test", "name": name, "uid": "uid-x", "annotations": annotations}}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeAPI) kubeconfig(t *testing.T, dir string) string {
	path := filepath.Join(dir, "kubeconfig")
	if _, err := kube.WriteKubeconfig(path, f.URL(), f.CAPEM(), "test-token"); err != nil {
		t.Fatal(err)
	}
	return path
}

func (f *fakeAPI) eventsFor(pod string) []map[string]any {
	var out []map[string]any
	for _, e := range f.EventBodies() {
		if obj, _ := e["involvedObject"].(map[string]any); obj["name"] == pod {
			out = append(out, e)
		}
	}
	return out
}

// TestAnnotationFromAPIServer: a runtime that does not pass the pod's
// annotations (no capability argument) still gets the pod's GSO mode, read
// from the API server with the agent's kubeconfig, and the decision is
// posted as an Event on the pod; a bad annotation is a Warning Event and
// CNI code 7; an unreachable API server is code 11 (try again) — never a
// silent default — and each failure leaves nothing behind.
func TestAnnotationFromAPIServer(t *testing.T) {
	env := nettest.NewEnv(t)
	api := newFakeAPI(t, env.Node)
	t.Cleanup(func() { env.AssertNoLeaks(t) })
	conf := env.Conf(latest, map[string]any{
		"kubeconfig": api.kubeconfig(t, env.Dir),
		"nodeName":   "node-a",
	})
	env.PodArgs = ";K8S_POD_UID=uid-x"

	api.setPod("p-soft", map[string]string{"cni-usernet.io/gso": "software"})
	pod := nettest.NewNS(t)
	if _, err := env.Add(conf, "p-soft", pod); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if got := loadState(t, env, "p-soft").GSO.Mode; got != "software" {
		t.Errorf("GSO mode %q, want software from the API server's annotation", got)
	}
	// (A machine that ran a kubelet has a kubepods tree, where the
	// plugin looks for the pod's cgroup in vain: a StackChargedToNode
	// Warning beside it is right, and not this test's subject.)
	var evs []map[string]any
	for _, ev := range api.eventsFor("p-soft") {
		if ev["reason"] != "StackChargedToNode" {
			evs = append(evs, ev)
		}
	}
	if len(evs) != 1 {
		t.Fatalf("events %v, want one GSOMode event", evs)
	}
	ev := evs[0]
	obj := ev["involvedObject"].(map[string]any)
	if ev["reason"] != "GSOMode" || ev["type"] != "Normal" || obj["uid"] != "uid-x" || obj["kind"] != "Pod" ||
		!strings.Contains(ev["message"].(string), "GSO software") || !strings.Contains(ev["message"].(string), "annotation cni-usernet.io/gso") {
		t.Errorf("event %v", ev)
	}
	if err := env.Del(conf, "p-soft", pod); err != nil {
		t.Fatal(err)
	}

	api.setPod("p-bad", map[string]string{"cni-usernet.io/gso": "turbo"})
	pod = nettest.NewNS(t)
	_, err := env.Add(conf, "p-bad", pod)
	te := cniErr(t, err)
	if te.Code != types.ErrInvalidNetworkConfig {
		t.Errorf("bad annotation: code %d, want %d", te.Code, types.ErrInvalidNetworkConfig)
	}
	wantMessage(t, te.Msg, "cni-usernet.io/gso", "turbo")
	evs = api.eventsFor("p-bad")
	if len(evs) != 1 || evs[0]["type"] != "Warning" || evs[0]["reason"] != "InvalidGSOAnnotation" ||
		!strings.Contains(evs[0]["message"].(string), "turbo") {
		t.Errorf("bad annotation events %v, want one InvalidGSOAnnotation warning", evs)
	}
	assertNSClean(t, pod)

	// The API server goes away: code 11, nothing left behind.
	api.Close()
	pod = nettest.NewNS(t)
	_, err = env.Add(conf, "p-soft", pod)
	te = cniErr(t, err)
	if te.Code != types.ErrTryAgainLater {
		t.Errorf("unreachable API server: code %d (%s), want %d", te.Code, te.Msg, types.ErrTryAgainLater)
	}
	assertNSClean(t, pod)
}
