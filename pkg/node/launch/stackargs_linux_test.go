package launch

import "testing"

// TestStackConfigOf: the command line a stack is started with is the one
// FindStacks recognises, and nothing else is.
func TestStackConfigOf(t *testing.T) {
	const config = "/var/lib/cni-usernet/stacks/abc/config.json"
	argv := append([]string{"/opt/cni/bin/cni-usernet-stack"}, StackArgs(config)...)
	if got, ok := StackConfigOf(argv); !ok || got != config {
		t.Fatalf("StackConfigOf(%q) = %q, %v; want %q, true", argv, got, ok, config)
	}
	for _, argv := range [][]string{
		{"/opt/cni/bin/cni-usernet-stack", "stack", "--config"},
		{"/opt/cni/bin/cni-usernet-stack", "stack", "--conf", config},
		{"/opt/cni/bin/cni-usernet-stack", "status", "--config", config},
		{"/opt/cni/bin/cni-usernet-stack", "stack", "--config", config, "extra"},
	} {
		if got, ok := StackConfigOf(argv); ok {
			t.Errorf("StackConfigOf(%q) = %q, true; want not a stack", argv, got)
		}
	}
}
