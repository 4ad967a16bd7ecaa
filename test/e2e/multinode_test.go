package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The cluster's nodes as hack/k8s/e2e.sh names them: node 1 is this
// machine's root namespaces, node 2 (when the lab runs two) has namespaces
// of its own (hack/k8s/node2.sh), its private directories under
// E2E_NODE2_ROOT as seen from here.
func node1() string {
	if n := os.Getenv("E2E_NODE1"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

func node2() string     { return os.Getenv("E2E_NODE2") }
func node2IP() string   { return os.Getenv("E2E_NODE2_IP") }
func node2Root() string { return os.Getenv("E2E_NODE2_ROOT") }

// routedLab says whether a router stands between the lab's nodes
// (hack/k8s/lib/common.sh's K8S_LAB_TOPOLOGY=routed, passed on by e2e.sh).
func routedLab() bool { return os.Getenv("E2E_TOPOLOGY") == "routed" }

// node2Dir is where node 2's view of a private directory lies on this
// machine (node2.sh: the path without its leading slash, "/" as "_").
func node2Dir(path string) string {
	return filepath.Join(node2Root(), strings.ReplaceAll(strings.TrimPrefix(path, "/"), "/", "_"))
}

// onNode2 runs a command in node 2's namespaces.
func onNode2(t *testing.T, repo string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := run(ctx, repo, "hack/k8s/node2.sh", append([]string{"exec"}, argv...)...)
	if err != nil {
		t.Fatalf("on node 2: %v", err)
	}
	return out
}

// node2Status is `cni-usernet status --json` on node 2.
func node2Status(t *testing.T, repo string) map[string]statusRow {
	t.Helper()
	return parseStatus(t, onNode2(t, repo, installed, "status", "--json"))
}

// agentRoutes lists the routes cni-usernet's agent made (protocol 117) on
// node 1 or node 2.
func agentRoutes(t *testing.T, repo string, onTwo bool) string {
	t.Helper()
	if onTwo {
		return onNode2(t, repo, "ip", "route", "show", "proto", "117")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := run(ctx, "", "ip", "route", "show", "proto", "117")
	if err != nil {
		t.Fatal(err)
	}
	return out
}
