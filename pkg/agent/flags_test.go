package agent

import (
	"strings"
	"testing"
)

func TestGSOFlag(t *testing.T) {
	f, err := parseAgentFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.gso != "auto" {
		t.Errorf("default --gso: got %q, want auto", f.gso)
	}
	f, err = parseAgentFlags([]string{"--gso=software"})
	if err != nil || f.gso != "software" {
		t.Errorf("--gso=software: got %v, %v; want software", f, err)
	}
	_, err = parseAgentFlags([]string{"--gso=fast"})
	if err == nil || !strings.Contains(err.Error(), "--gso") {
		t.Errorf("--gso=fast: got %v, want an error naming --gso", err)
	}
}
