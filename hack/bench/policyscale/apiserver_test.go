package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
)

// testServer serves a small cluster over HTTPS and returns a client that
// trusts it, sending the token.
func testServer(t *testing.T) (*fakeapi.Server, *cluster, func(path string) *http.Response) {
	t.Helper()
	c, err := newCluster(clusters["1k"])
	if err != nil {
		t.Fatal(err)
	}
	cert, caPEM, err := fakeapi.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	api := fakeapi.NewTest(t, fakeapi.Options{Kinds: servedKinds(true), Token: "tok", Cert: &cert, Bookmark: 50 * time.Millisecond, Log: slog.New(slog.DiscardHandler)})
	if err := loadCluster(api.Store, c); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	t.Cleanup(client.CloseIdleConnections)
	get := func(path string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, api.URL()+path, nil)
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	return api, c, get
}

type listPage struct {
	Kind     string `json:"kind"`
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
	Items []struct {
		Metadata objectMeta `json:"metadata"`
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
	_, c, get := testServer(t)
	seen := map[string]bool{}
	var rv string
	cont := ""
	pages := 0
	for {
		q := url.Values{"limit": {"300"}}
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
			if seen[k] {
				t.Errorf("%s listed twice", k)
			}
			seen[k] = true
		}
		if cont = p.Metadata.Continue; cont == "" {
			break
		}
	}
	if len(seen) != len(c.Pods) || pages != (len(c.Pods)+299)/300 {
		t.Errorf("got %d pods in %d pages, want %d in %d", len(seen), pages, len(c.Pods), (len(c.Pods)+299)/300)
	}
}

func TestListSelectors(t *testing.T) {
	_, c, get := testServer(t)
	var p listPage
	decode(t, get("/api/v1/pods?fieldSelector="+url.QueryEscape("spec.nodeName="+nodeName)), &p)
	if len(p.Items) != c.spec.Local {
		t.Errorf("spec.nodeName=%s: got %d pods, want %d", nodeName, len(p.Items), c.spec.Local)
	}
	var q listPage
	decode(t, get("/api/v1/namespaces/ns-0001/pods?labelSelector="+url.QueryEscape("tier=frontend")), &q)
	if want := c.spec.podsPerNS() / 2; len(q.Items) != want {
		t.Errorf("ns-0001 tier=frontend: got %d pods, want %d", len(q.Items), want)
	}
	for _, it := range q.Items {
		if it.Metadata.Namespace != "ns-0001" || it.Metadata.Labels["tier"] != "frontend" {
			t.Errorf("got %s/%s %v", it.Metadata.Namespace, it.Metadata.Name, it.Metadata.Labels)
		}
	}
	var s listPage
	decode(t, get("/apis/networking.k8s.io/v1/networkpolicies"), &s)
	if len(s.Items) != c.spec.Policies {
		t.Errorf("got %d policies, want %d", len(s.Items), c.spec.Policies)
	}
}

func TestGetAndUnknown(t *testing.T) {
	api, c, get := testServer(t)
	p := c.localPod(0)
	var got pod
	decode(t, get("/api/v1/namespaces/"+p.Metadata.Namespace+"/pods/"+p.Metadata.Name), &got)
	if got.Metadata.UID != p.Metadata.UID || got.Spec.NodeName != nodeName {
		t.Errorf("got pod %+v, want %s on %s", got.Metadata, p.Metadata.UID, nodeName)
	}
	var n node
	decode(t, get("/api/v1/nodes/"+nodeName), &n)
	if n.Spec.PodCIDR == "" {
		t.Errorf("node %s without podCIDR", nodeName)
	}
	if r := get("/apis/apps/v1/daemonsets"); r.StatusCode != http.StatusNotFound {
		t.Errorf("daemonsets: status %d, want 404", r.StatusCode)
	}
	_, unknown := api.Counts()
	if unknown["GET /apis/apps/v1/daemonsets"] != 1 {
		t.Errorf("unknown requests %v, want the daemonsets list counted", unknown)
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
	api, c, get := testServer(t)
	var p listPage
	decode(t, get("/apis/discovery.k8s.io/v1/endpointslices?limit=10"), &p)
	// A change before the watch starts: the watch from the list's
	// version must still send it.
	ch, err := c.event(evEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.Store.Put(ch.resource, ch.obj); err != nil {
		t.Fatal(err)
	}
	resp := get("/apis/discovery.k8s.io/v1/endpointslices?watch=1&allowWatchBookmarks=true&resourceVersion=" + p.Metadata.ResourceVersion)
	r := bufio.NewReader(resp.Body)
	evs := readEvents(t, r, 1, 5*time.Second)
	if evs[0]["type"] != "MODIFIED" || field(evs[0], "object", "kind") != "EndpointSlice" {
		t.Fatalf("first event %v, want the EndpointSlice MODIFIED", evs[0])
	}
	// Other collections' changes are not sent; this one's are, and
	// bookmarks while nothing happens.
	pc, _ := c.event(evLabel)
	api.Store.Put(pc.resource, pc.obj)
	ch2, _ := c.event(evEndpoint)
	rv2, _ := api.Store.Put(ch2.resource, ch2.obj)
	evs = readEvents(t, r, 2, 5*time.Second)
	if evs[0]["type"] != "MODIFIED" || field(evs[0], "object", "metadata", "resourceVersion") != fmt.Sprint(rv2) {
		t.Errorf("event %v, want the second EndpointSlice change at %d", evs[0], rv2)
	}
	if evs[1]["type"] != "BOOKMARK" || field(evs[1], "object", "metadata", "resourceVersion") == "" {
		t.Errorf("event %v, want a BOOKMARK with a resourceVersion", evs[1])
	}
}

func TestWatchInitialEvents(t *testing.T) {
	_, c, get := testServer(t)
	resp := get("/apis/networking.k8s.io/v1/networkpolicies?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan")
	evs := readEvents(t, bufio.NewReader(resp.Body), c.spec.Policies+1, 5*time.Second)
	for _, ev := range evs[:c.spec.Policies] {
		if ev["type"] != "ADDED" {
			t.Fatalf("event %v, want ADDED", ev)
		}
	}
	last := evs[c.spec.Policies]
	if last["type"] != "BOOKMARK" || field(last, "object", "metadata", "annotations", "k8s.io/initial-events-end") != "true" {
		t.Errorf("after the initial events %v, want the initial-events-end BOOKMARK", last)
	}
}
