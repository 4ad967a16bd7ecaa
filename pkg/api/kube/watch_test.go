package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/test/nettest"
)

// thing is a trimmed object as the agent's types are.
type thing struct {
	Metadata struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace,omitempty"`
		ResourceVersion string            `json:"resourceVersion,omitempty"`
		Labels          map[string]string `json:"labels,omitempty"`
	} `json:"metadata"`
}

func thingMeta(t *thing) Meta {
	return Meta{Namespace: t.Metadata.Namespace, Name: t.Metadata.Name, ResourceVersion: t.Metadata.ResourceVersion}
}

// fakeCollection is one collection of an API server stand-in: objects with
// resourceVersions, an event history watches replay from, compaction.
type fakeCollection struct {
	mu      sync.Mutex
	rv      int
	objects map[string]map[string]any
	history []fakeEvent
	// compacted: a watch from a version below it gets 410.
	compacted int
	// goneAsStatus answers an expired watch with HTTP 410 instead of an
	// ERROR event in a 200 stream (API servers do both).
	goneAsStatus bool
	// watchers are woken on every change.
	wake    chan struct{}
	lists   int
	watches []string // resourceVersions watched from
	// down makes every request fail with 503 ("the server is away").
	down bool
}

type fakeEvent struct {
	rv  int
	typ string
	obj map[string]any
}

func newFakeCollection() *fakeCollection {
	return &fakeCollection{objects: map[string]map[string]any{}, wake: make(chan struct{})}
}

// set adds or updates ns/name with labels; del removes it.
func (c *fakeCollection) set(ns, name string, labels map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rv++
	key := ns + "/" + name
	typ := "MODIFIED"
	if _, ok := c.objects[key]; !ok {
		typ = "ADDED"
	}
	obj := map[string]any{"metadata": map[string]any{
		"name": name, "namespace": ns, "resourceVersion": strconv.Itoa(c.rv), "labels": labels,
		"uid": "u-" + name, "managedFields": []any{map[string]any{"manager": "kubectl"}},
	}, "spec": map[string]any{"unused": strings.Repeat("x", 100)}}
	c.objects[key] = obj
	c.history = append(c.history, fakeEvent{c.rv, typ, obj})
	c.notify()
}

func (c *fakeCollection) del(ns, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rv++
	key := ns + "/" + name
	obj := c.objects[key]
	delete(c.objects, key)
	c.history = append(c.history, fakeEvent{c.rv, "DELETED", obj})
	c.notify()
}

// bookmark sends a BOOKMARK at a new version to the open watches.
func (c *fakeCollection) bookmark() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rv++
	c.history = append(c.history, fakeEvent{c.rv, "BOOKMARK", map[string]any{
		"kind": "Thing", "metadata": map[string]any{"resourceVersion": strconv.Itoa(c.rv)},
	}})
	c.notify()
}

// compact forgets the history: watches from before now get 410.
func (c *fakeCollection) compact() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.compacted = c.rv + 1
	c.history = nil
	c.notify()
}

func (c *fakeCollection) setDown(down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = down
	c.notify()
}

func (c *fakeCollection) notify() {
	close(c.wake)
	c.wake = make(chan struct{})
}

func (c *fakeCollection) counts() (lists int, watches []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lists, slices.Clone(c.watches)
}

