package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBuildListsTheModulesLinked: the SBOM of a real build names the
// binary with its hash and the modules it links, gVisor as patched.
func TestBuildListsTheModulesLinked(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "cni-usernet-stack")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/cni-usernet/cni-usernet/cmd/cni-usernet-stack")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building: %v\n%s", err, out)
	}
	doc, err := build("v0.0.0-test", []string{bin}, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	var sawBin, sawGVisor, sawNetlink bool
	for _, p := range doc.Packages {
		switch {
		case p.Name == "cni-usernet-stack":
			sawBin = len(p.Checksums) == 1 && len(p.Checksums[0].Value) == 64
		case p.Name == "gvisor.dev/gvisor":
			sawGVisor = strings.Contains(p.Comment, "patched") && p.Version != ""
		case p.Name == "github.com/vishvananda/netlink":
			sawNetlink = len(p.ExternalRefs) == 1 && strings.HasPrefix(p.ExternalRefs[0].Locator, "pkg:golang/github.com/vishvananda/netlink@v")
		}
	}
	if !sawBin || !sawGVisor || !sawNetlink {
		t.Errorf("SBOM: binary with hash %v, gVisor as patched %v, netlink with purl %v; want all", sawBin, sawGVisor, sawNetlink)
	}
	if _, err := build("v0", []string{filepath.Join(t.TempDir(), "missing")}, time.Unix(0, 0)); err == nil {
		t.Error("a missing binary gave no error")
	}
}
