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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/test/lib/promcheck"
)

// previousRelease is the release the upgrade and rollback go from and
// back to; its image is built from this repository's history.
const previousRelease = "900993d"

// TestKubernetesReleaseSkew rolls the cluster from the previous release to
// this one and back with pods running, as an operator would: the
// previous release installed (its image built from git), pods on both
// nodes and a connection open; this release applied over it (the
// connection survives, every pod stays served, a stack the previous
// release started and that is killed is restarted, a new pod is served);
// the previous release applied again (the same, and a stack this release
// started, killed, is either served again or reported unhealthy with a
// reason: never a healthy-looking dead pod; on the lab, previousRelease's agent
// restarts it from its own binary, which refuses the version-2 spec, and
// reports the crash loop); then this release again, and
// the uninstall. Standalone mode only; it runs on a cluster without
// cni-usernet, as TestKubernetes does.
func TestKubernetesReleaseSkew(t *testing.T) {
	repo := standaloneOnCleanCluster(t, "the release skew")
	// This release's image, imported here: run on its own, the test
	// cannot count on TestKubernetes's install having imported it.
	current := thisReleaseManifest(t, repo)
	previous := buildPreviousImage(t, repo)
	suffix := make([]byte, 3)
	rand.Read(suffix)
	ns := "cu-skew-" + hex.EncodeToString(suffix)
	t.Cleanup(func() {
		// Pods first (their DEL needs the plugin), then this release's
		// uninstall.
		kubectl("delete", "ns", ns, "--wait=true", "--timeout=90s")
		kubectl("-n", "kube-system", "scale", "deploy/coredns", "--replicas=0")
		if _, err := kubectl("-n", "kube-system", "get", "ds", "cni-usernet"); err == nil {
			apply(t, current)
			kubectl("-n", "kube-system", "rollout", "status", "ds/cni-usernet", "--timeout=3m")
			cmd := exec.Command("kubectl", "delete", "-f", "-", "--wait=true", "--timeout=90s")
			cmd.Stdin = strings.NewReader(current)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Logf("cleanup: %v: %s", err, out)
			}
			waitAgentGone(t)
			waitNodesNotReady(t)
		}
	})

	install := func(t *testing.T, what, manifest string) {
		t.Helper()
		apply(t, manifest)
		mustKubectl(t, "-n", "kube-system", "rollout", "status", "ds/cni-usernet", "--timeout=5m")
		eventually(t, 2*time.Minute, what+" installed on node 1", func() error {
			if ok, why := nodeReady(t); !ok {
				return fmt.Errorf("node NotReady: %s", why)
			}
			return nil
		})
	}
	install(t, previousRelease, previous)
	buildPodImage(t, repo)
	mustKubectl(t, "create", "ns", ns)
	apply(t, podManifest(ns, "srv", "")+podManifestOn(ns, "far", "", node2OrNode1(), nil))
	mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/srv", "pod/far", "--timeout=3m")
	ip := map[string]string{"srv": getPod(t, ns, "srv").Status.PodIP, "far": getPod(t, ns, "far").Status.PodIP}

	conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip["srv"], "9000"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	echo(t, conn, r, "under "+previousRelease)

	served := func(t *testing.T, when string, within time.Duration) {
		t.Helper()
		for name, addr := range ip {
			eventually(t, within, name+" served "+when, func() error {
				body, err := httpGet("http://" + net.JoinHostPort(addr, "8080") + "/")
				if err == nil && !strings.HasPrefix(body, "pod="+name+" ") {
					err = fmt.Errorf("answer %q", body)
				}
				return err
			})
		}
	}
	// killAndWatch kills name's stack on node 1 and waits until it is
	// served again, or (refusal) reported unhealthy with a reason; a stack
	// that the status calls healthy while the pod does not answer fails.
	killAndWatch := func(t *testing.T, name string, refusal bool) {
		t.Helper()
		old := nodeStatus(t)[ns+"/"+name].PID
		if old == 0 {
			t.Fatalf("%s: no stack in the node's status", name)
		}
		logRecord(t, ns, name)
		if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
			t.Fatalf("killing %s's stack %d: %v", name, old, err)
		}
		var healthyDead time.Time
		defer func() {
			if t.Failed() {
				logRecord(t, ns, name)
				out, _ := kubectl("-n", "kube-system", "logs", "-l", "app.kubernetes.io/name=cni-usernet", "--tail=20", "--prefix")
				t.Logf("agents' logs:\n%s", out)
			}
		}()
		eventually(t, 2*time.Minute, name+" served again or refused loudly", func() error {
			row := nodeStatus(t)[ns+"/"+name]
			if sv := supervisionOf(ns, name); refusal && sv != nil && sv.Unhealthy != "" && !stackAlive(row.PID) {
				// previousRelease's agent, which here cannot enter the node's
				// mount namespace, restarts stacks from its own binary:
				// that stack refuses a spec of version 2, and the agent
				// reports the crash loop.
				t.Logf("%s: refused loudly: %s", name, sv.Unhealthy)
				return nil
			}
			if row.PID == old || row.PID == 0 {
				return fmt.Errorf("%s: not restarted yet (%s)", name, row.Problem)
			}
			if !row.Healthy {
				return fmt.Errorf("%s: unhealthy without a reason yet (pid %d)", name, row.PID)
			}
			body, err := httpGet("http://" + net.JoinHostPort(ip[name], "8080") + "/")
			if err == nil && strings.HasPrefix(body, "pod="+name+" ") {
				t.Logf("%s: restarted (pid %d) and served", name, row.PID)
				return nil
			}
			if healthyDead.IsZero() {
				healthyDead = time.Now()
			}
			if time.Since(healthyDead) > 30*time.Second {
				t.Fatalf("%s: status says healthy (stack %d) and the pod has not answered for 30 s: %v", name, row.PID, err)
			}
			return fmt.Errorf("%s: healthy, not answering yet: %v", name, err)
		})
	}

	t.Run("UpgradeToThisRelease", func(t *testing.T) {
		install(t, "this release", current)
		echo(t, conn, r, "after the upgrade")
		served(t, "after the upgrade", 30*time.Second)
		// srv's stack is still the previous release's, which has no
		// capture stream: this release's agent scrapes it, and this
		// release's capture says why it cannot tap it and what to do.
		checkOldStackMetrics(t, ns, "srv")
		checkCaptureRefused(t, ns, "srv", "runs an earlier release")
		killAndWatch(t, "srv", false) // started by the previous release
		checkCapture(t, ns, "srv", ip["srv"])
		apply(t, podManifest(ns, "late", ""))
		mustKubectl(t, "-n", ns, "wait", "--for=condition=Ready", "pod/late", "--timeout=2m")
		ip["late"] = getPod(t, ns, "late").Status.PodIP
		served(t, "after the upgrade, with a new pod", 30*time.Second)
	})
	t.Run("RollbackToPreviousRelease", func(t *testing.T) {
		install(t, previousRelease, previous)
		served(t, "after the rollback", 30*time.Second)
		killAndWatch(t, "late", true) // started by this release
		killAndWatch(t, "srv", true)  // restarted by this release
	})
	t.Run("UpgradeAgain", func(t *testing.T) {
		install(t, "this release", current)
		// A stack the previous release left crash-looping is restarted
		// within the crash backoff (at most 60 s).
		served(t, "after upgrading again", 2*time.Minute)
	})
}

