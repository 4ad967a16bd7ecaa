package reliability

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// previousRelease is the release a rollback goes back to (version-1 specs).
const previousRelease = "900993d"

// rewriteJSON changes a JSON file in place.
func rewriteJSON(t *testing.T, path string, change func(m map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	change(m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// killStack kills the pod's stack and waits until it is gone.
func killStack(t *testing.T, env *nettest.Env, pod *nettest.Pod) launch.Process {
	t.Helper()
	p := stackOf(t, env, pod)
	if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); launch.Alive(p); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stack %d still alive 5 s after SIGKILL", p.PID)
		}
	}
	return p
}

// TestSkewOlderFilesRestarted: a stack recorded by an older release (a
// spec of version 1, a configuration without a version, the multi-call
// binary as the stack's binary: what previousRelease wrote) and killed is
// restarted by this release's agent from the stack binary beside the
// recorded one, serves the pod, reports its protocol and health, and
// stamps the spec with this release's version, which previousRelease's stack
// refuses (its check is version != 1).
func TestSkewOlderFilesRestarted(t *testing.T) {
	env, pod := newEnvPod(t, nil)
	echoServer(t, pod.NS, 7000)
	addr := nettest.HostPort(pod.IP(4), 7000)
	att := loadAtt(t, env, pod)
	dead := killStack(t, env, pod)
	rewriteJSON(t, att.SpecPath, func(m map[string]any) { m["version"] = 1 })
	rewriteJSON(t, att.ConfigPath, func(m map[string]any) { delete(m, "version") })
	multi := filepath.Join(env.BinDir, "cni-usernet")
	store := state.Store{Dir: filepath.Join(env.Dir, "state")}
	att.StackBinary = multi
	if err := store.Save(att); err != nil {
		t.Fatal(err)
	}

	startAgent(t, env)
	var now launch.Process
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		now = lockedStackOf(t, env, pod)
		if now != dead && launch.Alive(now) && roundTrip(env.Node, addr) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("older-format attachment not served within 15 s: stack %+v (killed %+v)", now, dead)
		}
	}
	att = loadAtt(t, env, pod)
	if want := filepath.Join(env.BinDir, "cni-usernet-stack"); att.StackBinary != want {
		t.Errorf("stack binary recorded after the restart: got %s, want %s (the stack's own, not the multi-call binary a rollback replaces)", att.StackBinary, want)
	}
	spec, err := podnet.ReadSpec(att.SpecPath)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Version != podnet.SpecVersion || spec.Version == 1 {
		t.Errorf("spec version after this release's stack started: got %d, want %d (a version-1 stack must refuse it)", spec.Version, podnet.SpecVersion)
	}
	var st control.Status
	if err := control.FetchStatus(att.ControlSocket, 5*time.Second, &st); err != nil {
		t.Fatal(err)
	}
	if st.Protocol != control.Protocol || !st.Healthy || st.SpecVersion != podnet.SpecVersion || st.ConfigVersion != stackconfig.Version {
		t.Errorf("status: protocol %d, healthy %v (%s), spec %d, config %d; want %d, true, %d, %d",
			st.Protocol, st.Healthy, st.Problem, st.SpecVersion, st.ConfigVersion, control.Protocol, podnet.SpecVersion, stackconfig.Version)
	}
	if err := env.Check(pod.Conf, pod.ID, pod.NS); err != nil {
		t.Errorf("CHECK after the restart: %v", err)
	}
}

