package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/cni-usernet/cni-usernet/pkg/node/install"
)

// TestStandaloneConflistChainsMetaPlugins: the conflist the agent writes
// loads as a runtime loads it, with portmap after cni-usernet declaring
// the capability the runtimes fill in, and without it when switched off;
// never the bandwidth plugin, whose work cni-usernet does standalone.
// Chained, both go into the node's list (pkg/node/install places them).
func TestStandaloneConflistChainsMetaPlugins(t *testing.T) {
	plugin := []byte(`{"type":"cni-usernet","gso":"auto"}`)
	for _, tc := range []struct {
		args  []string
		types []string
	}{
		{nil, []string{"cni-usernet", "portmap"}},
		{[]string{"--bandwidth=false"}, []string{"cni-usernet", "portmap"}},
		{[]string{"--port-map=false", "--bandwidth=false"}, []string{"cni-usernet"}},
		{[]string{"--mode", "chain"}, []string{"cni-usernet", "portmap", "bandwidth"}},
	} {
		f, err := parseAgentFlags(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		l, err := libcni.ConfListFromBytes(standaloneConflist(plugin, metaPlugins(f)))
		if err != nil {
			t.Fatalf("%v: conflist does not load: %v", tc.args, err)
		}
		var types []string
		for _, p := range l.Plugins {
			types = append(types, p.Network.Type)
			switch p.Network.Type {
			case "portmap":
				if !p.Network.Capabilities["portMappings"] || !strings.Contains(string(p.Bytes), `"snat":true`) {
					t.Errorf("%v: portmap %s: want capability portMappings and snat", tc.args, p.Bytes)
				}
			case "bandwidth":
				if !p.Network.Capabilities["bandwidth"] {
					t.Errorf("%v: bandwidth %s: want capability bandwidth", tc.args, p.Bytes)
				}
			}
		}
		if !slices.Equal(types, tc.types) {
			t.Errorf("%v: plugins %v, want %v", tc.args, types, tc.types)
		}
	}
}

// TestHelperBinaries: the image's portmap and bandwidth are installed;
// one the image lacks is fine when the node has it, an error when
// neither has it (every ADD would fail), and nothing is wanted when
// switched off.
func TestHelperBinaries(t *testing.T) {
	image, bin := t.TempDir(), t.TempDir()
	f, err := parseAgentFlags([]string{"--cni-bin-dir", bin})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := helperBinaries(image, f); err == nil || !strings.Contains(err.Error(), "--port-map=false") {
		t.Errorf("neither in the image nor on the node: got %v, want an error naming the switch", err)
	}
	os.WriteFile(filepath.Join(image, "portmap"), []byte("x"), 0o755)
	os.WriteFile(filepath.Join(bin, "bandwidth"), []byte("x"), 0o755)
	h, err := helperBinaries(image, f)
	if err != nil {
		t.Fatal(err)
	}
	if want := []install.Helper{{Name: "portmap", Source: filepath.Join(image, "portmap")}}; !slices.Equal(h, want) {
		t.Errorf("got %+v, want %+v (bandwidth: the node's own)", h, want)
	}
	f, _ = parseAgentFlags([]string{"--cni-bin-dir", t.TempDir(), "--port-map=false", "--bandwidth=false"})
	if h, err := helperBinaries(t.TempDir(), f); err != nil || len(h) != 0 {
		t.Errorf("switched off: got %+v, %v, want none", h, err)
	}
}
