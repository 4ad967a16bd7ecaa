package nettest

import (
	"testing"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

func TestStateKeyIsStates(t *testing.T) {
	for _, id := range []string{"pod1-123", "abc", ""} {
		if got, want := stateKey(id, "eth0"), state.Key(id, "eth0"); got != want {
			t.Errorf("stateKey(%q): got %s, want state.Key's %s", id, got, want)
		}
	}
}