func (c *fakeCollection) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	c.mu.Lock()
	if c.down {
		c.mu.Unlock()
		writeStatus(w, 503, "ServiceUnavailable", "etcd is away")
		return
	}
	if q.Get("watch") == "" {
		c.lists++
		var items []any
		keys := make([]string, 0, len(c.objects))
		for k := range c.objects {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		// Pages of "limit", the continue token the offset.
		limit, _ := strconv.Atoi(q.Get("limit"))
		off, _ := strconv.Atoi(q.Get("continue"))
		end := len(keys)
		if limit > 0 && off+limit < end {
			end = off + limit
		}
		for _, k := range keys[off:end] {
			items = append(items, c.objects[k])
		}
		cont := ""
		if end < len(keys) {
			cont = strconv.Itoa(end)
		}
		rv := c.rv
		c.mu.Unlock()
		json.NewEncoder(w).Encode(map[string]any{
			"kind": "ThingList", "metadata": map[string]any{"resourceVersion": strconv.Itoa(rv), "continue": cont},
			"items": items,
		})
		return
	}
	from, _ := strconv.Atoi(q.Get("resourceVersion"))
	c.watches = append(c.watches, q.Get("resourceVersion"))
	if q.Get("allowWatchBookmarks") != "true" {
		c.mu.Unlock()
		http.Error(w, "want bookmarks", 400)
		return
	}
	if from < c.compacted-1 {
		gone := c.goneAsStatus
		c.mu.Unlock()
		if gone {
			writeStatus(w, 410, "Expired", "too old resource version")
			return
		}
		w.WriteHeader(200)
		json.NewEncoder(w).Encode(map[string]any{"type": "ERROR", "object": map[string]any{
			"kind": "Status", "code": 410, "reason": "Expired", "message": fmt.Sprintf("too old resource version: %d", from),
		}})
		return
	}
	c.mu.Unlock()
	w.WriteHeader(200)
	w.(http.Flusher).Flush()
	enc := json.NewEncoder(w)
	secs, _ := strconv.Atoi(q.Get("timeoutSeconds"))
	end := time.After(time.Duration(secs) * time.Second)
	for {
		c.mu.Lock()
		if c.down {
			c.mu.Unlock()
			return
		}
		var send []fakeEvent
		for _, e := range c.history {
			if e.rv > from {
				send = append(send, e)
			}
		}
		wake := c.wake
		c.mu.Unlock()
		for _, e := range send {
			enc.Encode(map[string]any{"type": e.typ, "object": e.obj})
			from = e.rv
		}
		w.(http.Flusher).Flush()
		select {
		case <-wake:
		case <-end:
			return
		case <-r.Context().Done():
			return
		}
	}
}

