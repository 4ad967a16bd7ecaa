package fakeapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

func pod(ns, name, node string, labels map[string]string) map[string]any {
	return map[string]any{"metadata": map[string]any{"namespace": ns, "name": name, "uid": "uid-" + name, "labels": labels},
		"spec": map[string]any{"nodeName": node}}
}

// testServer serves 30 pods in 3 namespaces (tier frontend or backend,
// every third on node-a) and two policies, and returns a GET that trusts
// it and sends the token.
func testServer(t *testing.T) (*Server, func(path string) *http.Response) {
	t.Helper()
	s := NewTest(t, Options{Token: "tok", Bookmark: 50 * time.Millisecond})
	var pods []any
	for i := range 30 {
		tier := map[bool]string{true: "frontend", false: "backend"}[i%2 == 0]
		node := map[bool]string{true: "node-a", false: "node-b"}[i%3 == 0]
		pods = append(pods, pod(fmt.Sprintf("ns-%d", i%3), fmt.Sprintf("p-%02d", i), node, map[string]string{"tier": tier}))
	}
	if err := s.Store.Load("pods", pods...); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b"} {
		if _, err := s.Store.Put("networkpolicies", map[string]any{"metadata": map[string]any{"namespace": "ns-0", "name": n}}); err != nil {
			t.Fatal(err)
		}
	}
	s.Store.Compact()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CAPEM())
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	t.Cleanup(client.CloseIdleConnections)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	get := func(path string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+path, nil)
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	return s, get
}

type listPage struct {
	Kind     string `json:"kind"`
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
	Items []struct {
		Metadata struct {
			Name, Namespace, ResourceVersion, UID string
			Labels                                map[string]string
		} `json:"metadata"`
	} `json:"items"`
}

func decode(t *testing.T, resp *http.Response, v any) {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

func TestListPages(t *testing.T) {
	_, get := testServer(t)
	seen := map[string]bool{}
	var rv string
	cont := ""
	pages := 0
	for {
		q := url.Values{"limit": {"7"}}
		if cont != "" {
			q.Set("continue", cont)
		}
		var p listPage
		decode(t, get("/api/v1/pods?"+q.Encode()), &p)
		pages++
		if p.Kind != "PodList" {
			t.Errorf("kind %q, want PodList", p.Kind)
		}
		if rv == "" {
			rv = p.Metadata.ResourceVersion
		} else if p.Metadata.ResourceVersion != rv {
			t.Errorf("page %d: resourceVersion %s, want the first page's %s", pages, p.Metadata.ResourceVersion, rv)
		}
		for _, it := range p.Items {
			k := it.Metadata.Namespace + "/" + it.Metadata.Name
			if seen[k] || it.Metadata.ResourceVersion == "" {
				t.Errorf("%s listed twice, or without a resourceVersion", k)
			}
			seen[k] = true
		}
		if cont = p.Metadata.Continue; cont == "" {
			break
		}
	}
	if len(seen) != 30 || pages != 5 {
		t.Errorf("got %d pods in %d pages, want 30 in 5", len(seen), pages)
	}
}

func TestListSelectors(t *testing.T) {
	_, get := testServer(t)
	var p listPage
	decode(t, get("/api/v1/pods?fieldSelector="+url.QueryEscape("spec.nodeName=node-a")), &p)
	if len(p.Items) != 10 {
		t.Errorf("spec.nodeName=node-a: got %d pods, want 10", len(p.Items))
	}
	var q listPage
	decode(t, get("/api/v1/namespaces/ns-1/pods?labelSelector="+url.QueryEscape("tier=frontend")), &q)
	if len(q.Items) != 5 {
		t.Errorf("ns-1 tier=frontend: got %d pods, want 5", len(q.Items))
	}
	for _, it := range q.Items {
		if it.Metadata.Namespace != "ns-1" || it.Metadata.Labels["tier"] != "frontend" {
			t.Errorf("got %s/%s %v", it.Metadata.Namespace, it.Metadata.Name, it.Metadata.Labels)
		}
	}
	if r := get("/api/v1/pods?labelSelector=" + url.QueryEscape("tier in (a,b)")); r.StatusCode != http.StatusBadRequest {
		t.Errorf("a set selector: status %d, want 400", r.StatusCode)
	}
}

func TestGetAndUnknown(t *testing.T) {
	s, get := testServer(t)
	var got struct {
		Kind     string
		Metadata struct{ UID string }
		Spec     struct{ NodeName string }
	}
	decode(t, get("/api/v1/namespaces/ns-0/pods/p-00"), &got)
	if got.Kind != "Pod" || got.Metadata.UID != "uid-p-00" || got.Spec.NodeName != "node-a" {
		t.Errorf("got pod %+v", got)
	}
	if r := get("/api/v1/namespaces/ns-1/pods/p-00"); r.StatusCode != http.StatusNotFound {
		t.Errorf("p-00 in the wrong namespace: status %d, want 404", r.StatusCode)
	}
	if r := get("/apis/batch/v1/jobs"); r.StatusCode != http.StatusNotFound {
		t.Errorf("jobs: status %d, want 404", r.StatusCode)
	}
	served, unknown := s.Counts()
	if unknown["GET /apis/batch/v1/jobs"] != 1 || served["get pods"] != 2 {
		t.Errorf("served %v, unknown %v; want the pods' gets and the jobs list counted", served, unknown)
	}
}

// readEvents reads watch lines until n are read or the wait is over.
func readEvents(t *testing.T, r *bufio.Reader, n int, wait time.Duration) []map[string]any {
	t.Helper()
	var out []map[string]any
	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(out) < n {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			var ev map[string]any
			if err := json.Unmarshal(line, &ev); err != nil {
				t.Errorf("watch line %q: %v", line, err)
				return
			}
			out = append(out, ev)
		}
	}()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatalf("read %d of %d watch events in %s", len(out), n, wait)
	}
	if len(out) < n {
		t.Fatalf("the watch ended after %d of %d events", len(out), n)
	}
	return out
}

