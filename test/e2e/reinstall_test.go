package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// reinstallConverges is what a reinstall must reach: after the manifest is
// applied again during a deferred uninstall, the node is served by the
// new agents within this, by itself. Logged beside the measured time; the
// test waits up to reinstallWait before it calls it stuck.
const (
	reinstallConverges = 30 * time.Second
	reinstallWait      = 3 * time.Minute
)

// checkReinstallDuringDeferredUninstall is what an operator does when an
// uninstall is reverted: `kubectl delete -f` of the manifest while pods
// (the test's, CoreDNS) run on both nodes, which defers the uninstall,
// then `kubectl apply -f` again. The manifest's ServiceAccount is created
// anew, so the old agents' tokens are no longer accepted: they must see
// the new agents on their nodes without the API server. It checks that the
// new agents run and are ready on every node and the old ones are gone,
// with no help, that the CNI files stayed, that every pod answered all
// along (HTTP every 0.5 s) and a connection open before kept working,
// that the stacks were not restarted, and that a new pod gets its
// network. pods are the pods to probe (name → address).
func checkReinstallDuringDeferredUninstall(t *testing.T, manifest string, chained bool, ns string, pods map[string]string) {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(pods["srv"], "9000"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	echo(t, conn, r, "before the uninstall")
	stacks := nodeStatus(t)
	old := agentPods(t)
	if len(old) == 0 {
		t.Fatal("no agent pods")
	}
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	yaml := string(b)
	if chained {
		yaml = strings.ReplaceAll(yaml, "--mode=standalone", "--mode=chain") // the README's chain install
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	probes := 0
	for name, ip := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(500 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				body, err := httpGet("http://" + net.JoinHostPort(ip, "8080") + "/")
				if err == nil && !strings.HasPrefix(body, "pod="+name+" ") {
					err = fmt.Errorf("answer %q", body)
				}
				mu.Lock()
				probes++
				if err != nil {
					failures = append(failures, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.0"), name, err))
				}
				mu.Unlock()
			}
		}()
	}
	stopProbes := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopProbes()

	mustKubectl(t, "delete", "-f", manifest, "--wait=false")
	eventually(t, time.Minute, "every old agent says it defers the uninstall", func() error {
		for _, a := range old {
			out, err := kubectl("-n", "kube-system", "logs", a, "--tail=50")
			if err != nil {
				return err
			}
			if !strings.Contains(out, "uninstall deferred") {
				return fmt.Errorf("agent %s has not logged the deferred uninstall", a)
			}
		}
		return nil
	})
	logsOf := map[string]string{}
	start := time.Now()
	apply(t, yaml)
	var took time.Duration
	eventually(t, reinstallWait, "new agents ready on every node, old ones gone", func() error {
		for _, a := range old {
			// The old agents' last words: why they let go.
			if out, err := kubectl("-n", "kube-system", "logs", a, "--tail=20"); err == nil {
				logsOf[a] = out
			}
		}
		now := agentPods(t)
		for _, p := range now {
			if slices.Contains(old, p) {
				return fmt.Errorf("old agent %s still there (agents %v)", p, now)
			}
		}
		out, err := kubectl("-n", "kube-system", "get", "ds", "cni-usernet", "-o",
			"jsonpath={.status.desiredNumberScheduled} {.status.numberReady} {.status.updatedNumberScheduled}")
		if err != nil {
			return err
		}
		var desired, ready, updated int
		if _, err := fmt.Sscan(out, &desired, &ready, &updated); err != nil {
			return fmt.Errorf("DaemonSet status %q: %w", out, err)
		}
		if desired == 0 || ready != desired || updated != desired || len(now) != desired {
			return fmt.Errorf("DaemonSet: %d desired, %d ready, %d updated; agent pods %v", desired, ready, updated, now)
		}
		took = time.Since(start)
		return nil
	})
	t.Logf("re-installed during the deferred uninstall: new agents ready on all nodes and the old ones gone %.1f s after kubectl apply (the target is <= %s)",
		took.Seconds(), reinstallConverges)
	for a, out := range logsOf {
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "another agent") || strings.Contains(l, "cannot ask the API server") || strings.Contains(l, "DaemonSet check refused") {
				t.Logf("old agent %s: %s", a, l)
			}
		}
	}
	stopProbes()
	mu.Lock()
	t.Logf("%d probes of %d pods during the delete and the apply, %d failed", probes, len(pods), len(failures))
	for _, f := range failures {
		t.Errorf("probe failed: %s", f)
	}
	mu.Unlock()
	echo(t, conn, r, "after the re-install")

	for _, f := range []string{installed, installedStack} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("plugin binary after the re-install: %v", err)
		}
	}
	if _, _, types, err := conflistIn(cniConfDir); err != nil || !slices.Contains(types, "cni-usernet") {
		t.Errorf("configuration after the re-install: plugins %v, %v", types, err)
	}
	after := nodeStatus(t)
	for key, row := range stacks {
		if !strings.HasPrefix(key, ns+"/") {
			continue
		}
		if now, ok := after[key]; !ok || now.PID != row.PID || !now.Healthy {
			t.Errorf("%s: stack %d before, %+v after the re-install", key, row.PID, now)
		}
	}
	apply(t, podManifest(ns, "reinst", ""))
	mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/reinst", "--timeout=2m")
	ip := getPod(t, ns, "reinst").Status.PodIP
	if body, err := httpGet("http://" + net.JoinHostPort(ip, "8080") + "/"); err != nil {
		t.Errorf("node -> a pod created after the re-install: %v", err)
	} else {
		wantHTTP(t, "node -> reinst", body, "reinst", "")
	}
	mustKubectl(t, "-n", ns, "delete", "pod", "reinst", "--wait=true", "--timeout=2m")
}
