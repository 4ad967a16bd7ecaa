package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/test/lib/promcheck"
)

// releaseVersion is the version TestKubernetesRelease builds its release
// as: a pre-release of v0.0.0, which no published release can be.
const releaseVersion = "v0.0.0-e2e"

// TestKubernetesRelease installs a release the way docs/install.md tells a
// user to, and runs it: hack/release.sh builds the release's files, their
// SHA256SUMS are checked, the release's OCI image tarball is imported on
// both nodes and its packaged chart installed with its defaults, so that
// the image the agents run is the one the release names. Two pods on the
// two nodes then talk, a NetworkPolicy denies and then allows, `helm
// upgrade --set gso=software` rolls the agents while a connection stays
// open and gives a new pod the new default, and `helm uninstall` leaves
// every node as it was before the install. Standalone mode only; it runs
// on a cluster without cni-usernet, as TestKubernetes does.
func TestKubernetesRelease(t *testing.T) {
	repo := standaloneOnCleanCluster(t, "the release")
	start := time.Now()
	since := func() string { return time.Since(start).Round(time.Second).String() }
	suffix := make([]byte, 3)
	rand.Read(suffix)
	ns := "cu-rel-" + hex.EncodeToString(suffix)
	helm := filepath.Join(repo, "bin", "helm") // hack/release.sh makes it
	chart := "cni-usernet-" + strings.TrimPrefix(releaseVersion, "v") + ".tgz"

	// A failed step stops the test: the next ones need what it set up.
	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}

	// What the nodes have before the install, for the uninstall to match.
	before := snapshot(t, cniConfDir, cniBinDir)
	var before2 map[string]string
	if node2() != "" {
		before2 = snapshot(t, node2Dir(cniConfDir), node2Dir(cniBinDir))
	}
	uninstalled := false
	t.Cleanup(func() {
		if uninstalled {
			return
		}
		// Pods first (their DEL needs the plugin), CoreDNS's too, then the
		// Helm release.
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

	// The parent's: a subtest's temporary directory goes with the subtest.
	dir := t.TempDir()
	var image string
	step("Release", func(t *testing.T) {
		image = buildRelease(t, repo, helm, dir, chart)
		t.Logf("release %s in %s, image %s (%s)", releaseVersion, dir, image, since())
	})

	step("HelmInstall", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		importImage(ctx, t, repo, filepath.Join(dir, "cni-usernet-"+releaseVersion+"-image.oci.tar"))
		if out, err := run(ctx, dir, helm, "install", "cni-usernet", chart, "-n", "kube-system"); err != nil {
			t.Fatalf("helm install: %v\n%s", err, out)
		}
		mustKubectl(t, "-n", "kube-system", "rollout", "status", "ds/cni-usernet", "--timeout=5m")
		nodesReady(t, repo)
		if got := strings.TrimSpace(mustKubectl(t, "-n", "kube-system", "get", "ds", "cni-usernet",
			"-o", "jsonpath={.spec.template.spec.containers[0].image}")); got != image {
			t.Fatalf("the DaemonSet runs %s, want the release's %s", got, image)
		}
		// The binaries the agents installed are the release's.
		want := "cni-usernet " + releaseVersion
		for _, n := range labNodes(repo) {
			out, err := n.exec(installed, "version")
			if err != nil || strings.TrimSpace(out) != want {
				t.Errorf("%s: %s version: %q, %v; want %q", n.name, installed, strings.TrimSpace(out), err, want)
			}
		}
		t.Logf("installed with the chart %s (%s)", chart, since())
	})

	ip := map[string]string{}
	var network string
	step("Pods", func(t *testing.T) {
		buildPodImage(t, repo)
		mustKubectl(t, "create", "ns", ns)
		apply(t, podManifest(ns, "srv", "")+podManifestOn(ns, "far", "", node2OrNode1(), nil))
		mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/srv", "pod/far", "--timeout=3m")
		for _, name := range []string{"srv", "far"} {
			ip[name] = getPod(t, ns, name).Status.PodIP
		}
		var err error
		if _, network, _, err = installedConflist(); err != nil {
			t.Fatal(err)
		}
		t.Logf("srv %s on %s, far %s on %s (%s)", ip["srv"], node1(), ip["far"], node2OrNode1(), since())
	})

	step("Traffic", func(t *testing.T) { releaseTraffic(t, ns, ip) })

	step("NetworkPolicy", func(t *testing.T) {
		url := "http://" + net.JoinHostPort(ip["srv"], "8080") + "/"
		fromFar := func() (string, error) {
			return kubectl("-n", ns, "exec", "far", "--", "timeout", "5", "wget", "-qO-", url)
		}
		apply(t, fmt.Sprintf(`---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: srv-deny, namespace: %q}
spec:
  podSelector: {matchLabels: {app: srv}}
  policyTypes: [Ingress]
`, ns))
		// Denied is dropped unanswered: wget waits until timeout kills it
		// (busybox's timeout exits 128+SIGTERM), neither answered nor
		// refused.
		eventually(t, time.Minute, "far -> srv denied", func() error {
			out, err := fromFar()
			if err == nil {
				return fmt.Errorf("answered %q", strings.TrimSpace(out))
			}
			if !strings.Contains(err.Error(), "exit code 143") {
				return fmt.Errorf("failed, but not by waiting for an answer: %v", err)
			}
			return nil
		})
		eventually(t, time.Minute, "srv's stack counts the denial", func() error {
			d := scrapeAgent(t).Find("cni_usernet_pod_policy_denied_total", map[string]string{
				"namespace": ns, "pod": "srv", "direction": "ingress", "policy": ns + "/srv-deny"})
			if len(d) != 1 || promcheck.Value(d[0]) == 0 {
				return fmt.Errorf("policy_denied_total %v, want one series above 0", d)
			}
			return nil
		})
		// The node reaches its pods whatever their policy (the kubelet's
		// probes).
		if body, err := httpGet(url); err != nil {
			t.Errorf("node -> srv under deny-all ingress: %v", err)
		} else {
			wantHTTP(t, "node -> srv under deny-all ingress", body, "srv", "")
		}
		apply(t, fmt.Sprintf(`---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: srv-from-far, namespace: %q}
spec:
  podSelector: {matchLabels: {app: srv}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {app: far}}}]
    ports: [{protocol: TCP, port: 8080}]
`, ns))
		eventually(t, time.Minute, "far -> srv allowed again", func() error {
			out, err := fromFar()
			if err != nil {
				return err
			}
			if !strings.HasPrefix(out, "pod=srv ") || !strings.Contains(out, "client="+net.JoinHostPort(ip["far"], "")) {
				return fmt.Errorf("answer %q, want srv's, seeing far's address %s", out, ip["far"])
			}
			return nil
		})
		t.Logf("denied, then allowed (%s)", since())
	})

	step("Accounted", func(t *testing.T) {
		nodesAccountFor(t, repo, network, otherPodCIDRs(t), 2*time.Minute)
	})

	step("HelmUpgrade", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip["srv"], "9000"), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		r := bufio.NewReader(conn)
		echo(t, conn, r, "before the upgrade")
		stack := nodeStatus(t)[ns+"/srv"].PID
		agents := agentPods(t)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if out, err := run(ctx, dir, helm, "upgrade", "cni-usernet", chart, "-n", "kube-system", "--reset-then-reuse-values", "--set", "gso=software"); err != nil {
			t.Fatalf("helm upgrade: %v\n%s", err, out)
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
		t.Logf("agents %v replaced by %v", agents, agentPods(t))
		echo(t, conn, r, "after the upgrade")
		if now := nodeStatus(t)[ns+"/srv"].PID; now != stack {
			t.Errorf("srv's stack: pid %d before the upgrade, %d after; want the same process", stack, now)
		}
		releaseTraffic(t, ns, ip)
		// A pod created now, without an annotation, gets the new default.
		apply(t, podManifest(ns, "late", ""))
		mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/late", "--timeout=2m")
		if row := nodeStatus(t)[ns+"/late"]; row.GSO.Mode != "software" {
			t.Errorf("late (no annotation, gso=software): gso.mode %q (%s), want software", row.GSO.Mode, row.GSO.Reason)
		} else {
			t.Logf("late: gso %s (%s)", row.GSO.Mode, row.GSO.Reason)
		}
		body, err := httpGet("http://" + net.JoinHostPort(getPod(t, ns, "late").Status.PodIP, "8080") + "/")
		if err != nil {
			t.Fatalf("node -> late: %v", err)
		}
		wantHTTP(t, "node -> late", body, "late", "")
		t.Logf("upgraded, the connection kept (%s)", since())
	})

	step("HelmUninstall", func(t *testing.T) {
		mustKubectl(t, "delete", "ns", ns, "--wait=true", "--timeout=2m")
		mustKubectl(t, "-n", "kube-system", "scale", "deploy/coredns", "--replicas=0")
		mustKubectl(t, "-n", "kube-system", "wait", "--for=delete", "pod", "-l", "k8s-app=kube-dns", "--timeout=2m")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if out, err := run(ctx, dir, helm, "uninstall", "cni-usernet", "-n", "kube-system", "--wait", "--timeout=2m"); err != nil {
			t.Fatalf("helm uninstall: %v\n%s", err, out)
		}
		uninstalled = true
		waitAgentGone(t)
		for _, obj := range []string{"daemonset/cni-usernet", "serviceaccount/cni-usernet", "clusterrole/cni-usernet", "clusterrolebinding/cni-usernet"} {
			if out, err := kubectl("-n", "kube-system", "get", obj, "--ignore-not-found", "-o", "name"); err != nil || strings.TrimSpace(out) != "" {
				t.Errorf("after helm uninstall, %s: %q, %v; want it gone", obj, strings.TrimSpace(out), err)
			}
		}
		eventually(t, time.Minute, "node 1's /etc/cni/net.d and /opt/cni/bin as before the install", func() error {
			if d := diffSnapshots(before, snapshot(t, cniConfDir, cniBinDir)); d != nil {
				return fmt.Errorf("\n  %s", strings.Join(d, "\n  "))
			}
			return nil
		})
		if node2() != "" {
			eventually(t, time.Minute, "node 2's /etc/cni/net.d and /opt/cni/bin as before the install", func() error {
				if d := diffSnapshots(before2, snapshot(t, node2Dir(cniConfDir), node2Dir(cniBinDir))); d != nil {
					return fmt.Errorf("\n  %s", strings.Join(d, "\n  "))
				}
				return nil
			})
		}
		// No stack, veth, lease, state file or route left on any node.
		none := map[string][]string{}
		for _, n := range labNodes(repo) {
			none[n.name] = []string{}
		}
		nodesAccountFor(t, repo, network, none, time.Minute)
		waitNodesNotReady(t)
		t.Logf("uninstalled, the nodes as before (%s)", since())
	})
}

