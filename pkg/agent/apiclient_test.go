package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/cni-usernet/cni-usernet/pkg/agent/podevent"
	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
)

// apiServer is an API server for the agent's own calls, and a client of
// it.
func apiServer(t *testing.T, o fakeapi.Options) (*apiClient, *fakeapi.Server) {
	t.Helper()
	o.Token = "tok"
	srv := fakeapi.NewTest(t, o)
	c, err := newAPIClient(&rest.Config{Host: srv.URL(), BearerToken: "tok", TLSClientConfig: rest.TLSClientConfig{CAData: srv.CAPEM()}}, srv.CAPEM())
	if err != nil {
		t.Fatal(err)
	}
	return c, srv
}

func put(t *testing.T, srv *fakeapi.Server, resource string, obj any) {
	t.Helper()
	if _, err := srv.Store.Put(resource, obj); err != nil {
		t.Fatal(err)
	}
}

func TestAPIClientNodes(t *testing.T) {
	// One node a page, whatever the limit: the client must follow
	// continue.
	c, srv := apiServer(t, fakeapi.Options{MaxPage: 1})
	put(t, srv, "nodes", map[string]any{"metadata": map[string]any{"name": "n1"}, "spec": map[string]any{"podCIDR": "10.244.1.0/24"}})
	ctx := context.Background()
	cidrs, err := c.nodePodCIDRs(ctx, "n1")
	if err != nil || len(cidrs) != 1 || cidrs[0] != "10.244.1.0/24" {
		t.Errorf("nodePodCIDRs: got %v, %v, want the single podCIDR", cidrs, err)
	}
	if _, err := c.nodePodCIDRs(ctx, "gone"); !apierrors.IsNotFound(err) {
		t.Errorf("nodePodCIDRs of a missing node: got %v, want not found", err)
	}
	put(t, srv, "nodes", map[string]any{"metadata": map[string]any{"name": "n1"}, "spec": map[string]any{"podCIDRs": []string{"10.244.1.0/24", "fd00:1::/64"}},
		"status": map[string]any{"addresses": []any{map[string]any{"type": "Hostname", "address": "n1"}, map[string]any{"type": "InternalIP", "address": "192.0.2.1"}}}})
	put(t, srv, "nodes", map[string]any{"metadata": map[string]any{"name": "n2"}})
	nodes, err := c.listNodes(ctx)
	if err != nil || len(nodes) != 2 || nodes[0].Name != "n1" || len(nodes[0].PodCIDRs) != 2 ||
		len(nodes[0].InternalIPs) != 1 || nodes[0].InternalIPs[0].String() != "192.0.2.1" || nodes[1].Name != "n2" {
		t.Errorf("listNodes: got %+v, %v; want both pages, n1 with two CIDRs and its InternalIP", nodes, err)
	}
	lists := 0
	for _, r := range srv.Requests() {
		if r.Path == "/api/v1/nodes" {
			lists++
			if r.Query.Get("limit") != "50" {
				t.Errorf("node list limit %q, want 50", r.Query.Get("limit"))
			}
		}
	}
	if lists != 2 {
		t.Errorf("node lists: %d, want both pages", lists)
	}
}

func TestAPIClientDaemonSetExists(t *testing.T) {
	c, srv := apiServer(t, fakeapi.Options{})
	const path = "/apis/apps/v1/namespaces/kube-system/daemonsets/cni-usernet"
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
		md := map[string]any{"name": "cni-usernet", "namespace": "kube-system"}
		if tc.deleting {
			md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
		}
		switch tc.code {
		case 200:
			put(t, srv, "daemonsets", map[string]any{"metadata": md})
			srv.SetFault(path, nil)
		case 404:
			if srv.Store.Get("daemonsets", "kube-system", "cni-usernet") != nil {
				if err := srv.Store.Delete("daemonsets", "kube-system", "cni-usernet"); err != nil {
					t.Fatal(err)
				}
			}
		default:
			srv.SetFault(path, &fakeapi.Fault{Code: tc.code})
		}
		got, err := c.daemonSetExists(context.Background(), "kube-system", "cni-usernet")
		if got != tc.want || (tc.err == nil) != (err == nil) || (tc.err != nil && !tc.err(err)) {
			t.Errorf("answer %d (deleting %v): got %v, %v; want %v", tc.code, tc.deleting, got, err, tc.want)
		}
	}
	for _, r := range srv.Requests() {
		if r.Path != path {
			t.Errorf("path %s", r.Path)
		}
	}
}

// TestAPIClientEvent: the Event on a pod is posted with its UID, read
// first (the body is podevent's, tested there).
func TestAPIClientEvent(t *testing.T) {
	c, srv := apiServer(t, fakeapi.Options{})
	put(t, srv, "pods", map[string]any{"metadata": map[string]any{"name": "p", "namespace": "ns", "uid": "uid-p"}})
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
	evs := srv.Events()
	if len(evs) != 1 || evs[0].Method != http.MethodPost || evs[0].Namespace != "ns" {
		t.Fatalf("events %+v, want one posted to ns", evs)
	}
	got := srv.EventBodies()[0]
	io := got["involvedObject"].(map[string]any)
	if io["uid"] != "uid-p" || got["reason"] != "StackNotRestarted" || got["message"] != "why" {
		t.Errorf("event body: %v", got)
	}
	if err := c.event(ctx, podevent.Event{Namespace: "ns", PodName: "p", Type: corev1.EventTypeWarning, Reason: "X", Node: "n"}); err == nil {
		t.Error("an event without the pod's UID: got nil error")
	}
	_, unknown := srv.Counts()
	if len(unknown) != 0 || len(srv.Events()) != 1 {
		t.Errorf("unexpected requests %v, or a second event posted", unknown)
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
