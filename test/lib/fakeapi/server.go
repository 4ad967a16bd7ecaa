// Package fakeapi is the one Kubernetes API server stand-in of the tests
// and the policy-scale benchmark: typed objects in a store with one
// resourceVersion counter; get, list (pages, label and field selectors)
// and watch (from a resourceVersion, bookmarks, the streaming list's
// initial events) of them; a server-side apply to their status (merged
// minimally); Events recorded; discovery; TLS with a CA of
// its own and a bearer token check; and the faults tests inject
// (answering a code, ending the watches, a raw handler ahead of it all).
//
// Objects are encoded once, when written, and a list is their bytes
// copied: the benchmark's 100,000 pods cost the server little, so that it
// measures the agent.
package fakeapi

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Options shape a Server; the zero value serves Kinds over TLS to any
// token on a loopback port.
type Options struct {
	// Kinds are the collections served; nil: Kinds.
	Kinds []Kind
	// Token is the one bearer token accepted; empty: any request. See
	// also SetTokens.
	Token string
	// Plain serves http instead of https.
	Plain bool
	// Cert is the server's certificate and CAPEM the CA that signed it;
	// nil: SelfSigned's.
	Cert  *tls.Certificate
	CAPEM []byte
	// ClientCAs, when set, makes a client certificate they signed
	// required.
	ClientCAs *x509.CertPool
	// Listener is where to serve; nil: a loopback port.
	Listener net.Listener
	// MaxPage is the most items a list's page holds, whatever limit the
	// client asked (zero: no bound): an API server may send fewer, and
	// clients must follow continue.
	MaxPage int
	// Bookmark is the time between BOOKMARKs on a watch that asks for
	// them; zero: 20 s.
	Bookmark time.Duration
	// NoKinds leaves kind and apiVersion out of what is sent, as a
	// minimal server does; clients must not need them.
	NoKinds bool
	// Codec is an encoding other than JSON, used when a client's Accept
	// names it first.
	Codec *Codec
	// Log is told of requests the server does not serve; nil: nothing.
	Log *slog.Logger
}

// Codec answers in an encoding other than JSON (protobuf, which the
// caller's test builds from k8s.io/api's types: this package links none).
type Codec struct {
	ContentType string
	// Encode turns a JSON object or list, with its kind, into the
	// encoding.
	Encode func(doc []byte) ([]byte, error)
	// Event is one watch event, framed: its type and its object's JSON.
	Event func(typ string, obj []byte) ([]byte, error)
}

// Server is the fake API server. Store holds its objects.
type Server struct {
	Store *Store
	o     Options
	kinds map[string]Kind
	url   string
	caPEM []byte
	srv   *http.Server
	done  chan struct{}

	mu       sync.Mutex // guards the fields below
	tokens   map[string]bool
	seen     []string
	requests []Request
	counts   map[string]int
	unknown  map[string]int
	events   []Event
	faults   map[string]*Fault // by path; "" is every path
	refused  int
	watchGen int // bumped by CloseWatches
	raw      func(http.ResponseWriter, *http.Request) bool
}

// New makes a server that does not listen yet: Start it, or use it as a
// handler.
func New(o Options) (*Server, error) {
	if o.Kinds == nil {
		o.Kinds = Kinds
	}
	if o.Bookmark == 0 {
		o.Bookmark = 20 * time.Second
	}
	s := &Server{Store: newStore(o.Kinds), o: o, kinds: map[string]Kind{}, done: make(chan struct{}),
		counts: map[string]int{}, unknown: map[string]int{}, faults: map[string]*Fault{}}
	for _, k := range o.Kinds {
		s.kinds[k.Resource] = k
	}
	if o.Token != "" {
		s.tokens = map[string]bool{o.Token: true}
	}
	if !o.Plain && o.Cert == nil {
		cert, ca, err := SelfSigned()
		if err != nil {
			return nil, err
		}
		s.o.Cert, s.o.CAPEM = &cert, ca
	}
	s.caPEM = s.o.CAPEM
	return s, nil
}

