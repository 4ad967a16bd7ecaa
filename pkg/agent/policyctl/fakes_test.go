package policyctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// The collections' paths, as the reflectors ask for them.
const (
	pathPolicies   = "/apis/networking.k8s.io/v1/networkpolicies"
	pathPods       = "/api/v1/pods"
	pathNamespaces = "/api/v1/namespaces"
	pathServices   = "/api/v1/services"
	pathSlices     = "/apis/discovery.k8s.io/v1/endpointslices"
)

// fakeAPI is the API server for the five collections the agent
// watches, with the paths the reflectors ask for as its handles.
type fakeAPI struct {
	t *testing.T
	*fakeapi.Server
}

func newFakeAPI(t *testing.T) *fakeAPI {
	return &fakeAPI{t: t, Server: fakeapi.NewTest(t, fakeapi.Options{Token: "tok"})}
}

func (a *fakeAPI) config() *rest.Config {
	return &rest.Config{Host: a.URL(), BearerToken: "tok", TLSClientConfig: rest.TLSClientConfig{CAData: a.CAPEM()}}
}

// resource is the collection of one of the paths above.
func resource(path string) string { return path[strings.LastIndex(path, "/")+1:] }

// setDown answers 503 to everything and ends the open watches.
func (a *fakeAPI) setDown(down bool) { a.SetDown(down) }

// setFailing answers 503 to the lists and watches of path.
func (a *fakeAPI) setFailing(path string, failing bool) {
	if failing {
		a.SetFault(path, &fakeapi.Fault{Code: 503, Reason: "ServiceUnavailable", Message: "the API server is away"})
	} else {
		a.SetFault(path, nil)
	}
}

// put stores obj (a netpolicy type), as ADDED or MODIFIED.
func (a *fakeAPI) put(path string, obj any) {
	if _, err := a.Store.Put(resource(path), obj); err != nil {
		a.t.Fatal(err)
	}
}

// del deletes ns/name, or name for a namespace.
func (a *fakeAPI) del(path, key string) {
	ns, name, ok := strings.Cut(key, "/")
	if !ok {
		ns, name = "", key
	}
	if err := a.Store.Delete(resource(path), ns, name); err != nil {
		a.t.Fatal(err)
	}
}

func (a *fakeAPI) postedEvents() []map[string]any { return a.EventBodies() }

// fakeStack is a pod stack's control socket as the agent sees it: PUT
// /policy with the stack's rules (409 for an older generation), GET
// /status with the generation in force. Every push is recorded.
type fakeStack struct {
	path string
	srv  *http.Server

	mu     sync.Mutex
	held   *policy.PodPolicy
	pushes []*policy.PodPolicy
	// refuse answers 500 to every push.
	refuse bool
}

// sockDir is a short directory for unix sockets (108 bytes at most).
func sockDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "np")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func newFakeStack(t *testing.T, path string, held *policy.PodPolicy) *fakeStack {
	s := &fakeStack{path: path, held: held}
	s.start(t)
	return s
}

func (s *fakeStack) start(t *testing.T) {
	os.Remove(s.path)
	ln, err := net.Listen("unix", s.path)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /policy", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p, err := policy.Unmarshal(b)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.refuse {
			http.Error(w, "refused", 500)
			return
		}
		if s.held != nil && p.Generation < s.held.Generation {
			http.Error(w, fmt.Sprintf("generation %d, in force %d: policy is older than the one in force", p.Generation, s.held.Generation), 409)
			return
		}
		s.held = p
		s.pushes = append(s.pushes, p)
		json.NewEncoder(w).Encode(map[string]uint64{"generation": p.Generation})
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		st := map[string]any{}
		if s.held != nil {
			st["policy"] = map[string]any{"generation": s.held.Generation}
		}
		json.NewEncoder(w).Encode(st)
	})
	s.srv = &http.Server{Handler: mux}
	go s.srv.Serve(ln)
	t.Cleanup(func() { s.srv.Close() })
}

func (s *fakeStack) stop() { s.srv.Close(); os.Remove(s.path) }

func (s *fakeStack) current() *policy.PodPolicy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

func (s *fakeStack) pushed() []*policy.PodPolicy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.pushes)
}

func (s *fakeStack) setRefuse(r bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse = r
}

// node is the test node's address, given to the compiler.
var testNode = []netip.Addr{netip.MustParseAddr("192.0.2.1")}

