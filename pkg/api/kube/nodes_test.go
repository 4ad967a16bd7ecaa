package kube

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"testing"
	"time"
)

func TestListNodesPages(t *testing.T) {
	var queries []string
	_, cfg := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/nodes" {
			http.NotFound(w, r)
			return
		}
		queries = append(queries, r.URL.RawQuery)
		if r.URL.Query().Get("continue") == "" {
			fmt.Fprint(w, `{"kind":"NodeList","metadata":{"continue":"page2"},"items":[
				{"metadata":{"name":"a"},"spec":{"podCIDR":"10.244.0.0/24","podCIDRs":["10.244.0.0/24","fd10::/64"]},
				 "status":{"addresses":[{"type":"Hostname","address":"a"},{"type":"InternalIP","address":"10.0.0.1"},{"type":"InternalIP","address":"fd00::1"}]}}]}`)
			return
		}
		fmt.Fprint(w, `{"kind":"NodeList","metadata":{},"items":[
			{"metadata":{"name":"old"},"spec":{"podCIDR":"10.244.1.0/24"},"status":{"addresses":[{"type":"ExternalIP","address":"192.0.2.1"}]}},
			{"metadata":{"name":"new"},"spec":{},"status":{}}]}`)
	})
	nodes, err := newClient(t, cfg).ListNodes(ctxTimeout(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeInfo{
		{Name: "a", InternalIPs: []string{"10.0.0.1", "fd00::1"}, PodCIDRs: []string{"10.244.0.0/24", "fd10::/64"}},
		{Name: "old", PodCIDRs: []string{"10.244.1.0/24"}},
		{Name: "new"},
	}
	if !reflect.DeepEqual(nodes, want) {
		t.Errorf("nodes %+v\nwant %+v", nodes, want)
	}
	if want := []string{"limit=50", "continue=page2&limit=50"}; !reflect.DeepEqual(queries, want) {
		t.Errorf("queries %q, want %q", queries, want)
	}
}

func TestListNodesForbidden(t *testing.T) {
	_, cfg := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		writeStatus(w, http.StatusForbidden, "Forbidden", `nodes is forbidden: cannot list resource "nodes"`)
	})
	_, err := newClient(t, cfg).ListNodes(ctxTimeout(t, 2*time.Second))
	if err == nil || !errors.Is(err, ErrForbidden) {
		t.Errorf("err %v, want ErrForbidden", err)
	}
}