// Start serves on Options.Listener, or a loopback port.
func (s *Server) Start() error {
	ln := s.o.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return fmt.Errorf("listening for the fake API server: %w", err)
		}
	}
	// Handshakes tests fail on purpose and clients gone mid-watch are
	// noise.
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	if s.o.Plain {
		s.url = "http://" + ln.Addr().String()
		go s.srv.Serve(ln)
		return nil
	}
	s.srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*s.o.Cert}, NextProtos: []string{"h2", "http/1.1"}}
	if s.o.ClientCAs != nil {
		s.srv.TLSConfig.ClientCAs, s.srv.TLSConfig.ClientAuth = s.o.ClientCAs, tls.RequireAndVerifyClientCert
	}
	s.url = "https://" + ln.Addr().String()
	go s.srv.ServeTLS(ln, "", "")
	return nil
}

// NewTest starts a server for t, closed when t ends.
func NewTest(t testing.TB, o Options) *Server {
	t.Helper()
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Close ends the watches and stops serving.
func (s *Server) Close() {
	select {
	case <-s.done:
		return
	default:
	}
	close(s.done)
	s.Store.wake()
	if s.srv != nil {
		s.srv.Close()
	}
}

// URL is where the server serves: https://127.0.0.1:port.
func (s *Server) URL() string { return s.url }

// CAPEM is the CA the server's certificate chains to, PEM-encoded.
func (s *Server) CAPEM() []byte { return s.caPEM }

func (s *Server) count(m map[string]int, k string) {
	s.mu.Lock()
	m[k]++
	s.mu.Unlock()
}

// route is a request's path, read: /api/v1/…, /apis/GROUP/VERSION/…, with
// an optional namespaces/NS/ before the resource and a name after it.
type route struct {
	group, version, ns, resource, name string
	// sub is a subresource after the name: only "status".
	sub string
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
	case 3:
		if seg[2] != "status" {
			return r, false
		}
		r.name, r.sub = seg[1], seg[2]
	default:
		return r, false
	}
	return r, true
}

