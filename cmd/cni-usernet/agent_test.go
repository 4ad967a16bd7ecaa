package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAgentCommandRunsTheAgent: `cni-usernet agent`, the command an
// earlier chart's DaemonSet gives the image's entrypoint, runs the agent
// beside the binary with the same arguments, and says which file it
// looked for when the agent is not there.
func TestAgentCommandRunsTheAgent(t *testing.T) {
	dir := t.TempDir()
	for name, pkg := range map[string]string{"cni-usernet": ".", agentBinary: "../cni-usernet-agent"} {
		build := exec.Command("go", "build", "-o", filepath.Join(dir, name), pkg)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	plugin := filepath.Join(dir, "cni-usernet")

	out, err := exec.Command(plugin, "agent", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("cni-usernet agent --help: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "-node-name") {
		t.Errorf("cni-usernet agent --help printed no agent flags:\n%s", out)
	}
	out, err = exec.Command(plugin, "agent", "--no-such-flag").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "cni-usernet-agent:") || !strings.Contains(string(out), "no-such-flag") {
		t.Errorf("cni-usernet agent --no-such-flag: %v, want the agent's own refusal:\n%s", err, out)
	}

	if err := os.Remove(filepath.Join(dir, agentBinary)); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(plugin, "agent", "--help").CombinedOutput()
	if err == nil || !strings.Contains(string(out), filepath.Join(dir, agentBinary)) {
		t.Errorf("without the agent beside it: %v, want an error naming it:\n%s", err, out)
	}
}
