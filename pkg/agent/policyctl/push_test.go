package policyctl

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// The policy file is replaced whole, readable by root only, and no
// temporary file stays beside it.
func TestWritePolicyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.json")
	for _, gen := range []uint64{7, 8} {
		if err := writePolicyFile(path, &policy.PodPolicy{Version: policy.FormatVersion, Generation: gen}); err != nil {
			t.Fatal(err)
		}
		got, err := policy.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if got.Generation != gen {
			t.Errorf("generation %d in the file, want %d", got.Generation, gen)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d files in the directory, want the policy file alone", len(ents))
	}
	if err := writePolicyFile(filepath.Join(dir, "gone", "policy.json"), &policy.PodPolicy{}); err == nil {
		t.Error("writing into a missing directory: no error")
	}
}

// A lone change waits a fifth of the debounce; a stream of changes waits
// no longer than the debounce.
func TestSettle(t *testing.T) {
	c := &Controller{o: Options{Debounce: 500 * time.Millisecond}, kick: make(chan struct{}, 1)}
	start := time.Now()
	if !c.settle(context.Background()) {
		t.Fatal("settle ended without its context ending")
	}
	if d := time.Since(start); d < 100*time.Millisecond || d >= 500*time.Millisecond {
		t.Errorf("a lone change waited %s, want a fifth of the 500ms debounce", d)
	}
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				c.trigger()
			}
		}
	}()
	defer close(stop)
	start = time.Now()
	c.settle(context.Background())
	if d := time.Since(start); d < 500*time.Millisecond || d > 2*time.Second {
		t.Errorf("under a stream of changes settle waited %s, want the 500ms debounce", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if c.settle(ctx) {
		t.Error("settle with its context ended: true")
	}
}