func (s *Server) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	tok := strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer ")
	rec := Request{Method: req.Method, Path: req.URL.Path, Query: req.URL.Query(), Header: req.Header.Clone()}
	if req.Method != http.MethodGet && req.Body != nil {
		// Kept for the tests' assertions, and handed on unread.
		rec.Body, _ = io.ReadAll(io.LimitReader(req.Body, 1<<20))
		req.Body = io.NopCloser(bytes.NewReader(rec.Body))
	}
	if req.TLS != nil && len(req.TLS.PeerCertificates) > 0 {
		rec.ClientCert = req.TLS.PeerCertificates[0].Subject.CommonName
	}
	s.mu.Lock()
	s.seen = append(s.seen, tok)
	s.requests = append(s.requests, rec)
	raw, tokens := s.raw, s.tokens
	authorized := tokens == nil || tokens[tok]
	s.mu.Unlock()
	if raw != nil && raw(w, req) {
		return
	}
	if !authorized {
		s.count(s.counts, "unauthorized")
		writeStatus(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
		return
	}
	if f := s.fault(req.URL.Path); f != nil {
		if f.Body != nil {
			w.WriteHeader(f.Code)
			w.Write(f.Body)
			return
		}
		writeStatus(w, f.Code, f.Reason, f.Message)
		return
	}
	switch req.URL.Path {
	case "/version":
		s.count(s.counts, "get version")
		writeJSON(w, http.StatusOK, map[string]string{"major": "1", "minor": "34", "gitVersion": "v1.34.0", "platform": "linux/amd64"})
		return
	case "/api":
		s.count(s.counts, "get api")
		writeJSON(w, http.StatusOK, map[string]any{"kind": "APIVersions", "versions": []string{"v1"},
			"serverAddressByClientCIDRs": []map[string]string{{"clientCIDR": "0.0.0.0/0", "serverAddress": req.Host}}})
		return
	case "/apis":
		s.count(s.counts, "get apis")
		groups := []map[string]any{}
		seen := map[string]bool{}
		for _, k := range s.o.Kinds {
			if k.Group == "" || seen[k.Group] {
				continue
			}
			seen[k.Group] = true
			gv := map[string]string{"groupVersion": k.APIVersion(), "version": k.Version}
			groups = append(groups, map[string]any{"name": k.Group, "versions": []any{gv}, "preferredVersion": gv})
		}
		writeJSON(w, http.StatusOK, map[string]any{"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
		return
	}
	if s.discovery(w, req) {
		return
	}
	r, ok := parseRoute(req.URL.Path)
	k, known := s.kinds[r.resource]
	switch {
	case ok && r.resource == "events" && (req.Method == http.MethodPost && r.name == "" || req.Method == http.MethodPatch && r.name != ""):
		s.event(w, req, r)
	case !ok || !known || k.Group != r.group || k.Version != r.version || (r.ns != "" && !k.Namespaced):
		s.notFound(w, req)
	case r.sub == "status" && req.Method == http.MethodPatch:
		s.patchStatus(w, req, r, k)
	case req.Method != http.MethodGet || r.sub != "":
		s.notFound(w, req)
	case r.name != "":
		s.get(w, req, r, k)
	case isWatch(req):
		s.watch(w, req, r, k)
	default:
		s.list(w, req, r, k)
	}
}

// discovery answers /api/v1 and /apis/GROUP/VERSION with the resources
// served there, 404 for a group version none is.
func (s *Server) discovery(w http.ResponseWriter, req *http.Request) bool {
	seg := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	var gv string
	switch {
	case len(seg) == 2 && seg[0] == "api":
		gv = seg[1]
	case len(seg) == 3 && seg[0] == "apis":
		gv = seg[1] + "/" + seg[2]
	default:
		return false
	}
	s.count(s.counts, "get "+req.URL.Path)
	resources := []map[string]any{}
	for _, k := range s.o.Kinds {
		if k.APIVersion() == gv {
			resources = append(resources, map[string]any{"name": k.Resource, "kind": k.Kind, "namespaced": k.Namespaced,
				"verbs": []string{"get", "list", "watch"}})
		}
	}
	if len(resources) == 0 {
		s.notFound(w, req)
		return true
	}
	writeJSON(w, http.StatusOK, map[string]any{"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
	return true
}

func isWatch(req *http.Request) bool {
	v := req.URL.Query().Get("watch")
	return v == "1" || v == "true"
}

func (s *Server) notFound(w http.ResponseWriter, req *http.Request) {
	k := req.Method + " " + req.URL.Path
	s.count(s.unknown, k)
	if s.o.Log != nil {
		s.o.Log.Info("fake API server: unknown request, answered 404", "request", k, "query", req.URL.RawQuery)
	}
	writeStatus(w, http.StatusNotFound, "NotFound", "the fake API server does not serve "+k)
}

func (s *Server) event(w http.ResponseWriter, req *http.Request, r route) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil || !json.Valid(body) {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "an Event must be JSON")
		return
	}
	verb, code := "create events", http.StatusCreated
	if req.Method == http.MethodPatch {
		verb, code = "patch events", http.StatusOK
	}
	s.mu.Lock()
	s.events = append(s.events, Event{Method: req.Method, Namespace: r.ns, Name: r.name, Body: body})
	s.counts[verb]++
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(body)
}

// codec is the encoding the request asks for first, if not JSON.
func (s *Server) codec(req *http.Request) *Codec {
	c := s.o.Codec
	if c == nil || !strings.HasPrefix(req.Header.Get("Accept"), c.ContentType) {
		return nil
	}
	return c
}

func (s *Server) get(w http.ResponseWriter, req *http.Request, r route, k Kind) {
	s.count(s.counts, "get "+k.Resource)
	ns := r.ns
	if !k.Namespaced {
		ns = ""
	}
	o := s.Store.get(k.Resource, ns, r.name)
	if o == nil {
		writeStatus(w, http.StatusNotFound, "NotFound", fmt.Sprintf("%s %q not found", k.Resource, r.name))
		return
	}
	doc := s.withKind(o.raw, k)
	if c := s.codec(req); c != nil {
		s.writeEncoded(w, c, withKind(o.raw, k))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(doc)
}

func (s *Server) writeEncoded(w http.ResponseWriter, c *Codec, doc []byte) {
	b, err := c.Encode(doc)
	if err != nil {
		writeStatus(w, http.StatusInternalServerError, "InternalError", "encoding: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", c.ContentType)
	w.Write(b)
}

// withKind is raw with the kind and apiVersion a single object carries
// (a list's items do not), unless NoKinds.
func (s *Server) withKind(raw []byte, k Kind) []byte {
	if s.o.NoKinds {
		return raw
	}
	return withKind(raw, k)
}

func withKind(raw []byte, k Kind) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"kind":%q,"apiVersion":%q,`, k.Kind, k.APIVersion())
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

func (s *Server) list(w http.ResponseWriter, req *http.Request, r route, k Kind) {
	s.count(s.counts, "list "+k.Resource)
	sel, err := selectorOf(req, r)
	if err != nil {
		if s.o.Log != nil {
			s.o.Log.Error("fake API server: a list asks what it cannot answer", "err", err, "query", req.URL.RawQuery)
		}
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	q := req.URL.Query()
	limit, _ := strconv.Atoi(q.Get("limit"))
	if m := s.o.MaxPage; m > 0 && (limit == 0 || limit > m) {
		limit = m
	}
	var tok continueToken
	if c := q.Get("continue"); c != "" {
		b, err := base64.RawURLEncoding.DecodeString(c)
		if err != nil || json.Unmarshal(b, &tok) != nil {
			writeStatus(w, http.StatusBadRequest, "BadRequest", "malformed continue token")
			return
		}
	}
	objs, rv, more := s.Store.page(k.Resource, sel, tok.After, limit)
	if tok.RV != 0 {
		rv = tok.RV
	}
	cont := ""
	if more {
		b, _ := json.Marshal(continueToken{RV: rv, After: objs[len(objs)-1].key()})
		cont = base64.RawURLEncoding.EncodeToString(b)
	}
	var b bytes.Buffer
	if s.o.NoKinds {
		fmt.Fprintf(&b, `{"metadata":{"resourceVersion":"%d"`, rv)
	} else {
		fmt.Fprintf(&b, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"%d"`, k.Kind+"List", k.APIVersion(), rv)
	}
	if cont != "" {
		fmt.Fprintf(&b, `,"continue":%q`, cont)
	}
	b.WriteString(`},"items":[`)
	if c := s.codec(req); c != nil {
		b.Reset()
		fmt.Fprintf(&b, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"%d","continue":%q},"items":[`, k.Kind+"List", k.APIVersion(), rv, cont)
		for i, o := range objs {
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(o.raw)
		}
		b.WriteString("]}")
		s.writeEncoded(w, c, b.Bytes())
		return
	}
	// The items are written as they are stored, not gathered first: a
	// list of 100,000 pods is not copied twice.
	w.Header().Set("Content-Type", "application/json")
	w.Write(b.Bytes())
	for i, o := range objs {
		if i > 0 {
			w.Write([]byte{','})
		}
		w.Write(o.raw)
	}
	w.Write([]byte("]}\n"))
}

// WriteStatus answers a Status of code, as the API server fails; for
// raw handlers.
func WriteStatus(w http.ResponseWriter, code int, reason, msg string) {
	writeStatus(w, code, reason, msg)
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	writeJSON(w, code, statusBody(code, reason, msg))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
