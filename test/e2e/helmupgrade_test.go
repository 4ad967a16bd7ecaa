// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// previousChart extracts the chart of the version before this tree's
// into dir and returns its path and the revision it came from: the
// revision E2E_PREVIOUS_CHART names, else the newest commit whose
// Chart.yaml has another `version:` than the tree's. It skips the test
// when the history has none (a tree whose chart never changed version).
func previousChart(t *testing.T, repo, dir string) (string, string) {
	t.Helper()
	version := regexp.MustCompile(`(?m)^version:\s*(\S+)`)
	cur, err := os.ReadFile(filepath.Join(repo, "charts/cni-usernet/Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := version.FindSubmatch(cur)
	if m == nil {
		t.Fatal("charts/cni-usernet/Chart.yaml has no version")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rev := os.Getenv("E2E_PREVIOUS_CHART")
	if rev == "" {
		log, err := run(ctx, repo, "git", "log", "--format=%H", "--", "charts/cni-usernet/Chart.yaml")
		if err != nil {
			t.Fatalf("git log: %v", err)
		}
		for _, h := range strings.Fields(log) {
			old, err := run(ctx, repo, "git", "show", h+":charts/cni-usernet/Chart.yaml")
			if err != nil {
				continue
			}
			if o := version.FindStringSubmatch(old); o != nil && o[1] != string(m[1]) {
				rev = h
				break
			}
		}
		if rev == "" {
			t.Skipf("no earlier chart version than %s in the history: set E2E_PREVIOUS_CHART=<revision>", m[1])
		}
	}
	archive := exec.CommandContext(ctx, "git", "archive", rev, "charts/cni-usernet")
	archive.Dir = repo
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s charts/cni-usernet: %v", rev, err)
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("extracting the chart of %s: %v", rev, err)
	}
	return filepath.Join(dir, "charts/cni-usernet"), rev
}

// TestKubernetesHelmUpgrade is an operator's upgrade of the chart: the
// previous chart version installed with Helm and the image of its own
// tree, pods on both nodes, then `helm upgrade --reset-then-reuse-values`
// to this tree's chart and image (the documented command,
// docs/install.md; the image set, as the install set it). It checks that
// every agent is replaced and ready, that every pod answered all along
// (HTTP every 0.5 s) and a connection opened before keeps echoing, that
// no stack was restarted, that `helm test` passes and that a new pod
// gets its network after.
func TestKubernetesHelmUpgrade(t *testing.T) {
	repo := standaloneOnCleanCluster(t, "the chart upgrade")
	helm := filepath.Join(repo, "bin", "helm") // make helm
	if _, err := os.Stat(helm); err != nil {
		t.Fatalf("%v: `make helm` builds it", err)
	}
	suffix := make([]byte, 3)
	rand.Read(suffix)
	ns := "cu-up-" + hex.EncodeToString(suffix)
	// This tree's image, which hack/image.sh built and the nodes
	// imported, is what the upgrade brings; the previous chart runs the
	// image of its own tree, as the release it was part of did.
	image := imageValues(t, imageRef(t, thisReleaseManifest(t, repo)))

	t.Cleanup(func() {
		kubectl("delete", "ns", ns, "--wait=true", "--timeout=90s")
		kubectl("-n", "kube-system", "scale", "deploy/coredns", "--replicas=0")
		kubectl("-n", "kube-system", "wait", "--for=delete", "pod", "-l", "k8s-app=kube-dns", "--timeout=90s")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if _, err := run(ctx, repo, helm, "status", "cni-usernet", "-n", "kube-system"); err == nil {
			if out, err := run(ctx, repo, helm, "uninstall", "cni-usernet", "-n", "kube-system", "--wait", "--timeout=2m"); err != nil {
				t.Logf("cleanup: %v: %s", err, out)
			}
			waitAgentGone(t)
			waitNodesNotReady(t)
		}
	})
	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}

	old, rev := previousChart(t, repo, t.TempDir())
	step("InstallPreviousChart", func(t *testing.T) {
		_, oldImage := buildImageAt(t, repo, rev)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if out, err := run(ctx, repo, helm, "install", "cni-usernet", old, "-n", "kube-system", "--set", imageValues(t, oldImage)); err != nil {
			t.Fatalf("helm install the chart of %.12s: %v\n%s", rev, err, out)
		}
		mustKubectl(t, "-n", "kube-system", "rollout", "status", "ds/cni-usernet", "--timeout=5m")
		nodesReady(t, repo)
	})

	ip := map[string]string{}
	step("Pods", func(t *testing.T) {
		buildPodImage(t, repo)
		mustKubectl(t, "create", "ns", ns)
		apply(t, podManifest(ns, "srv", "")+podManifestOn(ns, "far", "", node2OrNode1(), nil))
		mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/srv", "pod/far", "--timeout=3m")
		for _, name := range []string{"srv", "far"} {
			ip[name] = getPod(t, ns, name).Status.PodIP
		}
	})

	step("UpgradeKeepsPodsServed", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip["srv"], "9000"), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		r := bufio.NewReader(conn)
		echo(t, conn, r, "before the upgrade")
		stacks := clusterStatus(t, repo)
		agents := agentPods(t)

		stop := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		var failures []string
		probes := 0
		for name, addr := range ip {
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
					body, err := httpGet("http://" + net.JoinHostPort(addr, "8080") + "/")
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

		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		start := time.Now()
		out, err := run(ctx, repo, helm, "upgrade", "cni-usernet", filepath.Join(repo, "charts/cni-usernet"), "-n", "kube-system",
			"--reset-then-reuse-values", "--set", image, "--wait", "--timeout=5m")
		if err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("helm upgrade from the chart of %.12s: %v\n%s", rev, err, out)
		}
		mustKubectl(t, "-n", "kube-system", "rollout", "status", "ds/cni-usernet", "--timeout=5m")
		eventually(t, 2*time.Minute, "every agent replaced", func() error {
			now := agentPods(t)
			for _, p := range now {
				for _, o := range agents {
					if p == o {
						return fmt.Errorf("agent pods %v, before the upgrade %v", now, agents)
					}
				}
			}
			if len(now) != len(agents) {
				return fmt.Errorf("agent pods %v, want %d", now, len(agents))
			}
			return nil
		})
		nodesReady(t, repo)
		took := time.Since(start)
		time.Sleep(2 * time.Second) // probes after the last agent's start
		close(stop)
		wg.Wait()
		t.Logf("upgraded from the chart of %.12s in %s; %d probes, %d failed", rev, took.Round(100*time.Millisecond), probes, len(failures))
		if len(failures) > 0 {
			t.Errorf("pods not served during the upgrade:\n%s", strings.Join(failures, "\n"))
		}
		echo(t, conn, r, "after the upgrade")
		now := clusterStatus(t, repo)
		for _, name := range []string{"srv", "far"} {
			if b, a := stacks[ns+"/"+name].PID, now[ns+"/"+name].PID; b == 0 || a != b {
				t.Errorf("%s's stack: PID %d before the upgrade, %d after: restarted", name, b, a)
			}
		}
	})

	// The chart's own check (templates/tests/): a pod on the pod network
	// that starts and exits 0.
	step("HelmTest", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		if out, err := run(ctx, repo, helm, "test", "cni-usernet", "-n", "kube-system", "--timeout=3m"); err != nil {
			t.Fatalf("helm test: %v\n%s", err, out)
		}
	})

	step("NewPodAfterUpgrade", func(t *testing.T) {
		apply(t, podManifest(ns, "late", ""))
		mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/late", "--timeout=3m")
		addr := getPod(t, ns, "late").Status.PodIP
		body, err := httpGet("http://" + net.JoinHostPort(addr, "8080") + "/")
		if err != nil {
			t.Fatal(err)
		}
		wantHTTP(t, "node -> late", body, "late", "")
	})
}

// clusterStatus is `cni-usernet status --json` of both nodes, keyed by pod.
func clusterStatus(t *testing.T, repo string) map[string]statusRow {
	t.Helper()
	m := nodeStatus(t)
	if node2() != "" {
		for k, v := range node2Status(t, repo) {
			m[k] = v
		}
	}
	return m
}

// imageValues are the chart's --set values that run ref.
func imageValues(t *testing.T, ref string) string {
	t.Helper()
	i := strings.LastIndex(ref, ":")
	if i < strings.LastIndex(ref, "/") {
		t.Fatalf("image %q has no tag", ref)
	}
	return "image.repository=" + ref[:i] + ",image.tag=" + ref[i+1:]
}

// imageRef is the agent's image a manifest names.
func imageRef(t *testing.T, manifest string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s+image:\s*"?([^"\s]+)"?\s*$`).FindStringSubmatch(manifest)
	if m == nil {
		t.Fatal("the manifest names no image")
	}
	return m[1]
}
