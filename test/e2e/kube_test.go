package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// run runs a command and returns its standard output; the error carries
// the command and its standard error.
func run(ctx context.Context, dir string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s%s", name, strings.Join(args, " "), err,
			strings.TrimSpace(errb.String()), tail(out.String()))
	}
	return out.String(), nil
}

func tail(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return "\n(stdout: " + s + ")"
}

// kubectl runs kubectl with a two-minute bound.
func kubectl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return run(ctx, "", "kubectl", args...)
}

func mustKubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := kubectl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func kubectlJSON(v any, args ...string) error {
	out, err := kubectl(append(args, "-o", "json")...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		return fmt.Errorf("decoding kubectl %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// apply feeds a manifest to kubectl apply.
func apply(t *testing.T, manifest string) {
	t.Helper()
	cmd := exec.Command("kubectl", "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v: %s\n%s", err, out, manifest)
	}
}

// eventually polls f until it returns nil or the timeout passes, and fails
// the test with f's last error.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	if err := poll(timeout, f); err != nil {
		t.Fatalf("%s: not within %v: %v", what, timeout, err)
	}
}

func poll(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Second)
	}
}

// node is the one node of the cluster.
type node struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Status struct {
		Conditions []struct {
			Type    string `json:"type"`
			Status  string `json:"status"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"conditions"`
	} `json:"status"`
}

// ready returns the node's Ready condition status and message.
func (n node) ready() (bool, string) {
	for _, c := range n.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True", c.Reason + ": " + c.Message
		}
	}
	return false, "no Ready condition"
}

// getNode returns the named node.
func getNode(t *testing.T, name string) node {
	t.Helper()
	var n node
	if err := kubectlJSON(&n, "get", "node", name); err != nil {
		t.Fatal(err)
	}
	return n
}

// nodeReady is the Ready condition of node 1, the machine itself.
func nodeReady(t *testing.T) (bool, string) {
	t.Helper()
	return getNode(t, node1()).ready()
}

type pod struct {
	Metadata struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		UID         string            `json:"uid"`
		Annotations map[string]string `json:"annotations"`
		// DeletionTimestamp is set once the pod is being deleted.
		DeletionTimestamp string `json:"deletionTimestamp"`
	} `json:"metadata"`
	Status struct {
		Phase  string `json:"phase"`
		PodIP  string `json:"podIP"`
		PodIPs []struct {
			IP string `json:"ip"`
		} `json:"podIPs"`
	} `json:"status"`
}

func getPod(t *testing.T, ns, name string) pod {
	t.Helper()
	var p pod
	if err := kubectlJSON(&p, "-n", ns, "get", "pod", name); err != nil {
		t.Fatal(err)
	}
	return p
}

type event struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Type    string `json:"type"`
	Source  struct {
		Component string `json:"component"`
	} `json:"source"`
	ReportingComponent string `json:"reportingComponent"`
}

// podEvents lists the events of a pod, the way the README tells users to.
func podEvents(ns, name string) ([]event, error) {
	var l struct{ Items []event }
	err := kubectlJSON(&l, "-n", ns, "get", "events", "--field-selector", "involvedObject.kind=Pod,involvedObject.name="+name)
	return l.Items, err
}

func formatEvents(evs []event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "\n  %s %s: %s", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// readmeBlock returns the fenced block of README.md between
// <!-- MARKER --> and <!-- /MARKER -->: the commands users are told to run.
func readmeBlock(t *testing.T, repo, marker string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	open, end := "<!-- "+marker+" -->", "<!-- /"+marker+" -->"
	i, j := strings.Index(s, open), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("README.md has no %s ... %s section", open, end)
	}
	sec := s[i+len(open) : j]
	k := strings.Index(sec, "```")
	if k < 0 {
		t.Fatalf("README.md section %s has no fenced block", marker)
	}
	sec = sec[k+3:]
	sec = sec[strings.Index(sec, "\n")+1:] // the fence's info string
	k = strings.Index(sec, "```")
	if k < 0 {
		t.Fatalf("README.md section %s: fenced block not closed", marker)
	}
	if strings.Contains(sec[k+3:], "```") {
		t.Fatalf("README.md section %s has more than one fenced block", marker)
	}
	return sec[:k]
}

// runREADME runs a README block with bash in the repository, as a user would
// paste it, stopping at the first failing command.
func runREADME(t *testing.T, repo, marker string, timeout time.Duration) {
	t.Helper()
	block := readmeBlock(t, repo, marker)
	t.Logf("README %s:\n%s", marker, block)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-x", "-c", block)
	cmd.Dir = repo
	out, err := cmd.CombinedOutput()
	t.Logf("output:\n%s", out)
	if err != nil {
		t.Fatalf("README %s block failed: %v", marker, err)
	}
}

// snapshot describes every entry under the directories: type, mode and, for
// files, a hash of the content; for symlinks, the target.
func snapshot(t *testing.T, dirs ...string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if errors.Is(err, fs.ErrNotExist) && p == d {
				m[p] = "absent"
				return nil
			}
			if err != nil {
				return err
			}
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				target, err := os.Readlink(p)
				if err != nil {
					return err
				}
				m[p] = "symlink " + target
			case fi.IsDir():
				m[p] = "dir " + fi.Mode().String()
			default:
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				sum := sha256.Sum256(b)
				m[p] = fi.Mode().String() + " " + hex.EncodeToString(sum[:])
			}
			return nil
		})
		if err != nil {
			t.Fatalf("snapshot of %s: %v", d, err)
		}
	}
	return m
}

func diffSnapshots(before, after map[string]string) []string {
	var d []string
	for p, b := range before {
		a, ok := after[p]
		switch {
		case !ok:
			d = append(d, "gone: "+p+" ("+b+")")
		case a != b:
			d = append(d, "changed: "+p+" ("+b+" -> "+a+")")
		}
	}
	for p, a := range after {
		if _, ok := before[p]; !ok {
			d = append(d, "added: "+p+" ("+a+")")
		}
	}
	return d
}
