package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// churnBurst is how many pods each burst creates on each node.
const churnBurst = 3

// TestKubernetesChurn creates and deletes pods on both nodes in bursts
// while, in turn, an agent pod is force-deleted, the DaemonSet is
// restarted, node 2's containerd is restarted and the API server is
// stopped for a minute. Afterwards every node has exactly what
// its running pods explain (attachments, stacks, veths, leases, state
// files, routes) and every running pod answers. About 6 minutes:
// `make e2e-churn` (E2E_CHURN=1), not part of `make e2e`.
func TestKubernetesChurn(t *testing.T) {
	if os.Getenv("E2E_CHURN") != "1" {
		t.Skip("the churn with faults runs with E2E_CHURN=1 (make e2e-churn)")
	}
	start := time.Now()
	repo, ns, network := faultsSetup(t, "cu-churn-")
	nodes := labNodes(repo)
	// Pods that live through all of it.
	for i, n := range nodes {
		apply(t, podManifestOn(ns, fmt.Sprintf("steady-%d", i+1), "", n.name, map[string]string{"churn": "steady"}))
	}
	mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod", "-l", "churn=steady", "--timeout=3m")

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	bursts, failures := 0, 0
	var lastErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		prev := ""
		for round := 1; ctx.Err() == nil; round++ {
			var m strings.Builder
			for _, n := range nodes {
				for i := 0; i < churnBurst; i++ {
					m.WriteString(podManifestOn(ns, fmt.Sprintf("c%d-%s-%d", round, nodeTag(n), i), "", n.name,
						map[string]string{"churn": fmt.Sprintf("r%d", round)}))
				}
			}
			cmd := execKubectl(ctx, "apply", "-f", "-")
			cmd.Stdin = strings.NewReader(m.String())
			out, err := cmd.CombinedOutput()
			mu.Lock()
			bursts++
			if err != nil {
				failures++
				lastErr = fmt.Errorf("round %d: %v: %s", round, err, out)
			}
			mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(6 * time.Second):
			}
			if prev != "" {
				// The previous burst goes, while this one starts.
				execKubectl(context.Background(), "-n", ns, "delete", "pod", "-l", "churn="+prev, "--wait=false").Run()
			}
			prev = fmt.Sprintf("r%d", round)
		}
	}()
	defer func() { stop(); wg.Wait() }()

	calm := func() {
		select {
		case <-time.After(15 * time.Second):
		case <-ctx.Done():
		}
	}
	calm()
	t.Run("AgentForceDeleted", func(t *testing.T) {
		out := mustKubectl(t, "-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=cni-usernet",
			"--field-selector", "spec.nodeName="+node1(), "-o", "name")
		mustKubectl(t, "-n", "kube-system", "delete", strings.TrimSpace(out), "--grace-period=0", "--force")
		mustKubectl(t, "-n", "kube-system", "rollout", "status", "ds/cni-usernet", "--timeout=3m")
	})
	calm()
	t.Run("DaemonSetRestarted", func(t *testing.T) {
		mustKubectl(t, "-n", "kube-system", "rollout", "restart", "ds/cni-usernet")
		mustKubectl(t, "-n", "kube-system", "rollout", "status", "ds/cni-usernet", "--timeout=5m")
	})
	calm()
	t.Run("ContainerdRestarted", func(t *testing.T) {
		if node2() == "" {
			t.Skip("needs the lab's node 2")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if _, err := run(ctx, repo, "hack/k8s/node2.sh", "restart-containerd"); err != nil {
			t.Fatal(err)
		}
	})
	calm()
	t.Run("APIServerAway", func(t *testing.T) {
		start := stopAPIServer(t, repo)
		time.Sleep(outage)
		start()
	})
	calm()
	stop()
	wg.Wait()
	mu.Lock()
	t.Logf("%d bursts of %d pods per node; %d not accepted by kubectl (the API server away): last %v", bursts, churnBurst, failures, lastErr)
	mu.Unlock()

	// Settle: the deleted pods gone, the rest Running and Ready.
	settle := time.Now()
	eventually(t, 4*time.Minute, "every pod of the churn Running and Ready, or gone", func() error {
		var l struct {
			Items []struct {
				Metadata struct {
					Name              string  `json:"name"`
					DeletionTimestamp *string `json:"deletionTimestamp"`
				} `json:"metadata"`
				Status struct {
					Phase      string `json:"phase"`
					Conditions []struct {
						Type   string `json:"type"`
						Status string `json:"status"`
					} `json:"conditions"`
				} `json:"status"`
			} `json:"items"`
		}
		if err := kubectlJSON(&l, "-n", ns, "get", "pods"); err != nil {
			return err
		}
		var waiting []string
		for _, p := range l.Items {
			ready := false
			for _, c := range p.Status.Conditions {
				ready = ready || (c.Type == "Ready" && c.Status == "True")
			}
			if p.Metadata.DeletionTimestamp != nil || !ready {
				waiting = append(waiting, p.Metadata.Name+" ("+p.Status.Phase+")")
			}
		}
		if len(waiting) > 0 {
			return fmt.Errorf("%d pods not settled: %s", len(waiting), strings.Join(waiting, ", "))
		}
		return nil
	})
	t.Logf("pods settled %.1fs after the last fault", time.Since(settle).Seconds())
	nodesAccountFor(t, repo, network, otherPodCIDRs(t), 3*time.Minute)
	t.Logf("nodes accounted for %.1fs after the last fault", time.Since(settle).Seconds())
	runningAnswer(t, ns, time.Minute)
	t.Logf("churn with faults: %.0fs in all", time.Since(start).Seconds())
}

func nodeTag(n labNode) string {
	if n.two {
		return "n2"
	}
	return "n1"
}

// execKubectl is kubectl bound to ctx and to a minute.
func execKubectl(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "kubectl", append([]string{"--request-timeout=60s"}, args...)...)
}
