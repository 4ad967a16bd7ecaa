package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
)

// newServer starts an API server and returns a Config that trusts it,
// with token "tok", which it takes.
func newServer(t *testing.T) (*fakeapi.Server, Config) {
	t.Helper()
	srv := fakeapi.NewTest(t, fakeapi.Options{Token: "tok"})
	return srv, Config{Server: srv.URL(), CAPEM: srv.CAPEM(), Token: "tok"}
}

// putPod stores pod ns/name with uid and annotations.
func putPod(t *testing.T, srv *fakeapi.Server, ns, name, uid string, ann map[string]string) {
	t.Helper()
	if _, err := srv.Store.Put("pods", map[string]any{"metadata": map[string]any{"namespace": ns, "name": name, "uid": uid, "annotations": ann}}); err != nil {
		t.Fatal(err)
	}
}

func newClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestPodAnnotations(t *testing.T) {
	srv, cfg := newServer(t)
	putPod(t, srv, "team-a", "web-0", "0b7c-uid", map[string]string{"cni-usernet.io/gso": "software", "other": "x"})
	c := newClient(t, cfg)
	ann, uid, err := c.PodAnnotations(ctxTimeout(t, 2*time.Second), "team-a", "web-0")
	if err != nil {
		t.Fatalf("PodAnnotations: %v", err)
	}
	want := map[string]string{"cni-usernet.io/gso": "software", "other": "x"}
	if !reflect.DeepEqual(ann, want) {
		t.Errorf("annotations: got %v, want %v", ann, want)
	}
	if uid != "0b7c-uid" {
		t.Errorf("uid: got %q, want %q", uid, "0b7c-uid")
	}
	reqs := srv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("requests: got %d, want 1", len(reqs))
	}
	got := reqs[0]
	if got.Method != http.MethodGet || got.Path != "/api/v1/namespaces/team-a/pods/web-0" {
		t.Errorf("request: got %s %s, want GET of the pod", got.Method, got.Path)
	}
	if a := got.Header.Get("Authorization"); a != "Bearer tok" {
		t.Errorf("Authorization: got %q, want %q", a, "Bearer tok")
	}
	if a := got.Header.Get("Accept"); !strings.HasPrefix(a, "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,") || !strings.HasSuffix(a, ",application/json") {
		t.Errorf("Accept: got %q, want metadata only with a plain JSON fallback", a)
	}
	if ua := got.Header.Get("User-Agent"); ua != DefaultUserAgent {
		t.Errorf("User-Agent: got %q, want %q", ua, DefaultUserAgent)
	}
}

func TestPodAnnotationsNone(t *testing.T) {
	srv, cfg := newServer(t)
	putPod(t, srv, "n", "p", "u1", nil)
	ann, uid, err := newClient(t, cfg).PodAnnotations(ctxTimeout(t, 2*time.Second), "n", "p")
	if err != nil {
		t.Fatalf("PodAnnotations: %v", err)
	}
	if ann == nil || len(ann) != 0 || uid != "u1" {
		t.Errorf("got %v, %q, want an empty non-nil map and u1", ann, uid)
	}
}

func TestEmptyNamesSendNothing(t *testing.T) {
	srv, cfg := newServer(t)
	c := newClient(t, cfg)
	ctx := ctxTimeout(t, 2*time.Second)
	if _, _, err := c.PodAnnotations(ctx, "", "p"); err == nil {
		t.Error("PodAnnotations with empty namespace: got nil error")
	}
	if _, _, err := c.PodAnnotations(ctx, "ns", ""); err == nil {
		t.Error("PodAnnotations with empty name: got nil error")
	}
	if calls := len(srv.Requests()); calls != 0 {
		t.Errorf("requests sent: got %d, want 0", calls)
	}
}

const forbiddenMsg = `pods "web-0" is forbidden: User "system:serviceaccount:kube-system:cni-usernet" cannot get resource "pods" in API group "" in the namespace "team-a"`

