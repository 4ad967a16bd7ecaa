package agent

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/api/agentapi"
	"github.com/cni-usernet/cni-usernet/pkg/api/kube"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/test/nettest"
)

// The collections' paths, as the reflectors ask for them.
const (
	pathPolicies   = "/apis/networking.k8s.io/v1/networkpolicies"
	pathPods       = "/api/v1/pods"
	pathNamespaces = "/api/v1/namespaces"
	pathServices   = "/api/v1/services"
	pathSlices     = "/apis/discovery.k8s.io/v1/endpointslices"
)

// fakeAPI is an API server stand-in for the five collections the agent
// watches: lists, watches with a shared history, Events recorded, and
// switches to make it fail.
type fakeAPI struct {
	t   *testing.T
	srv *httptest.Server

	mu      sync.Mutex
	rv      int
	objects map[string]map[string]json.RawMessage // path -> key -> object
	history []apiEvent
	wake    chan struct{}
	// down answers 503 to everything and ends the open watches.
	down bool
	// failing answers 503 to the lists and watches of these paths.
	failing map[string]bool
	events  []map[string]any
}

type apiEvent struct {
	rv   int
	path string
	typ  string
	obj  json.RawMessage
}

func newFakeAPI(t *testing.T) *fakeAPI {
	a := &fakeAPI{t: t, objects: map[string]map[string]json.RawMessage{}, wake: make(chan struct{}), failing: map[string]bool{}}
	for _, p := range []string{pathPolicies, pathPods, pathNamespaces, pathServices, pathSlices} {
		a.objects[p] = map[string]json.RawMessage{}
	}
	a.srv = httptest.NewUnstartedServer(a)
	a.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	a.srv.StartTLS()
	t.Cleanup(func() {
		a.setDown(true)
		a.srv.Close()
	})
	return a
}

func (a *fakeAPI) client() *kube.Client {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.srv.Certificate().Raw})
	c, err := kube.New(kube.Config{Server: a.srv.URL, CAPEM: ca, Token: "tok"})
	if err != nil {
		a.t.Fatal(err)
	}
	return c
}

func (a *fakeAPI) notify() {
	close(a.wake)
	a.wake = make(chan struct{})
}

func (a *fakeAPI) setDown(down bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.down = down
	a.notify()
}

func (a *fakeAPI) setFailing(path string, failing bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.failing[path] = failing
	a.notify()
}

// put stores obj (a netpolicy type) under ns/name, as ADDED or MODIFIED.
func (a *fakeAPI) put(path string, obj any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, err := json.Marshal(obj)
	if err != nil {
		a.t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	md := m["metadata"].(map[string]any)
	a.rv++
	md["resourceVersion"] = strconv.Itoa(a.rv)
	key, _ := md["name"].(string)
	if ns, _ := md["namespace"].(string); ns != "" {
		key = ns + "/" + key
	}
	b, _ = json.Marshal(m)
	typ := "MODIFIED"
	if _, ok := a.objects[path][key]; !ok {
		typ = "ADDED"
	}
	a.objects[path][key] = b
	a.history = append(a.history, apiEvent{a.rv, path, typ, b})
	a.notify()
}

func (a *fakeAPI) del(path, key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	obj, ok := a.objects[path][key]
	if !ok {
		a.t.Fatalf("deleting %s %s: not there", path, key)
	}
	delete(a.objects[path], key)
	a.rv++
	a.history = append(a.history, apiEvent{a.rv, path, "DELETED", obj})
	a.notify()
}

func (a *fakeAPI) postedEvents() []map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.events)
}

func (a *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	status := func(code int, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "code": code, "message": msg})
	}
	a.mu.Lock()
	if a.down || a.failing[r.URL.Path] {
		a.mu.Unlock()
		status(503, "the API server is away")
		return
	}
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/events") {
		var e map[string]any
		json.NewDecoder(r.Body).Decode(&e)
		a.events = append(a.events, e)
		a.mu.Unlock()
		w.WriteHeader(201)
		return
	}
	objs, ok := a.objects[r.URL.Path]
	if !ok || r.Method != http.MethodGet {
		a.mu.Unlock()
		status(404, "no such path "+r.URL.Path)
		return
	}
	q := r.URL.Query()
	if q.Get("watch") == "" {
		items := []json.RawMessage{}
		for _, o := range objs {
			items = append(items, o)
		}
		rv := a.rv
		a.mu.Unlock()
		json.NewEncoder(w).Encode(map[string]any{"metadata": map[string]any{"resourceVersion": strconv.Itoa(rv)}, "items": items})
		return
	}
	from, _ := strconv.Atoi(q.Get("resourceVersion"))
	a.mu.Unlock()
	w.WriteHeader(200)
	w.(http.Flusher).Flush()
	enc := json.NewEncoder(w)
	for {
		a.mu.Lock()
		if a.down || a.failing[r.URL.Path] {
			a.mu.Unlock()
			return
		}
		var send []apiEvent
		for _, e := range a.history {
			if e.rv > from && e.path == r.URL.Path {
				send = append(send, e)
			}
		}
		from = a.rv
		wake := a.wake
		a.mu.Unlock()
		for _, e := range send {
			enc.Encode(map[string]any{"type": e.typ, "object": e.obj})
		}
		w.(http.Flusher).Flush()
		select {
		case <-wake:
		case <-r.Context().Done():
			return
		}
	}
}

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
	m     *policyMetrics
}