func field(ev map[string]any, path ...string) string {
	var v any = ev
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = m[p]
	}
	s, _ := v.(string)
	return s
}

func TestWatchFromResourceVersion(t *testing.T) {
	s, get := testServer(t)
	var p listPage
	decode(t, get("/api/v1/pods?limit=2"), &p)
	// A change before the watch starts: the watch from the list's
	// version must still send it.
	if _, err := s.Store.Put("pods", pod("ns-0", "p-00", "node-a", map[string]string{"tier": "backend"})); err != nil {
		t.Fatal(err)
	}
	resp := get("/api/v1/pods?watch=1&allowWatchBookmarks=true&resourceVersion=" + p.Metadata.ResourceVersion)
	r := bufio.NewReader(resp.Body)
	evs := readEvents(t, r, 1, 5*time.Second)
	if evs[0]["type"] != "MODIFIED" || field(evs[0], "object", "kind") != "Pod" {
		t.Fatalf("first event %v, want the Pod MODIFIED", evs[0])
	}
	// Other collections' changes are not sent; this one's are, and
	// bookmarks while nothing happens.
	s.Store.Put("networkpolicies", map[string]any{"metadata": map[string]any{"namespace": "ns-0", "name": "c"}})
	if err := s.Store.Delete("pods", "ns-1", "p-01"); err != nil {
		t.Fatal(err)
	}
	rv2 := s.Store.Current()
	evs = readEvents(t, r, 2, 5*time.Second)
	if evs[0]["type"] != "DELETED" || field(evs[0], "object", "metadata", "resourceVersion") != fmt.Sprint(rv2) {
		t.Errorf("event %v, want p-01 DELETED at %d", evs[0], rv2)
	}
	if evs[1]["type"] != "BOOKMARK" || field(evs[1], "object", "metadata", "resourceVersion") == "" {
		t.Errorf("event %v, want a BOOKMARK with a resourceVersion", evs[1])
	}
}

func TestWatchInitialEvents(t *testing.T) {
	_, get := testServer(t)
	resp := get("/apis/networking.k8s.io/v1/networkpolicies?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan")
	evs := readEvents(t, bufio.NewReader(resp.Body), 3, 5*time.Second)
	for _, ev := range evs[:2] {
		if ev["type"] != "ADDED" {
			t.Fatalf("event %v, want ADDED", ev)
		}
	}
	if evs[2]["type"] != "BOOKMARK" || field(evs[2], "object", "metadata", "annotations", "k8s.io/initial-events-end") != "true" {
		t.Errorf("after the initial events %v, want the initial-events-end BOOKMARK", evs[2])
	}
}