// localPod records an attachment for ns/name with ip, whose stack is st.
func localPod(t *testing.T, store state.Store, dir, ns, name, ip string) (string, *state.Attachment) {
	t.Helper()
	stackDir := filepath.Join(store.Dir, "stacks", name)
	if err := os.MkdirAll(stackDir, 0o700); err != nil {
		t.Fatal(err)
	}
	a := &state.Attachment{
		ContainerID: "c-" + name, IfName: "eth0", PodNS: ns, PodName: name,
		IPs:           []string{ip + "/24"},
		ConfigPath:    filepath.Join(stackDir, "config.json"),
		ControlSocket: filepath.Join(dir, name+".sock"),
	}
	if err := store.Save(a); err != nil {
		t.Fatal(err)
	}
	return a.ControlSocket, a
}

func nsObj(name string, labels map[string]string) *netpolicy.Namespace {
	return &netpolicy.Namespace{Metadata: netpolicy.ObjectMeta{Name: name, Labels: labels}}
}

func podObj(ns, name, ip string, labels map[string]string) *netpolicy.Pod {
	return &netpolicy.Pod{
		Metadata: netpolicy.ObjectMeta{Namespace: ns, Name: name, UID: "uid-" + name, Labels: labels},
		Status:   netpolicy.PodStatus{Phase: "Running", PodIPs: []netpolicy.PodIP{{IP: ip}}},
	}
}

// denyAll isolates ingress of every pod of ns; with from, it allows from
// the pods labelled app=from (in every namespace).
func ingressPolicy(ns, name, from string) *netpolicy.NetworkPolicy {
	np := &netpolicy.NetworkPolicy{
		Metadata: netpolicy.ObjectMeta{Namespace: ns, Name: name},
		Spec:     netpolicy.NetworkPolicySpec{PolicyTypes: []string{"Ingress"}},
	}
	if from != "" {
		np.Spec.Ingress = []netpolicy.NetworkPolicyIngressRule{{From: []netpolicy.NetworkPolicyPeer{{
			PodSelector:       &netpolicy.LabelSelector{MatchLabels: map[string]string{"app": from}},
			NamespaceSelector: &netpolicy.LabelSelector{},
		}}}}
	}
	return np
}

type policyEnv struct {
	api   *fakeAPI
	store state.Store
	dir   string
	logs  *nettest.LockedBuffer
	m     *Metrics
	// compiled is told of each pod the controller compiles; nil: none.
	compiled func(podKey string)
	// resync is Options.Resync; zero: the default.
	resync time.Duration
	// clusterPolicies is Options.ClusterNetworkPolicy.
	clusterPolicies bool
	// statusDelay is Options.statusDelay; zero: the default.
	statusDelay time.Duration
}

func newPolicyEnv(t *testing.T) *policyEnv {
	return &policyEnv{api: newFakeAPI(t), store: state.Store{Dir: t.TempDir()}, dir: sockDir(t), logs: &nettest.LockedBuffer{}, m: NewMetrics()}
}

// start runs a policy controller until the returned stop is called (or
// the test ends).
func (e *policyEnv) start(t *testing.T) (*Controller, func()) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(e.logs, nil))
	c, err := New(Options{
		Config:       e.api.config(),
		Store:        e.store,
		Node:         "node-1",
		NodeAddrs:    func() ([]netip.Addr, error) { return testNode, nil },
		Retry:        50 * time.Millisecond,
		Metrics:      e.m,
		Log:          log,
		watchBackoff: 20 * time.Millisecond,
		compiled:     e.compiled,
		Resync:       e.resync,
		statusDelay:  e.statusDelay,

		ClusterNetworkPolicy: e.clusterPolicies,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return c, stop
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// peers are the addresses a policy's ingress rules allow, sorted.
func ingressPeers(p *policy.PodPolicy) []string {
	var out []string
	for _, r := range p.Ingress.Rules {
		for _, peer := range r.Peers {
			out = append(out, peer.CIDR.String())
		}
	}
	slices.Sort(out)
	return out
}

func holds(s *fakeStack, isolated bool, peers ...string) func() bool {
	return func() bool {
		p := s.current()
		// Generation 0 is the Closed policy the stack started with.
		return p != nil && p.Generation != 0 && p.Ingress.Isolated == isolated && slices.Equal(ingressPeers(p), peers)
	}
}

// fileMatches checks that the policy file holds what the stack holds.
func fileMatches(t *testing.T, a *state.Attachment, s *fakeStack) {
	t.Helper()
	f, err := policy.ReadFile(policyPath(a))
	if err != nil {
		t.Fatalf("policy file: %v", err)
	}
	if held := s.current(); f.Generation != held.Generation || !policy.Equal(f, held) {
		t.Errorf("policy file holds generation %d, the stack %d (equal rules: %v)", f.Generation, held.Generation, policy.Equal(f, held))
	}
}