func newPolicyEnv(t *testing.T) *policyEnv {
	return &policyEnv{api: newFakeAPI(t), store: state.Store{Dir: t.TempDir()}, dir: sockDir(t), logs: &nettest.LockedBuffer{}, m: newPolicyMetrics()}
}

// start runs a policy controller until the returned stop is called (or
// the test ends).
func (e *policyEnv) start(t *testing.T) (*policyController, func()) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(e.logs, nil))
	c, err := newPolicyController(policyOptions{
		Client:       e.api.client(),
		Store:        e.store,
		Compile:      netpolicyCompile(log, nil),
		Node:         "node-1",
		NodeAddrs:    func() ([]netip.Addr, error) { return testNode, nil },
		Retry:        50 * time.Millisecond,
		Metrics:      e.m,
		Log:          log,
		watchBackoff: 20 * time.Millisecond,
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
	f, err := readPolicyFile(policyPath(a))
	if err != nil {
		t.Fatalf("policy file: %v", err)
	}
	if held := s.current(); f.Generation != held.Generation || !policy.Equal(f, held) {
		t.Errorf("policy file holds generation %d, the stack %d (equal rules: %v)", f.Generation, held.Generation, policy.Equal(f, held))
	}
}

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
	if err := c.waitSynced(context.Background(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	e.api.setDown(true)
	waitFor(t, "the pods' watch failing", 10*time.Second, func() bool { return c.pods.Err() != nil })

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
		f, err := readPolicyFile(policyPath(att))
		return err == nil && slices.Equal(ingressPeers(f), []string{"10.244.2.20/32"})
	})
	stop()
	written, _ := readPolicyFile(policyPath(att))
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
	if g := c2.nextGeneration(); g <= written.Generation {
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
	if f, err := readPolicyFile(policyPath(att)); err != nil || !f.Ingress.Isolated {
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
	if err := serveAgentSocket(ctx, sockPath, c); err != nil {
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
	if err := c.waitSynced(context.Background(), 200*time.Millisecond); err == nil || !strings.Contains(err.Error(), "pods") {
		t.Errorf("waitSynced without the pods: got %v, want an error naming them", err)
	}
	e.api.setFailing(pathPods, false)
	if err := c.waitSynced(context.Background(), 5*time.Second); err != nil {
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
	if f, err := readPolicyFile(file); err != nil || f.Generation != gen {
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
		np, _ := c.policies.Get("x/deny")
		return np != nil && len(np.Spec.Ingress) == 1
	})
	if _, err := agentapi.RequestPolicy(ctx, sockPath, 10*time.Second, req); !errors.Is(err, agentapi.ErrUnavailable) || !strings.Contains(err.Error(), stackSock) {
		t.Errorf("stack gone: got %v, want unavailable naming the stack's socket", err)
	}
	if testutil.CollectAndCount(e.m.duration) == 0 {
		t.Error("no duration observed")
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

// A policy the compiler cannot fully use: its warnings go to the log and,
// once per change, to warn (the Event on the pod).
func TestCompileWarningsOncePerChange(t *testing.T) {
	logs := &nettest.LockedBuffer{}
	var warned []string
	compile := netpolicyCompile(slog.New(slog.NewTextHandler(logs, nil)), func(p *netpolicy.Pod, w string) {
		warned = append(warned, p.Metadata.Name+": "+w)
	})
	pod := podObj("x", "a", "10.244.1.10", nil)
	bad := ingressPolicy("x", "bad", "")
	bad.Spec.Ingress = []netpolicy.NetworkPolicyIngressRule{{From: []netpolicy.NetworkPolicyPeer{{IPBlock: &netpolicy.IPBlock{CIDR: "10.0.0.0/33"}}}}}
	snap := &netpolicy.Snapshot{
		Policies: map[string]*netpolicy.NetworkPolicy{"x/bad": bad},
		Pods:     map[string]*netpolicy.Pod{"x/a": pod},
	}
	local := netpolicy.LocalPod{Pod: pod, IPs: []netip.Addr{netip.MustParseAddr("10.244.1.10")}}
	for range 3 {
		p := compile(snap, []netpolicy.LocalPod{local})(local, testNode)
		if !p.Ingress.Isolated || len(ingressPeers(p)) != 0 {
			t.Fatalf("the bad ipBlock opened something: %+v", p.Ingress)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "x/bad") {
		t.Errorf("warnings given: %q, want one naming x/bad", warned)
	}
	if !strings.Contains(logs.String(), "x/bad") {
		t.Errorf("no log line:\n%s", logs)
	}
}