func TestErrorMapping(t *testing.T) {
	sentinels := []error{ErrNotFound, ErrUnauthorized, ErrForbidden, ErrUnreachable}
	for _, tc := range []struct {
		name     string
		fault    *fakeapi.Fault // nil: the pod is not there
		want     error          // the one sentinel errors.Is must match
		contains []string
	}{
		{"404", nil, ErrNotFound, []string{"get pods team-a/web-0", `pods "web-0" not found`}},
		{"403", &fakeapi.Fault{Code: 403, Reason: "Forbidden", Message: forbiddenMsg},
			ErrForbidden, []string{forbiddenMsg, `grant verb "get" on resource "pods" in API group "" in namespace "team-a"`}},
		{"401", &fakeapi.Fault{Code: 401, Reason: "Unauthorized", Message: "Unauthorized"},
			ErrUnauthorized, []string{"token or client certificate was not accepted"}},
		{"503", &fakeapi.Fault{Code: 503, Reason: "ServiceUnavailable", Message: "etcd is starting"},
			ErrUnreachable, []string{"503", "etcd is starting"}},
		{"429", &fakeapi.Fault{Code: 429, Reason: "TooManyRequests", Message: "too many requests, please try again later"},
			ErrUnreachable, []string{"Too Many Requests"}},
		{"502 from a proxy", &fakeapi.Fault{Code: 502, Body: []byte("<html>Bad Gateway</html>")},
			ErrUnreachable, []string{"<html>Bad Gateway</html>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, cfg := newServer(t)
			srv.SetFault("", tc.fault)
			_, _, err := newClient(t, cfg).PodAnnotations(ctxTimeout(t, 2*time.Second), "team-a", "web-0")
			if err == nil {
				t.Fatal("got nil error")
			}
			for _, s := range sentinels {
				if got, want := errors.Is(err, s), s == tc.want; got != want {
					t.Errorf("errors.Is(err, %v): got %v, want %v (err: %v)", s, got, want, err)
				}
			}
			for _, s := range tc.contains {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			var apiErr *APIError
			if !errors.As(err, &apiErr) || apiErr.Resource != "pods" || apiErr.Verb != "get" {
				t.Errorf("errors.As APIError: got %+v, want one for get pods", apiErr)
			}
		})
	}
}

func TestServerDownIsUnreachableQuickly(t *testing.T) {
	srv, cfg := newServer(t)
	srv.Close() // nothing listens on the port any more
	c := newClient(t, cfg)
	start := time.Now()
	_, _, err := c.PodAnnotations(ctxTimeout(t, 2*time.Second), "n", "p")
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("got %v, want ErrUnreachable", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("took %v, want well under the 2 s budget for a refused connection", d)
	}
}

// A server that accepts connections and never answers must cost no more
// than the caller's deadline, and count as unreachable.
func TestSilentServerIsUnreachableAtDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	c := newClient(t, Config{Server: "https://" + ln.Addr().String(), CAPEM: newTestCA(t).certPEM, Token: "tok"})
	start := time.Now()
	_, _, err = c.PodAnnotations(ctxTimeout(t, 300*time.Millisecond), "n", "p")
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want ErrUnreachable and DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v, want about the 300 ms deadline", d)
	}
}

func TestWrongCAIsNotUnreachable(t *testing.T) {
	_, cfg := newServer(t)
	// A CA that did not sign the server's certificate.
	ca := newTestCA(t)
	cfg.CAPEM = ca.certPEM
	_, _, err := newClient(t, cfg).PodAnnotations(ctxTimeout(t, 2*time.Second), "n", "p")
	if err == nil || errors.Is(err, ErrUnreachable) {
		t.Fatalf("got %v, want a certificate error that is not ErrUnreachable", err)
	}
	if !strings.Contains(err.Error(), "verifying the API server's certificate") {
		t.Errorf("error %q does not say the certificate failed", err)
	}
}