// buildRelease runs hack/release.sh for releaseVersion into dir, checks
// its SHA256SUMS as a user would, and returns the image the release names:
// the one its OCI tarball carries, which its chart's defaults and its
// rendered manifest must name.
func buildRelease(t *testing.T, repo, helm, dir, chart string) (image string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if out, err := run(ctx, repo, "hack/release.sh", releaseVersion, dir); err != nil {
		t.Fatalf("hack/release.sh: %v", err)
	} else {
		t.Logf("hack/release.sh %s:\n%s", releaseVersion, strings.TrimSpace(out))
	}
	if out, err := run(ctx, dir, "sha256sum", "-c", "SHA256SUMS"); err != nil {
		t.Fatalf("the release's SHA256SUMS: %v", err)
	} else {
		t.Logf("sha256sum -c SHA256SUMS:\n%s", strings.TrimSpace(out))
	}
	releaseSBOM(t, dir)
	index, err := run(ctx, "", "tar", "-xOf", filepath.Join(dir, "cni-usernet-"+releaseVersion+"-image.oci.tar"), "index.json")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`"io.containerd.image.name":"([^"]+)"`).FindStringSubmatch(index)
	if m == nil {
		t.Fatalf("the release's image tarball names no image: %s", index)
	}
	image = m[1]
	if !strings.HasSuffix(image, ":"+releaseVersion) {
		t.Fatalf("the release's image is %s, want the tag %s", image, releaseVersion)
	}
	rendered, err := run(ctx, dir, helm, "template", "cni-usernet", chart, "-n", "kube-system")
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(dir, "cni-usernet.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for what, text := range map[string]string{"the chart's defaults": rendered, "cni-usernet.yaml": string(manifest)} {
		// The agent's container and, in the chart's render, its helm
		// test pod run the release's image; any other name would be
		// pulled from somewhere the release did not publish.
		got := imageLines.FindAllStringSubmatch(text, -1)
		if len(got) == 0 {
			t.Errorf("%s name no image, want %s", what, image)
		}
		for _, m := range got {
			if m[1] != image {
				t.Errorf("%s name the image %s, want only %s", what, m[1], image)
			}
		}
	}
	if strings.Contains(string(manifest), "helm.sh/hook") {
		t.Errorf("cni-usernet.yaml holds a Helm hook (kubectl apply would create it as an ordinary object)")
	}
	if t.Failed() {
		t.FailNow()
	}
	return image
}

