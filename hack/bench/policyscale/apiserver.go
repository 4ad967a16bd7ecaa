package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// apiServer is a fake Kubernetes API server over HTTPS: list (with limit
// and continue), watch (from a resourceVersion, with bookmarks and the
// streaming list's initial events) and get of the collections in kinds,
// POST of Events, and the discovery documents a client may ask for. Any
// other request is logged and answered 404, so that an agent asking for
// something new shows in the report instead of hanging.
type apiServer struct {
	store    *store
	token    string
	bookmark time.Duration // between BOOKMARKs on a watch that asks for them
	log      *slog.Logger

	mu       sync.Mutex // guards the counters
	requests map[string]int
	unknown  map[string]int
	events   int
}

func newAPIServer(st *store, token string, log *slog.Logger) *apiServer {
	return &apiServer{store: st, token: token, bookmark: 20 * time.Second, log: log,
		requests: map[string]int{}, unknown: map[string]int{}}
}

// serve listens on addr with cert until ctx ends; it returns the address.
func (a *apiServer) serve(ctx context.Context, addr string, cert tls.Certificate) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listening for the fake API server: %w", err)
	}
	srv := &http.Server{Handler: a, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}},
		ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelDebug),
		BaseContext: func(net.Listener) context.Context { return ctx }}
	go srv.ServeTLS(ln, "", "")
	go func() { <-ctx.Done(); srv.Close() }()
	return ln.Addr().String(), nil
}

func (a *apiServer) count(m map[string]int, k string) {
	a.mu.Lock()
	m[k]++
	a.mu.Unlock()
}

// counts is a copy of the request counters: by "verb resource", the
// unknown paths, and the Events posted.
func (a *apiServer) counts() (requests, unknown map[string]int, events int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.requests), maps.Clone(a.unknown), a.events
}

// route is a request's path, read: /api/v1/…, /apis/GROUP/VERSION/…, with
// an optional namespaces/NS/ before the resource and a name after it.
type route struct {
	group, version, ns, resource, name string
}