func TestEventBody(t *testing.T) {
	srv, cfg := newServer(t)
	at := time.Date(2026, 3, 4, 5, 6, 7, 890, time.FixedZone("x", 3600))
	err := newClient(t, cfg).Event(ctxTimeout(t, 2*time.Second), Event{
		Namespace: "team-a", PodName: "web-0", PodUID: "0b7c-uid",
		Type: EventNormal, Reason: "GSOMode",
		Message: "GSO mode software: link has no offload (gso_max_size 0)",
		Action:  "AddNetwork", Node: "node-1", Time: at,
	})
	if err != nil {
		t.Fatalf("Event: %v", err)
	}
	reqs := srv.Requests()
	if len(reqs) != 1 || len(srv.Events()) != 1 {
		t.Fatalf("requests %+v, want the one Event posted", reqs)
	}
	path, method, ctype := reqs[0].Path, reqs[0].Method, reqs[0].Header.Get("Content-Type")
	body := srv.EventBodies()[0]
	if method != http.MethodPost || path != "/api/v1/namespaces/team-a/events" || ctype != "application/json" {
		t.Errorf("request: got %s %s (%s), want POST /api/v1/namespaces/team-a/events (application/json)", method, path, ctype)
	}
	want := map[string]any{
		"apiVersion": "v1",
		"kind":       "Event",
		"metadata":   map[string]any{"name": fmt.Sprintf("web-0.%x", at.UnixNano()), "namespace": "team-a"},
		"involvedObject": map[string]any{
			"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "web-0", "uid": "0b7c-uid",
		},
		"type":               "Normal",
		"reason":             "GSOMode",
		"message":            "GSO mode software: link has no offload (gso_max_size 0)",
		"action":             "AddNetwork",
		"count":              float64(1),
		"firstTimestamp":     "2026-03-04T04:06:07Z",
		"lastTimestamp":      "2026-03-04T04:06:07Z",
		"source":             map[string]any{"component": "cni-usernet", "host": "node-1"},
		"reportingComponent": "cni-usernet",
		"reportingInstance":  "node-1",
	}
	if !reflect.DeepEqual(body, want) {
		gb, _ := json.MarshalIndent(body, "", " ")
		wb, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("event body:\ngot  %s\nwant %s", gb, wb)
	}
}

func TestEventLongMessageAndValidation(t *testing.T) {
	srv, cfg := newServer(t)
	c := newClient(t, cfg)
	ctx := ctxTimeout(t, 2*time.Second)
	ok := Event{Namespace: "n", PodName: "p", PodUID: "u", Type: EventWarning, Reason: "BadAnnotation", Node: "node-1"}
	long := ok
	long.Message = "annotation cni-usernet.io/gso: value " + strings.Repeat("é", 2000)
	if err := c.Event(ctx, long); err != nil {
		t.Fatalf("Event: %v", err)
	}
	msg, _ := srv.EventBodies()[0]["message"].(string)
	if len(msg) > maxMessage || !utf8.ValidString(msg) || !strings.HasSuffix(msg, "...") {
		t.Errorf("long message: got %d bytes (valid UTF-8 %v), want at most %d, valid, ending in ...", len(msg), utf8.ValidString(msg), maxMessage)
	}
	for name, mut := range map[string]func(*Event){
		"no uid":      func(e *Event) { e.PodUID = "" },
		"bad type":    func(e *Event) { e.Type = "Error" },
		"no reason":   func(e *Event) { e.Reason = "" },
		"long reason": func(e *Event) { e.Reason = strings.Repeat("R", 129) },
		"no node":     func(e *Event) { e.Node = "" },
	} {
		e := ok
		mut(&e)
		if err := c.Event(ctx, e); err == nil {
			t.Errorf("%s: got nil error", name)
		}
	}
}

func TestEventName(t *testing.T) {
	at := time.Unix(1700000000, 5)
	if got, want := eventName("web-0", at), fmt.Sprintf("web-0.%x", at.UnixNano()); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	long := strings.Repeat("a", 230) + "-" + strings.Repeat("b", 22)
	got := eventName(long, at)
	if len(got) > 253 || strings.Contains(got, "-.") {
		t.Errorf("long pod name: got %q (%d bytes), want at most 253 bytes, a valid subdomain", got, len(got))
	}
}

// tokenServer is an API server that holds pod n/p and takes only the
// tokens SetTokens gives it.
func tokenServer(t *testing.T, toks ...string) (*fakeapi.Server, Config) {
	t.Helper()
	srv, cfg := newServer(t)
	putPod(t, srv, "n", "p", "u", nil)
	srv.SetTokens(toks...)
	return srv, cfg
}