// TestSkewNewerFilesRefused: a killed stack whose configuration or spec
// is of a newer format than this release understands is not restarted:
// the agent logs why, the attachment is reported unhealthy with the
// reason (CHECK fails with it), and no stack runs the pod wrong.
func TestSkewNewerFilesRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		file func(*state.Attachment) string
		key  string
		v    int
	}{
		{"config", func(a *state.Attachment) string { return a.ConfigPath }, "version", stackconfig.Version + 1},
		{"spec", func(a *state.Attachment) string { return a.SpecPath }, "version", podnet.SpecVersion + 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			env, pod := newEnvPod(t, nil)
			att := loadAtt(t, env, pod)
			dead := killStack(t, env, pod)
			rewriteJSON(t, c.file(att), func(m map[string]any) { m[c.key] = c.v })
			agent := startAgent(t, env)
			var sv *state.Supervision
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				a := loadAtt(t, env, pod)
				if sv = a.Supervision; sv != nil && strings.Contains(sv.Unhealthy, "not restarted") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no refusal recorded within 10 s: supervision %+v\nagent log:\n%s", sv, agent.Output())
				}
			}
			if !strings.Contains(sv.Unhealthy, "newer cni-usernet") {
				t.Errorf("reason: got %q, want it to say the files are from a newer cni-usernet", sv.Unhealthy)
			}
			if now := lockedStackOf(t, env, pod); now != dead || launch.Alive(now) {
				t.Errorf("a stack was started for the newer files: %+v", now)
			}
			if !strings.Contains(agent.Output(), "stack not restarted") {
				t.Errorf("agent log does not say it refused:\n%s", agent.Output())
			}
			err := env.Check(pod.Conf, pod.ID, pod.NS)
			if err == nil || !strings.Contains(err.Error(), "not restarted") {
				t.Errorf("CHECK: got %v, want the refusal", err)
			}
		})
	}
}

// TestSkewRollbackToPreviousRelease is a rollback: a stack this release
// started is killed, and the previous release (previousRelease, built
// from git) restarts it as its agent would (its binary's stack command on
// the recorded configuration, in the pod's namespace). Before spec
// version 2 that stack came up, answered its health check, and passed
// nothing: this release's divert (an nftables table and a policy rule in
// the pod's namespace) stayed and sent the applications' packets to
// listeners that were gone. Now it refuses the spec and exits, which the
// previous release's agent reports as a failed start, then a crash loop.
func TestSkewRollbackToPreviousRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds " + previousRelease + " from git (about a minute); run without -short")
	}
	old := buildPreviousRelease(t)
	env, pod := newEnvPod(t, nil)
	att := loadAtt(t, env, pod)
	killStack(t, env, pod)
	logPath := filepath.Join(t.TempDir(), "previous-release-stack.log")
	p, err := launch.Start(launch.Options{Binary: old, Args: launch.StackArgs(att.ConfigPath),
		Netns: att.Netns, LogPath: logPath, ReadyTimeout: 10 * time.Second})
	if err == nil {
		launch.Stop(p, 5*time.Second)
		t.Fatalf("%s's stack started on a spec of version %d: it would run the pod in a namespace it does not know", previousRelease, podnet.SpecVersion)
	}
	b, _ := os.ReadFile(logPath)
	if !strings.Contains(err.Error()+string(b), "spec version") {
		t.Errorf("%s's stack failed for another reason than the spec's version: %v\n%s", previousRelease, err, b)
	}
	t.Logf("%s's stack refused the pod: %v", previousRelease, err)
}

// buildPreviousRelease builds previousRelease's cni-usernet from this
// repository's history, skipping when the history is not there.
func buildPreviousRelease(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("git", "-C", root, "cat-file", "-e", previousRelease+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s not in this repository's history: %v", previousRelease, err)
	}
	src := t.TempDir()
	archive := exec.Command("git", "-C", root, "archive", previousRelease)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v", previousRelease, err)
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("unpacking %s: %v", previousRelease, err)
	}
	if _, err := os.Stat(filepath.Join(src, "hack/gvisor/patch.sh")); err == nil {
		patch := exec.Command("hack/gvisor/patch.sh")
		patch.Dir = src
		if b, err := patch.CombinedOutput(); err != nil {
			t.Fatalf("patching %s's gVisor: %v\n%s", previousRelease, err, b)
		}
	}
	out := filepath.Join(t.TempDir(), "cni-usernet")
	build := exec.Command("go", "build", "-o", out, "./cmd/cni-usernet")
	build.Dir = src
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", previousRelease, err, b)
	}
	return out
}