// releaseSBOM checks that the release's SBOM describes every binary of
// its amd64 tarball, the agent's among them, by name and SHA-256: what the
// release workflow attests to the image is what the image holds.
func releaseSBOM(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "sbom.spdx.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Packages []struct {
			ID        string `json:"SPDXID"`
			Name      string `json:"name"`
			Checksums []struct {
				Value string `json:"checksumValue"`
			} `json:"checksums"`
		} `json:"packages"`
		Relationships []struct {
			Element string `json:"spdxElementId"`
			Type    string `json:"relationshipType"`
			Related string `json:"relatedSpdxElement"`
		} `json:"relationships"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("sbom.spdx.json: %v", err)
	}
	described := map[string]bool{}
	for _, r := range doc.Relationships {
		if r.Element == "SPDXRef-DOCUMENT" && r.Type == "DESCRIBES" {
			described[r.Related] = true
		}
	}
	sums := map[string]string{}
	for _, p := range doc.Packages {
		if described[p.ID] && len(p.Checksums) > 0 {
			sums[p.Name] = p.Checksums[0].Value
		}
	}
	unpacked := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := run(ctx, "", "tar", "-xzf", filepath.Join(dir, "cni-usernet-"+releaseVersion+"-linux-amd64.tar.gz"), "-C", unpacked); err != nil {
		t.Fatal(err)
	}
	files, err := os.ReadDir(unpacked)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Name())
		out, err := run(ctx, unpacked, "sha256sum", f.Name())
		if err != nil {
			t.Fatal(err)
		}
		if sum := strings.Fields(out)[0]; sums[f.Name()] != sum {
			t.Errorf("sbom.spdx.json: binary %s described with SHA-256 %q, the release's is %s", f.Name(), sums[f.Name()], sum)
		}
	}
	if !slices.Contains(names, "cni-usernet-agent") || len(sums) != len(names) {
		t.Errorf("sbom.spdx.json describes %d binaries %v; the release's binaries are %v", len(sums), sums, names)
	}
}

// imageLines are the lines of a manifest that name a container's image.
var imageLines = regexp.MustCompile(`(?m)^\s+image: "?([^"\s]+)"?$`)