// runReflector starts a reflector of things against h.
func runReflector(t *testing.T, cfg Config, logs io.Writer) *Reflector[thing] {
	t.Helper()
	if logs == nil {
		logs = io.Discard
	}
	r, err := NewReflector(ReflectorOptions[thing]{
		Client:     newClient(t, cfg),
		Kind:       Kind{Group: "example.com", Version: "v1", Resource: "things"},
		Meta:       thingMeta,
		Log:        slog.New(slog.NewTextHandler(logs, nil)),
		Backoff:    20 * time.Millisecond,
		MaxBackoff: 100 * time.Millisecond,
		PageSize:   2,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func labelsOf(r *Reflector[thing]) map[string]string {
	out := map[string]string{}
	for k, v := range r.List() {
		out[k] = v.Metadata.Labels["app"]
	}
	return out
}

func sameLabels(r *Reflector[thing], want map[string]string) func() bool {
	return func() bool {
		got := labelsOf(r)
		if len(got) != len(want) {
			return false
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	}
}

func thingServer(t *testing.T, c *fakeCollection) Config {
	_, cfg := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/example.com/v1/things" {
			http.NotFound(w, r)
			return
		}
		c.ServeHTTP(w, r)
	})
	return cfg
}

func TestReflectorListThenWatch(t *testing.T) {
	c := newFakeCollection()
	for i := range 5 {
		c.set("ns", fmt.Sprintf("t%d", i), map[string]string{"app": "a"})
	}
	r := runReflector(t, thingServer(t, c), nil)
	select {
	case <-r.Synced():
	case <-time.After(5 * time.Second):
		t.Fatal("not synced")
	}
	// Five objects in pages of two: all of them, from three requests.
	if got := r.Len(); got != 5 || !r.HasSynced() {
		t.Fatalf("after list: got %d objects (synced %v), want 5", got, r.HasSynced())
	}
	c.set("ns", "t1", map[string]string{"app": "b"})
	c.set("other", "new", map[string]string{"app": "c"})
	c.del("ns", "t4")
	eventually(t, "the watch's events", sameLabels(r, map[string]string{
		"ns/t0": "a", "ns/t1": "b", "ns/t2": "a", "ns/t3": "a", "other/new": "c",
	}))
	lists, watches := c.counts()
	if lists != 3 || len(watches) != 1 || watches[0] != "5" {
		t.Errorf("requests: got %d list pages and watches from %v, want 3 pages and one watch from 5", lists, watches)
	}
	if r.Err() != nil {
		t.Errorf("Err: got %v, want nil", r.Err())
	}
}

func TestReflectorTrimsToTheType(t *testing.T) {
	c := newFakeCollection()
	c.set("ns", "t0", map[string]string{"app": "a"})
	r := runReflector(t, thingServer(t, c), nil)
	eventually(t, "sync", r.HasSynced)
	got, ok := r.Get("ns/t0")
	if !ok {
		t.Fatal("ns/t0 not cached")
	}
	b, _ := json.Marshal(got)
	if strings.Contains(string(b), "managedFields") || strings.Contains(string(b), "unused") {
		t.Errorf("cached object kept fields its type does not have: %s", b)
	}
}

func TestReflectorResumesAfterWatchEnds(t *testing.T) {
	c := newFakeCollection()
	c.set("ns", "t0", map[string]string{"app": "a"})
	cfg := thingServer(t, c)
	r, err := NewReflector(ReflectorOptions[thing]{
		Client: newClient(t, cfg), Kind: Kind{Group: "example.com", Version: "v1", Resource: "things"},
		Meta: thingMeta, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		WatchTimeout: time.Second, Backoff: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	eventually(t, "sync", r.HasSynced)
	c.set("ns", "t1", map[string]string{"app": "b"})
	eventually(t, "t1", sameLabels(r, map[string]string{"ns/t0": "a", "ns/t1": "b"}))
	// The server ends the watch after timeoutSeconds (1): the next one
	// starts where the last event left it, without a list.
	eventually(t, "a second watch", func() bool { _, w := c.counts(); return len(w) >= 2 })
	lists, watches := c.counts()
	if lists != 1 || watches[0] != "1" || watches[1] != "2" {
		t.Errorf("got %d lists and watches from %v, want 1 list, then watches from 1 and 2", lists, watches)
	}
}

func TestReflectorBookmark(t *testing.T) {
	c := newFakeCollection()
	c.set("ns", "t0", map[string]string{"app": "a"})
	srv, cfg := newServer(t, func(w http.ResponseWriter, r *http.Request) { c.ServeHTTP(w, r) })
	r := runReflector(t, cfg, nil)
	eventually(t, "sync", r.HasSynced)
	eventually(t, "the watch", func() bool { _, w := c.counts(); return len(w) == 1 })
	c.bookmark() // rv 2
	eventually(t, "the bookmark's version", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.rv == "2"
	})
	// The watch breaks; the next one starts from the bookmark, not from
	// the list's version, and there is no list again.
	srv.CloseClientConnections()
	eventually(t, "a second watch", func() bool { _, w := c.counts(); return len(w) == 2 })
	lists, watches := c.counts()
	if lists != 1 || watches[1] != "2" {
		t.Errorf("got %d lists and watches from %v, want 1 list and the second watch from 2", lists, watches)
	}
}

func TestReflectorRelistsOnGone(t *testing.T) {
	for _, asStatus := range []bool{false, true} {
		t.Run(fmt.Sprintf("http410=%v", asStatus), func(t *testing.T) {
			c := newFakeCollection()
			c.goneAsStatus = asStatus
			c.set("ns", "t0", map[string]string{"app": "a"})
			c.set("ns", "t1", map[string]string{"app": "a"})
			srv, cfg := newServer(t, func(w http.ResponseWriter, r *http.Request) { c.ServeHTTP(w, r) })
			r := runReflector(t, cfg, nil)
			eventually(t, "sync", r.HasSynced)
			eventually(t, "the watch", func() bool { _, w := c.counts(); return len(w) == 1 })
			// While no watch runs, t1 goes and t2 comes, and the history
			// of it is compacted away: only a new list can tell.
			c.setDown(true)
			srv.CloseClientConnections()
			c.del("ns", "t1")
			c.set("ns", "t2", map[string]string{"app": "b"})
			c.compact()
			c.setDown(false)
			eventually(t, "the list after 410", sameLabels(r, map[string]string{"ns/t0": "a", "ns/t2": "b"}))
			if lists, _ := c.counts(); lists != 2 {
				t.Errorf("lists: got %d, want 2", lists)
			}
		})
	}
}

func TestReflectorKeepsCacheWhileServerGone(t *testing.T) {
	c := newFakeCollection()
	c.set("ns", "t0", map[string]string{"app": "a"})
	c.set("ns", "t1", map[string]string{"app": "b"})
	// A listener of our own, so that the server can go away (connections
	// refused) and come back on the same address.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	start := func(ln net.Listener) *httptest.Server {
		srv := httptest.NewUnstartedServer(c)
		srv.Listener.Close()
		srv.Listener = ln
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		srv.StartTLS()
		return srv
	}
	srv := start(ln)
	cfg := Config{Server: srv.URL, CAPEM: serverCA(srv), Token: "tok"}
	logs := &nettest.LockedBuffer{}
	r := runReflector(t, cfg, logs)
	eventually(t, "sync", r.HasSynced)
	eventually(t, "the watch", func() bool { _, w := c.counts(); return len(w) == 1 })

	// Gone: open streams cut, connections refused.
	srv.CloseClientConnections()
	srv.Close()
	// Failures pile up (the backoff is 20-100 ms); the cache stays.
	eventually(t, "an error", func() bool { return r.Err() != nil })
	time.Sleep(500 * time.Millisecond)
	if !sameLabels(r, map[string]string{"ns/t0": "a", "ns/t1": "b"})() || !r.HasSynced() {
		t.Errorf("with the server gone: cache %v (synced %v), want the last one kept", labelsOf(r), r.HasSynced())
	}
	if n := strings.Count(logs.String(), "keeping the last cache"); n != 1 {
		t.Errorf("error lines while the server is gone: got %d, want 1 (rate-limited):\n%s", n, logs.String())
	}
	// Changes made meanwhile arrive once it is back.
	c.set("ns", "t1", map[string]string{"app": "changed"})
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	srv2 := start(ln2)
	defer func() {
		// Ends the open watch, which Close would wait for.
		c.setDown(true)
		srv2.Close()
	}()
	eventually(t, "catching up", sameLabels(r, map[string]string{"ns/t0": "a", "ns/t1": "changed"}))
	eventually(t, "the error cleared", func() bool { return r.Err() == nil })
	if !strings.Contains(logs.String(), "API server reachable again") {
		t.Errorf("no line saying the server is back:\n%s", logs.String())
	}
}

// Retry ends the wait after a failure: with a backoff of a minute, a
// server that is back is seen at once.
func TestReflectorRetryCutsTheBackoff(t *testing.T) {
	c := newFakeCollection()
	c.setDown(true)
	r, err := NewReflector(ReflectorOptions[thing]{
		Client: newClient(t, thingServer(t, c)),
		Kind:   Kind{Group: "example.com", Version: "v1", Resource: "things"},
		Meta:   thingMeta, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Backoff: time.Minute, MaxBackoff: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { c.setDown(true); cancel(); <-done })
	eventually(t, "an error", func() bool { return r.Err() != nil })
	c.setDown(false)
	time.Sleep(200 * time.Millisecond)
	if r.HasSynced() {
		t.Fatal("synced before the backoff ended, without Retry")
	}
	start := time.Now()
	r.Retry()
	eventually(t, "sync after Retry", r.HasSynced)
	t.Logf("synced %v after Retry", time.Since(start))
}

func TestReflectorNotSyncedWithoutServer(t *testing.T) {
	c := newFakeCollection()
	c.setDown(true)
	r := runReflector(t, thingServer(t, c), nil)
	eventually(t, "an error", func() bool { return r.Err() != nil })
	if r.HasSynced() {
		t.Error("synced without a list")
	}
	c.setDown(false)
	eventually(t, "sync", r.HasSynced)
}

func TestReflectorForbiddenNamesTheResource(t *testing.T) {
	_, cfg := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		writeStatus(w, 403, "Forbidden", `things.example.com is forbidden: User "x" cannot list resource "things"`)
	})
	r := runReflector(t, cfg, nil)
	eventually(t, "an error", func() bool { return r.Err() != nil })
	if err := r.Err(); !strings.Contains(err.Error(), `grant verb "list" on resource "things" in API group "example.com"`) {
		t.Errorf("got %v, want the RBAC rule to grant", err)
	}
}