func parseRoute(path string) (route, bool) {
	seg := strings.Split(strings.Trim(path, "/"), "/")
	var r route
	switch {
	case len(seg) >= 3 && seg[0] == "api":
		r.version, seg = seg[1], seg[2:]
	case len(seg) >= 4 && seg[0] == "apis":
		r.group, r.version, seg = seg[1], seg[2], seg[3:]
	default:
		return r, false
	}
	if seg[0] == "namespaces" && len(seg) >= 3 {
		r.ns, seg = seg[1], seg[2:]
	}
	r.resource = seg[0]
	switch len(seg) {
	case 1:
	case 2:
		r.name = seg[1]
	default:
		return r, false
	}
	return r, true
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Header.Get("Authorization") != "Bearer "+a.token {
		a.count(a.requests, "unauthorized")
		writeStatus(w, http.StatusUnauthorized, "Unauthorized", "bad or missing bearer token")
		return
	}
	switch req.URL.Path {
	case "/version":
		a.count(a.requests, "get version")
		writeJSON(w, http.StatusOK, map[string]string{"major": "1", "minor": "34", "gitVersion": "v1.34.0", "platform": "linux/amd64"})
		return
	case "/api":
		a.count(a.requests, "get api")
		writeJSON(w, http.StatusOK, map[string]any{"kind": "APIVersions", "versions": []string{"v1"},
			"serverAddressByClientCIDRs": []map[string]string{{"clientCIDR": "0.0.0.0/0", "serverAddress": req.Host}}})
		return
	case "/apis":
		a.count(a.requests, "get apis")
		var groups []map[string]any
		for _, g := range []string{"discovery.k8s.io", "networking.k8s.io"} {
			gv := map[string]string{"groupVersion": g + "/v1", "version": "v1"}
			groups = append(groups, map[string]any{"name": g, "versions": []any{gv}, "preferredVersion": gv})
		}
		writeJSON(w, http.StatusOK, map[string]any{"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
		return
	}
	r, ok := parseRoute(req.URL.Path)
	k, known := kinds[r.resource]
	switch {
	case ok && r.resource == "events" && req.Method == http.MethodPost && r.name == "":
		a.postEvent(w, req)
	case !ok || !known || k.group != r.group || k.version != r.version || (r.ns != "" && !k.namespaced):
		a.notFound(w, req)
	case req.Method != http.MethodGet:
		a.notFound(w, req)
	case r.name != "":
		a.get(w, r, k)
	case isWatch(req):
		a.watch(w, req, r, k)
	default:
		a.list(w, req, r, k)
	}
}

func isWatch(req *http.Request) bool {
	v := req.URL.Query().Get("watch")
	return v == "1" || v == "true"
}

func (a *apiServer) notFound(w http.ResponseWriter, req *http.Request) {
	k := req.Method + " " + req.URL.Path
	a.count(a.unknown, k)
	a.log.Info("fake API server: unknown request, answered 404", "request", k, "query", req.URL.RawQuery)
	writeStatus(w, http.StatusNotFound, "NotFound", "the fake API server does not serve "+k)
}

func (a *apiServer) postEvent(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil || !json.Valid(body) {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "an Event must be JSON")
		return
	}
	a.mu.Lock()
	a.events++
	a.requests["create events"]++
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(body)
}

func (a *apiServer) get(w http.ResponseWriter, r route, k kindInfo) {
	a.count(a.requests, "get "+k.resource)
	ns := r.ns
	if r.resource == "namespaces" {
		ns = ""
	}
	o := a.store.get(k.resource, ns, r.name)
	if o == nil {
		writeStatus(w, http.StatusNotFound, "NotFound", fmt.Sprintf("%s %q not found", k.resource, r.name))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(withKind(o.raw, k))
}

// withKind is raw with the kind and apiVersion a single object carries
// (a list's items do not).
func withKind(raw []byte, k kindInfo) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"kind":%q,"apiVersion":%q,`, k.kind, k.apiVersion())
	b.Write(raw[1:])
	return b.Bytes()
}

func selectorOf(req *http.Request, r route) (selector, error) {
	q := req.URL.Query()
	return newSelector(r.ns, q.Get("fieldSelector"), q.Get("labelSelector"))
}

// continueToken is where the next page of a list starts, and the
// resourceVersion the list reports on every page (its first page's).
type continueToken struct {
	RV    uint64 `json:"rv"`
	After string `json:"after"`
}

func (a *apiServer) list(w http.ResponseWriter, req *http.Request, r route, k kindInfo) {
	a.count(a.requests, "list "+k.resource)
	sel, err := selectorOf(req, r)
	if err != nil {
		a.log.Error("fake API server: a list asks what it cannot answer", "err", err, "query", req.URL.RawQuery)
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	q := req.URL.Query()
	limit, _ := strconv.Atoi(q.Get("limit"))
	var tok continueToken
	if c := q.Get("continue"); c != "" {
		b, err := base64.RawURLEncoding.DecodeString(c)
		if err != nil || json.Unmarshal(b, &tok) != nil {
			writeStatus(w, http.StatusBadRequest, "BadRequest", "malformed continue token")
			return
		}
	}
	objs, rv, more := a.store.page(k.resource, sel, tok.After, limit)
	if tok.RV != 0 {
		rv = tok.RV
	}
	cont := ""
	if more {
		b, _ := json.Marshal(continueToken{RV: rv, After: objs[len(objs)-1].key()})
		cont = base64.RawURLEncoding.EncodeToString(b)
	}
	w.Header().Set("Content-Type", "application/json")
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"%d"`, k.kind+"List", k.apiVersion(), rv)
	if cont != "" {
		fmt.Fprintf(&b, `,"continue":%q`, cont)
	}
	b.WriteString(`},"items":[`)
	w.Write(b.Bytes())
	for i, o := range objs {
		if i > 0 {
			w.Write([]byte{','})
		}
		w.Write(o.raw)
	}
	w.Write([]byte("]}\n"))
}