func TestWatchTooOld(t *testing.T) {
	s, get := testServer(t)
	s.Store.Put("pods", pod("ns-0", "new", "node-a", nil))
	s.Store.Compact()
	resp := get("/api/v1/pods?watch=1&resourceVersion=1")
	evs := readEvents(t, bufio.NewReader(resp.Body), 1, 5*time.Second)
	if evs[0]["type"] != "ERROR" || !strings.Contains(field(evs[0], "object", "reason"), "Expired") {
		t.Errorf("event %v, want ERROR Expired (410)", evs[0])
	}
}

// A fault answers its code the times it is set for, and ends the
// watches of its path; CloseWatches ends them all.
func TestFaults(t *testing.T) {
	s, get := testServer(t)
	s.SetFault("/api/v1/pods", &Fault{Code: 403, Reason: "Forbidden", Message: "no", Times: 2})
	for i, want := range []int{403, 403, 200} {
		if r := get("/api/v1/pods"); r.StatusCode != want {
			t.Errorf("request %d: status %d, want %d", i, r.StatusCode, want)
		}
	}
	if s.Refused() != 2 {
		t.Errorf("refused %d, want 2", s.Refused())
	}
	ended := func(end func()) {
		t.Helper()
		resp := get("/api/v1/pods?watch=1&resourceVersion=" + fmt.Sprint(s.Store.Current()))
		done := make(chan struct{})
		go func() { io.Copy(io.Discard, resp.Body); close(done) }()
		end()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the watch did not end")
		}
	}
	ended(func() { s.SetDown(true) })
	if r := get("/version"); r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("down: status %d, want 503", r.StatusCode)
	}
	s.SetDown(false)
	ended(s.CloseWatches)
	s.SetFault("/api/v1/nodes", &Fault{Code: 502, Body: []byte("<html>Bad Gateway</html>")})
	if r := get("/api/v1/nodes"); r.StatusCode != 502 {
		t.Errorf("a fault with a body: status %d, want 502", r.StatusCode)
	} else if b, _ := io.ReadAll(r.Body); string(b) != "<html>Bad Gateway</html>" {
		t.Errorf("a fault with a body: got %q", b)
	}
	s.SetRaw(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/odd" {
			return false
		}
		w.WriteHeader(502)
		return true
	})
	if r := get("/odd"); r.StatusCode != 502 {
		t.Errorf("raw: status %d, want 502", r.StatusCode)
	}
}

func TestTokensAndEvents(t *testing.T) {
	s, get := testServer(t)
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil))
	if rec.Code != http.StatusUnauthorized {
		t.Errorf("without a token: status %d, want 401", rec.Code)
	}
	s.SetTokens("other")
	if r := get("/version"); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("a token no longer valid: status %d, want 401", r.StatusCode)
	}
	if got := s.Tokens(); len(got) != 2 || got[0] != "" || got[1] != "tok" {
		t.Errorf("tokens %q, want none then tok", got)
	}
	s.SetTokens("tok")
	rec = httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/api/v1/namespaces/ns-0/events", strings.NewReader(`{"reason":"X"}`))
	req.Header.Set("Authorization", "Bearer tok")
	s.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated || s.Count("create events") != 1 {
		t.Errorf("posting an Event: status %d, counted %d", rec.Code, s.Count("create events"))
	}
	if evs := s.EventBodies(); len(evs) != 1 || evs[0]["reason"] != "X" || s.Events()[0].Namespace != "ns-0" {
		t.Errorf("events %v, want the one posted to ns-0", evs)
	}
}