// change is one OnChange call: "+key" added, "~key" replaced, "-key"
// deleted.
func change(old, new *thing) string {
	switch {
	case old == nil:
		return "+" + thingMeta(new).Key()
	case new == nil:
		return "-" + thingMeta(old).Key()
	case thingMeta(old).Key() != thingMeta(new).Key():
		return "?" + thingMeta(old).Key() + "→" + thingMeta(new).Key()
	}
	return "~" + thingMeta(new).Key()
}

// OnChange says what changed, object by object: the list's objects as
// added, each event as what it did to the cache, and after a relist only
// the difference to the cache before it.
func TestReflectorOnChange(t *testing.T) {
	c := newFakeCollection()
	c.set("ns", "t0", map[string]string{"app": "a"})
	c.set("ns", "t1", map[string]string{"app": "a"})
	c.set("ns", "t2", map[string]string{"app": "a"})
	var mu sync.Mutex
	var got []string
	srv, cfg := newServer(t, func(w http.ResponseWriter, r *http.Request) { c.ServeHTTP(w, r) })
	r, err := NewReflector(ReflectorOptions[thing]{
		Client: newClient(t, cfg), Kind: Kind{Group: "example.com", Version: "v1", Resource: "things"},
		Meta: thingMeta, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Backoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		OnChange: func(old, new *thing) {
			if old != nil && new != nil && old.Metadata.Labels["app"] == new.Metadata.Labels["app"] {
				t.Errorf("%s: replaced by an object that did not change", change(old, new))
			}
			mu.Lock()
			got = append(got, change(old, new))
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	calls := func(n int) []string {
		t.Helper()
		eventually(t, fmt.Sprintf("%d calls", n), func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= n })
		time.Sleep(50 * time.Millisecond) // no more than n
		mu.Lock()
		defer mu.Unlock()
		out := slices.Clone(got)
		got = nil
		return out
	}
	sorted := func(s []string) []string { slices.Sort(s); return s }

	if cs := sorted(calls(3)); !slices.Equal(cs, []string{"+ns/t0", "+ns/t1", "+ns/t2"}) {
		t.Errorf("first list: got calls %v, want the three objects added", cs)
	}
	eventually(t, "the watch", func() bool { _, w := c.counts(); return len(w) == 1 })
	c.set("ns", "t0", map[string]string{"app": "b"})
	c.set("ns", "t3", map[string]string{"app": "a"})
	c.del("ns", "t1")
	if cs := calls(3); !slices.Equal(cs, []string{"~ns/t0", "+ns/t3", "-ns/t1"}) {
		t.Errorf("watch events: got calls %v, want [~ns/t0 +ns/t3 -ns/t1]", cs)
	}
	// A relist after 410: t2 changed, t3 deleted, t4 added meanwhile; t0
	// comes back unchanged and is not reported.
	c.setDown(true)
	srv.CloseClientConnections()
	c.set("ns", "t2", map[string]string{"app": "c"})
	c.del("ns", "t3")
	c.set("ns", "t4", map[string]string{"app": "a"})
	c.compact()
	c.setDown(false)
	if cs := sorted(calls(3)); !slices.Equal(cs, []string{"+ns/t4", "-ns/t3", "~ns/t2"}) {
		t.Errorf("relist: got calls %v, want [+ns/t4 -ns/t3 ~ns/t2]", cs)
	}
	if lists, _ := c.counts(); lists != 2 {
		t.Errorf("lists: got %d, want 2", lists)
	}
}