func writeFileAtomic(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestTokenFileRotation(t *testing.T) {
	ts, cfg := tokenServer(t, "token-one")
	file := filepath.Join(t.TempDir(), "token")
	writeFileAtomic(t, file, "token-one\n")
	cfg.Token, cfg.TokenFile = "", file
	c := newClient(t, cfg)
	ctx := ctxTimeout(t, 5*time.Second)
	if _, _, err := c.PodAnnotations(ctx, "n", "p"); err != nil {
		t.Fatalf("with the first token: %v", err)
	}
	// kubelet swaps in a new file; the old token stops working.
	writeFileAtomic(t, file, "token-two\n")
	ts.SetTokens("token-two")
	if _, _, err := c.PodAnnotations(ctx, "n", "p"); err != nil {
		t.Fatalf("after rotation: %v", err)
	}
	if got, want := ts.Tokens(), []string{"token-one", "token-two"}; !reflect.DeepEqual(got, want) {
		t.Errorf("tokens sent: got %v, want %v", got, want)
	}
}

// A token replaced in place, with the same size and modification time,
// is invisible to the stat check; the 401 it earns must make the client
// read the file again and retry once.
func TestTokenRereadOn401(t *testing.T) {
	ts, cfg := tokenServer(t, "token-AAA")
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("token-AAA"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Token, cfg.TokenFile = "", file
	c := newClient(t, cfg)
	ctx := ctxTimeout(t, 5*time.Second)
	if _, _, err := c.PodAnnotations(ctx, "n", "p"); err != nil {
		t.Fatalf("first request: %v", err)
	}
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("token-BBB"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(file, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	ts.SetTokens("token-BBB")
	if _, _, err := c.PodAnnotations(ctx, "n", "p"); err != nil {
		t.Fatalf("after in-place rotation: %v", err)
	}
	if got, want := ts.Tokens(), []string{"token-AAA", "token-AAA", "token-BBB"}; !reflect.DeepEqual(got, want) {
		t.Errorf("tokens sent: got %v, want %v", got, want)
	}
	// A token that is simply wrong is not retried in a loop.
	ts.SetTokens()
	if _, _, err := c.PodAnnotations(ctx, "n", "p"); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("revoked token: got %v, want ErrUnauthorized", err)
	}
	if n := len(ts.Tokens()); n != 4 {
		t.Errorf("requests after revocation: got %d in all, want 4 (no retry when the file did not change)", n)
	}
}

func TestConfigValidate(t *testing.T) {
	ca := newTestCA(t)
	for name, cfg := range map[string]Config{
		"no server":          {},
		"http":               {Server: "http://10.96.0.1", Token: "t"},
		"no host":            {Server: "https://"},
		"query":              {Server: "https://a/?x=1"},
		"user info":          {Server: "https://u:p@a/"},
		"token and file":     {Server: "https://a", Token: "t", TokenFile: "/f"},
		"cert without key":   {Server: "https://a", CertPEM: ca.certPEM},
		"CA that is not PEM": {Server: "https://a", CAPEM: []byte("not a certificate")},
	} {
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: got nil error", name)
		}
	}
	if err := (Config{Server: "https://10.96.0.1:443", CAPEM: ca.certPEM, Token: "t"}).Validate(); err != nil {
		t.Errorf("good config: %v", err)
	}
	if _, err := New(Config{Server: "https://a", TokenFile: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Error("missing token file: got nil error from New")
	}
}

func TestServerPathPrefix(t *testing.T) {
	var path string
	srv, cfg := newServer(t)
	// The server answers under a prefix, as one behind a proxy.
	srv.SetRaw(func(w http.ResponseWriter, r *http.Request) bool {
		path = r.URL.Path
		fmt.Fprint(w, `{"metadata":{"uid":"u"}}`)
		return true
	})
	cfg.Server = srv.URL() + "/k8s/"
	if _, _, err := newClient(t, cfg).PodAnnotations(ctxTimeout(t, 2*time.Second), "n", "p"); err != nil {
		t.Fatal(err)
	}
	if want := "/k8s/api/v1/namespaces/n/pods/p"; path != want {
		t.Errorf("path: got %q, want %q", path, want)
	}
}