func TestParseRoute(t *testing.T) {
	for _, tc := range []struct {
		path string
		want route
		ok   bool
	}{
		{"/api/v1/pods", route{version: "v1", resource: "pods"}, true},
		{"/api/v1/namespaces", route{version: "v1", resource: "namespaces"}, true},
		{"/api/v1/namespaces/ns-1", route{version: "v1", resource: "namespaces", name: "ns-1"}, true},
		{"/api/v1/namespaces/ns-1/pods/p", route{version: "v1", ns: "ns-1", resource: "pods", name: "p"}, true},
		{"/api/v1/namespaces/ns-1/events", route{version: "v1", ns: "ns-1", resource: "events"}, true},
		{"/apis/discovery.k8s.io/v1/endpointslices", route{group: "discovery.k8s.io", version: "v1", resource: "endpointslices"}, true},
		{"/api/v1/nodes/n/status", route{version: "v1", resource: "nodes", name: "n", sub: "status"}, true},
		{"/api/v1/nodes/n/proxy", route{}, false},
		{"/healthz", route{}, false},
	} {
		got, ok := parseRoute(tc.path)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("parseRoute(%q) = %+v, %t; want %+v, %t", tc.path, got, ok, tc.want, tc.ok)
		}
	}
}

// A server-side apply to a status merges its conditions by type with the
// other managers' ones, leaves spec and metadata, and is watched as a
// MODIFIED; a missing object is 404, another patch type 415.
func TestStatusApply(t *testing.T) {
	s, get := testServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	patch := func(path, contentType, body string) *http.Response {
		t.Helper()
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(s.CAPEM())
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		t.Cleanup(client.CloseIdleConnections)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPatch, s.URL()+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer tok")
		req.Header.Set("Content-Type", contentType)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	if _, err := s.Store.Put("networkpolicies", map[string]any{"metadata": map[string]any{"namespace": "ns-0", "name": "a", "generation": 3},
		"spec": map[string]any{"podSelector": map[string]any{}},
		"status": map[string]any{"conditions": []any{
			map[string]any{"type": "other.example/Ready", "status": "True"},
			map[string]any{"type": "ours.example/Done", "status": "False"}}}}); err != nil {
		t.Fatal(err)
	}
	w := bufio.NewReader(get("/apis/networking.k8s.io/v1/networkpolicies?watch=1&resourceVersion=" + fmt.Sprint(s.Store.Current())).Body)
	const path = "/apis/networking.k8s.io/v1/namespaces/ns-0/networkpolicies/a/status?fieldManager=me&force=true"
	const apply = "application/apply-patch+yaml"
	r := patch(path, apply, `{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"a"},
		"status":{"conditions":[{"type":"ours.example/Done","status":"True"},{"type":"ours.example/New","status":"True"}]}}`)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("the apply: status %d", r.StatusCode)
	}
	var got struct {
		Metadata struct{ Generation int }
		Spec     map[string]any
		Status   struct {
			Conditions []struct{ Type, Status string }
		}
	}
	if err := json.Unmarshal(s.Store.Get("networkpolicies", "ns-0", "a"), &got); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got.Status.Conditions) != "[{other.example/Ready True} {ours.example/Done True} {ours.example/New True}]" ||
		got.Metadata.Generation != 3 || got.Spec == nil {
		t.Errorf("after the apply: %+v; want the other condition kept, ours replaced and added, spec and generation kept", got)
	}
	if ev := readEvents(t, w, 1, 5*time.Second)[0]; ev["type"] != "MODIFIED" {
		t.Errorf("the watch got %v, want MODIFIED", ev["type"])
	}
	if reqs := s.Requests(); !strings.Contains(string(reqs[len(reqs)-1].Body), "ours.example/New") {
		t.Errorf("the patch's body is not recorded: %q", reqs[len(reqs)-1].Body)
	}
	if n := s.Count("patch networkpolicies/status"); n != 1 {
		t.Errorf("counted %d patches, want 1", n)
	}
	if r := patch("/apis/networking.k8s.io/v1/namespaces/ns-0/networkpolicies/gone/status?fieldManager=me", apply,
		`{"metadata":{"name":"gone"},"status":{}}`); r.StatusCode != http.StatusNotFound {
		t.Errorf("a missing object: status %d, want 404", r.StatusCode)
	}
	if r := patch(path, "application/merge-patch+json", `{"status":{}}`); r.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("a merge patch: status %d, want 415", r.StatusCode)
	}
}