// watch streams the collection's changes as JSON watch events, one per
// line, from the resourceVersion asked for: after it (a number), or the
// whole collection as ADDED first ("" or "0", or sendInitialEvents, then
// ended by a BOOKMARK marked k8s.io/initial-events-end).
func (a *apiServer) watch(w http.ResponseWriter, req *http.Request, r route, k kindInfo) {
	a.count(a.requests, "watch "+k.resource)
	sel, err := selectorOf(req, r)
	if err != nil {
		a.log.Error("fake API server: a watch asks what it cannot answer", "err", err, "query", req.URL.RawQuery)
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	q := req.URL.Query()
	bookmarks := q.Get("allowWatchBookmarks") == "true"
	initial := q.Get("sendInitialEvents") == "true"
	timeout := 30 * time.Minute
	if s, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && s > 0 {
		timeout = time.Duration(s) * time.Second
	}
	ctx, cancel := context.WithTimeout(req.Context(), timeout)
	defer cancel()
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	ew := &eventWriter{w: w, k: k}

	var from uint64
	rvParam := q.Get("resourceVersion")
	if initial || rvParam == "" || rvParam == "0" {
		objs, rv, _ := a.store.page(k.resource, sel, "", 0)
		for _, o := range objs {
			ew.event("ADDED", o.raw)
		}
		from = rv
		if initial {
			ew.bookmark(rv, true)
		}
	} else if from, err = strconv.ParseUint(rvParam, 10, 64); err != nil {
		ew.status(http.StatusBadRequest, "BadRequest", "malformed resourceVersion "+rvParam)
		return
	}
	tick := time.NewTicker(a.bookmark)
	defer tick.Stop()
	hint := 0
	for {
		entries, next, changed, gone := a.store.since(from, hint)
		if gone {
			ew.status(http.StatusGone, "Expired", fmt.Sprintf("too old resource version: %d", from))
			flush(flusher)
			return
		}
		hint = next
		for _, e := range entries {
			if e.resource == k.resource && sel.matches(e.obj) {
				ew.event(e.typ, e.obj.raw)
			}
			from = e.obj.rv
		}
		if ew.err != nil {
			return
		}
		flush(flusher)
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C:
			if bookmarks {
				ew.bookmark(a.store.current(), false)
				flush(flusher)
			}
		}
	}
}

func flush(f http.Flusher) {
	if f != nil {
		f.Flush()
	}
}

// eventWriter writes watch events; err is the first write's failure.
type eventWriter struct {
	w   io.Writer
	k   kindInfo
	err error
}

func (e *eventWriter) write(b []byte) {
	if e.err == nil {
		_, e.err = e.w.Write(b)
	}
}

func (e *eventWriter) event(typ string, raw []byte) {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"type":%q,"object":`, typ)
	b.Write(withKind(raw, e.k))
	b.WriteString("}\n")
	e.write(b.Bytes())
}

func (e *eventWriter) bookmark(rv uint64, initialEnd bool) {
	ann := ""
	if initialEnd {
		ann = `,"annotations":{"k8s.io/initial-events-end":"true"}`
	}
	e.write(fmt.Appendf(nil, `{"type":"BOOKMARK","object":{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"%d"%s}}}`+"\n",
		e.k.kind, e.k.apiVersion(), rv, ann))
}

func (e *eventWriter) status(code int, reason, msg string) {
	b, _ := json.Marshal(map[string]any{"type": "ERROR", "object": statusBody(code, reason, msg)})
	e.write(append(b, '\n'))
}

func statusBody(code int, reason, msg string) map[string]any {
	return map[string]any{"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": msg, "reason": reason, "code": code}
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	writeJSON(w, code, statusBody(code, reason, msg))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// sortedCounts renders counters as "k=n" in key order, for the report.
func sortedCounts(m map[string]int) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