// supervisionOf is the agent's record of name's stack on node 1.
func supervisionOf(ns, name string) *state.Supervision {
	atts, _ := state.Store{Dir: stateDir}.List()
	for _, a := range atts {
		if a.PodNS == ns && a.PodName == name {
			return a.Supervision
		}
	}
	return nil
}

// logRecord logs what the node records of name's stack (its binary,
// supervision) and what the installed binaries are, for telling after a
// failure which release ran what.
func logRecord(t *testing.T, ns, name string) {
	t.Helper()
	atts, _ := state.Store{Dir: stateDir}.List()
	for _, a := range atts {
		if a.PodNS == ns && a.PodName == name {
			t.Logf("%s: stack %d from %s, supervision %+v", name, a.StackPID, a.StackBinary, a.Supervision)
		}
	}
	for _, f := range []string{installed, installedStack} {
		if fi, err := os.Stat(f); err == nil {
			t.Logf("%s: %d bytes, modified %s", f, fi.Size(), fi.ModTime().UTC().Format(time.TimeOnly))
		} else {
			t.Logf("%s: %v", f, err)
		}
	}
}

// node2OrNode1 is node 2, or node 1 on a single-node lab.
func node2OrNode1() string {
	if n := node2(); n != "" {
		return n
	}
	return node1()
}

