package podevent

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
)

// server is an API server that takes token tok, and a client of it.
func server(t *testing.T) (*Client, *fakeapi.Server) {
	t.Helper()
	srv := fakeapi.NewTest(t, fakeapi.Options{Token: "tok"})
	c, err := New(&rest.Config{Host: srv.URL(), BearerToken: "tok", TLSClientConfig: rest.TLSClientConfig{CAData: srv.CAPEM()}})
	if err != nil {
		t.Fatal(err)
	}
	return c, srv
}

func TestPost(t *testing.T) {
	c, srv := server(t)
	at := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)
	err := c.Post(context.Background(), Event{Namespace: "ns", PodName: "p", PodUID: "uid-p", Type: corev1.EventTypeWarning,
		Reason: "StackNotRestarted", Message: strings.Repeat("é", 700), Action: "RestartStack", Node: "node-1", Time: at})
	if err != nil {
		t.Fatal(err)
	}
	evs := srv.Events()
	if len(evs) != 1 || evs[0].Method != http.MethodPost || evs[0].Namespace != "ns" {
		t.Fatalf("events %+v, want one POST to /api/v1/namespaces/ns/events", evs)
	}
	got := srv.EventBodies()[0]
	io := got["involvedObject"].(map[string]any)
	src := got["source"].(map[string]any)
	md := got["metadata"].(map[string]any)
	msg := got["message"].(string)
	if got["kind"] != "Event" || got["apiVersion"] != "v1" || io["kind"] != "Pod" || io["uid"] != "uid-p" || got["type"] != "Warning" ||
		got["reason"] != "StackNotRestarted" || got["action"] != "RestartStack" || got["count"] != 1.0 ||
		src["host"] != "node-1" || src["component"] != "cni-usernet" ||
		got["reportingComponent"] != "cni-usernet" || got["reportingInstance"] != "node-1" ||
		!strings.HasPrefix(md["name"].(string), "p.") || got["firstTimestamp"] != "2026-01-02T03:04:05Z" ||
		got["lastTimestamp"] != "2026-01-02T03:04:05Z" || got["eventTime"] != nil ||
		len(msg) > 1024 || !strings.HasSuffix(msg, "...") || !utf8Valid(msg) {
		t.Errorf("event body: %v", got)
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

func TestPostRefused(t *testing.T) {
	c, srv := server(t)
	srv.SetFault("/api/v1/namespaces/ns/events", &fakeapi.Fault{Code: 403, Reason: "Forbidden"})
	e := Event{Namespace: "ns", PodName: "p", PodUID: "u", Type: corev1.EventTypeWarning, Reason: "X", Node: "n"}
	if err := c.Post(context.Background(), e); !apierrors.IsForbidden(err) {
		t.Errorf("a refused event: got %v, want forbidden", err)
	}
}
