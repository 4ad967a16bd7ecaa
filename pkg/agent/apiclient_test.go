package agent

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/cni-usernet/cni-usernet/pkg/agent/podevent"
)

// apiServer answers the agent's own calls from a table of paths.
func apiServer(t *testing.T, h http.HandlerFunc) *apiClient {
	t.Helper()
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	c, err := newAPIClient(&rest.Config{Host: srv.URL, BearerToken: "tok", TLSClientConfig: rest.TLSClientConfig{CAData: ca}}, ca)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func TestAPIClientNodes(t *testing.T) {
	c := apiServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/api/v1/nodes/n1":
			writeJSON(w, 200, map[string]any{"metadata": map[string]any{"name": "n1"}, "spec": map[string]any{"podCIDR": "10.244.1.0/24"}})
		case r.URL.Path == "/api/v1/nodes" && r.URL.Query().Get("continue") == "":
			if r.URL.Query().Get("limit") != "50" {
				t.Errorf("node list limit %q, want 50", r.URL.Query().Get("limit"))
			}
			writeJSON(w, 200, map[string]any{"metadata": map[string]any{"continue": "next"}, "items": []any{
				map[string]any{"metadata": map[string]any{"name": "n1"}, "spec": map[string]any{"podCIDRs": []string{"10.244.1.0/24", "fd00:1::/64"}},
					"status": map[string]any{"addresses": []any{map[string]any{"type": "Hostname", "address": "n1"}, map[string]any{"type": "InternalIP", "address": "192.0.2.1"}}}},
			}})
		case r.URL.Path == "/api/v1/nodes":
			writeJSON(w, 200, map[string]any{"items": []any{map[string]any{"metadata": map[string]any{"name": "n2"}}}})
		default:
			writeJSON(w, 404, map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})
		}
	})
	ctx := context.Background()
	cidrs, err := c.nodePodCIDRs(ctx, "n1")
	if err != nil || len(cidrs) != 1 || cidrs[0] != "10.244.1.0/24" {
		t.Errorf("nodePodCIDRs: got %v, %v, want the single podCIDR", cidrs, err)
	}
	if _, err := c.nodePodCIDRs(ctx, "gone"); !apierrors.IsNotFound(err) {
		t.Errorf("nodePodCIDRs of a missing node: got %v, want not found", err)
	}
	nodes, err := c.listNodes(ctx)
	if err != nil || len(nodes) != 2 || nodes[0].Name != "n1" || len(nodes[0].PodCIDRs) != 2 ||
		len(nodes[0].InternalIPs) != 1 || nodes[0].InternalIPs[0].String() != "192.0.2.1" || nodes[1].Name != "n2" {
		t.Errorf("listNodes: got %+v, %v; want both pages, n1 with two CIDRs and its InternalIP", nodes, err)
	}
}

func TestAPIClientDaemonSetExists(t *testing.T) {
	var mu sync.Mutex
	answer := 200
	deleting := false
	c := apiServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path != "/apis/apps/v1/namespaces/kube-system/daemonsets/cni-usernet" {
			t.Errorf("path %s", r.URL.Path)
		}
		md := map[string]any{"name": "cni-usernet", "namespace": "kube-system"}
		if deleting {
			md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
		}
		if answer != 200 {
			writeJSON(w, answer, map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": answer})
			return
		}
		writeJSON(w, 200, map[string]any{"metadata": md})
	})
	for _, tc := range []struct {
		code     int
		deleting bool
		want     bool
		err      func(error) bool
	}{
		{200, false, true, nil},
		{200, true, false, nil},
		{404, false, false, nil},
		{403, false, false, apierrors.IsForbidden},
		{401, false, false, apierrors.IsUnauthorized},
		{503, false, false, isUnreachable},
	} {
		mu.Lock()
		answer, deleting = tc.code, tc.deleting
		mu.Unlock()
		got, err := c.daemonSetExists(context.Background(), "kube-system", "cni-usernet")
		if got != tc.want || (tc.err == nil) != (err == nil) || (tc.err != nil && !tc.err(err)) {
			t.Errorf("answer %d (deleting %v): got %v, %v; want %v", tc.code, tc.deleting, got, err, tc.want)
		}
	}
}

// TestAPIClientEvent: the Event on a pod is posted with its UID, read
// first (the body is podevent's, tested there).
func TestAPIClientEvent(t *testing.T) {
	var got map[string]any
	c := apiServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces/ns/pods/p":
			writeJSON(w, 200, map[string]any{"metadata": map[string]any{"name": "p", "namespace": "ns", "uid": "uid-p"}})
		case r.Method == http.MethodPost && r.URL.Path == "/api/v1/namespaces/ns/events":
			json.NewDecoder(r.Body).Decode(&got)
			writeJSON(w, 201, got)
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
		}
	})
	ctx := context.Background()
	uid, err := c.podUID(ctx, "ns", "p")
	if err != nil || uid != "uid-p" {
		t.Fatalf("podUID: got %q, %v", uid, err)
	}
	err = c.event(ctx, podevent.Event{Namespace: "ns", PodName: "p", PodUID: uid, Type: corev1.EventTypeWarning, Reason: "StackNotRestarted",
		Message: "why", Action: "RestartStack", Node: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	io := got["involvedObject"].(map[string]any)
	if io["uid"] != "uid-p" || got["reason"] != "StackNotRestarted" || got["message"] != "why" {
		t.Errorf("event body: %v", got)
	}
	if err := c.event(ctx, podevent.Event{Namespace: "ns", PodName: "p", Type: corev1.EventTypeWarning, Reason: "X", Node: "n"}); err == nil {
		t.Error("an event without the pod's UID: got nil error")
	}
}

func TestAPIFailureReasons(t *testing.T) {
	pod := schema.GroupResource{Resource: "pods"}
	for _, c := range []struct {
		err  error
		want string
	}{
		{apierrors.NewUnauthorized("no"), "token rejected"},
		{apierrors.NewForbidden(pod, "p", errors.New("no")), "forbidden"},
		{apierrors.NewServiceUnavailable("down"), "API server unreachable"},
		{apierrors.NewTooManyRequests("slow down", 1), "API server unreachable"},
		{apierrors.NewNotFound(pod, "p"), "not found"},
		{fmt.Errorf("get: %w", context.DeadlineExceeded), "API server unreachable"},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, "API server unreachable"},
		{errors.New("odd"), "request failed"},
	} {
		if got := apiFailure(c.err); !strings.HasPrefix(got, c.want) {
			t.Errorf("apiFailure(%v) = %q, want %q...", c.err, got, c.want)
		}
	}
}

// TestAPIClientInCluster: rest.InClusterConfig gives the token it read
// and its file; every client the agent makes from it takes both.
func TestAPIClientInCluster(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("tok"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := newAPIClient(&rest.Config{Host: "https://10.96.0.1:443", BearerToken: "tok", BearerTokenFile: file}, nil); err != nil {
		t.Fatalf("the in-cluster configuration refused: %v", err)
	}
}