// nodesReady waits until every node of the lab is Ready.
func nodesReady(t *testing.T, repo string) {
	t.Helper()
	for _, n := range labNodes(repo) {
		eventually(t, 2*time.Minute, "node "+n.name+" Ready", func() error {
			if ok, why := getNode(t, n.name).ready(); !ok {
				return fmt.Errorf("NotReady: %s", why)
			}
			return nil
		})
	}
}

// releaseTraffic checks srv (node 1) and far (node 2) reach each other,
// each seeing the other's address, and answer node 1 over TCP and UDP.
func releaseTraffic(t *testing.T, ns string, ip map[string]string) {
	t.Helper()
	out := podExec(t, ns, "far", "timeout", "15", "wget", "-qO-", "http://"+net.JoinHostPort(ip["srv"], "8080")+"/")
	wantHTTP(t, "far -> srv", out, "srv", ip["far"])
	out = podExec(t, ns, "srv", "timeout", "15", "wget", "-qO-", "http://"+net.JoinHostPort(ip["far"], "8080")+"/")
	wantHTTP(t, "srv -> far", out, "far", ip["srv"])
	for _, name := range []string{"srv", "far"} {
		if body, err := httpGet("http://" + net.JoinHostPort(ip[name], "8080") + "/"); err != nil {
			t.Errorf("node -> %s HTTP: %v", name, err)
		} else {
			wantHTTP(t, "node -> "+name+" HTTP", body, name, "")
		}
		if reply, err := udpEcho(net.JoinHostPort(ip[name], "9090"), "hello-"+name); err != nil {
			t.Errorf("node -> %s UDP: %v", name, err)
		} else if !strings.HasPrefix(reply, "pod="+name+" ") {
			t.Errorf("node -> %s UDP: reply %q", name, reply)
		}
	}
	if err := bulkEcho(net.JoinHostPort(ip["far"], "9000"), 4<<20); err != nil {
		t.Errorf("node -> far TCP echo of 4 MiB: %v", err)
	}
}