// buildPreviousImage builds previousRelease's image from git with a tag of
// its own (node 2 skips importing a tag it has), imports it on the nodes,
// and returns its manifest using that image.
func buildPreviousImage(t *testing.T, repo string) string {
	t.Helper()
	src, image := buildImageAt(t, repo, previousRelease)
	return manifestWithImage(t, src, image)
}

// buildImageAt builds the image of the tree at rev (its own hack/image.sh)
// with a tag of its own, imports it on the nodes, and returns the tree's
// copy and the image's reference.
func buildImageAt(t *testing.T, repo, rev string) (src, image string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := run(ctx, repo, "git", "cat-file", "-e", rev+"^{commit}"); err != nil {
		t.Skipf("commit %s not in this repository's history: %v", rev, err)
	}
	src = t.TempDir()
	if _, err := run(ctx, "", "bash", "-c", fmt.Sprintf("git -C %q archive %s | tar -x -C %q", repo, rev, src)); err != nil {
		t.Fatalf("unpacking %s: %v", rev, err)
	}
	short := rev
	if len(short) > 7 {
		short = short[:7]
	}
	image = "localhost/cni-usernet:e2e-" + short
	tar := filepath.Join(t.TempDir(), "previous.tar")
	cmd := exec.CommandContext(ctx, "hack/image.sh", tar)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "IMAGE="+image, "VERSION="+short)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s's image: %v\n%s", rev, err, out)
	}
	importImage(ctx, t, repo, tar)
	return src, image
}

// checkOldStackMetrics: the agent's scrape has name's series, served by a
// stack of the previous release: up, and its wire leg's bytes counted.
func checkOldStackMetrics(t *testing.T, ns, name string) {
	t.Helper()
	eventually(t, time.Minute, name+"'s series from a stack of "+previousRelease, func() error {
		s := scrapeAgent(t)
		up := s.Find("cni_usernet_pod_stack_up", map[string]string{"namespace": ns, "pod": name})
		if len(up) != 1 || promcheck.Value(up[0]) != 1 {
			return fmt.Errorf("stack_up %v, want one series at 1", up)
		}
		for _, dir := range []string{"ingress", "egress"} {
			b := s.Find("cni_usernet_pod_bytes_total", map[string]string{"namespace": ns, "pod": name, "leg": "wire", "direction": dir})
			if len(b) != 1 || promcheck.Value(b[0]) == 0 {
				return fmt.Errorf("wire %s bytes %v, want one series above 0", dir, b)
			}
		}
		return nil
	})
}

// checkCaptureRefused: `cni-usernet capture` of name fails, saying want.
func checkCaptureRefused(t *testing.T, ns, name, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, installed, "capture", "-w", filepath.Join(t.TempDir(), name+".pcapng"), "--duration", "2s", ns+"/"+name).CombinedOutput()
	if err == nil {
		t.Fatalf("cni-usernet capture of %s succeeded; want it refused (%q):\n%s", name, want, out)
	}
	if !strings.Contains(string(out), want) {
		t.Fatalf("cni-usernet capture of %s failed without saying %q: %v\n%s", name, want, err, out)
	}
	t.Logf("cni-usernet capture of %s (a stack of %s): %s", name, previousRelease, strings.TrimSpace(string(out)))
}
