// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"
)

const redirectAnnotation = "cni-usernet.io/socket-redirect"

// checkSocketRedirectDirect: two pods of node 1 that say
// `socket-redirect: direct` answer each other's requests past both
// stacks, by pod IP and, standalone, through their Service's cluster IP
// as the cluster's kube-proxy translates it; chained, the node's end of
// the link is the primary CNI's, and the status says why Service
// connections keep the stacks.
func checkSocketRedirectDirect(t *testing.T, ns string, chained bool) {
	var m strings.Builder
	for _, name := range []string{"dsrv", "dcli"} {
		m.WriteString(strings.Replace(podManifest(ns, name, "hardware"),
			fmt.Sprintf("annotations: {%s: %q}", gsoAnnotation, "hardware"),
			fmt.Sprintf("annotations: {%s: %q, %s: direct}", gsoAnnotation, "hardware", redirectAnnotation), 1))
	}
	fmt.Fprintf(&m, `---
apiVersion: v1
kind: Service
metadata: {name: dsrv, namespace: %s}
spec:
  selector: {app: dsrv}
  ports:
  - {name: http, protocol: TCP, port: 80, targetPort: 8080}
`, ns)
	apply(t, m.String())
	// Gone before the next checks, which count the namespace's pods.
	t.Cleanup(func() {
		kubectl("-n", ns, "delete", "pod", "dsrv", "dcli", "--wait=true", "--timeout=60s")
		kubectl("-n", ns, "delete", "svc", "dsrv")
	})
	mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/dsrv", "pod/dcli", "--timeout=3m")
	srvIP := getPod(t, ns, "dsrv").Status.PodIP
	cliIP := getPod(t, ns, "dcli").Status.PodIP
	svcIP := serviceReady(t, ns, "dsrv", srvIP)
	st := nodeStatus(t)
	for _, name := range []string{"dsrv", "dcli"} {
		r := st[ns+"/"+name].Redirect
		if r == nil || r.Mode != "direct" {
			t.Fatalf("%s: status socketRedirect %+v, want mode direct", name, r)
		}
		if r.Services == chained {
			t.Errorf("%s: Service joins %v (%s), want %v", name, r.Services, r.ServicesOff, !chained)
		}
	}
	direct := func() uint64 {
		r := nodeStatus(t)[ns+"/dsrv"].Redirect
		if r == nil || r.Stats == nil {
			t.Fatalf("dsrv: no socket redirect counters in the status: %+v", r)
		}
		return r.Stats.Direct
	}
	// One request per connection: its request crosses the stacks, the
	// answer joins the client's socket.
	requests := func(addr, what string) uint64 {
		before := direct()
		for range 10 {
			out := podExec(t, ns, "dcli", "timeout", "15", "wget", "-qO-", "http://"+addr+"/")
			wantHTTP(t, what, out, "dsrv", "")
		}
		return direct() - before
	}
	n := requests(net.JoinHostPort(srvIP, "8080"), "dcli -> dsrv pod")
	t.Logf("by pod IP %s: %d of 10 answers joined (client %s)", srvIP, n, cliIP)
	if n < 10 {
		t.Errorf("by pod IP: %d of 10 answers went straight to the client", n)
	}
	n = requests(svcIP, "dcli -> Service dsrv")
	t.Logf("through the Service %s: %d of 10 answers joined", svcIP, n)
	switch {
	case !chained && n < 10:
		t.Errorf("through the Service %s: %d of 10 answers went straight to the client", svcIP, n)
	case chained && n != 0:
		t.Errorf("chained, through the Service %s: %d answers joined, want none (the primary CNI's link has no service program)", svcIP, n)
	}
}
