package capabilities

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/cni-usernet/cni-usernet/test/lib/nettest"
)

// TestAgentInstall runs the node agent (standalone) from an image's layout
// (its binaries, portmap and bandwidth side by side) against a plugin
// directory that has the distribution's portmap but no bandwidth: the
// conflist it writes chains portmap after cni-usernet, which declares the
// bandwidth capability itself (the bandwidth plugin would look for the
// pod's veth in the pod's namespace), so no bandwidth binary is
// installed; the node's portmap stays as it was, and `cni-usernet
// uninstall` leaves both directories as they were.
func TestAgentInstall(t *testing.T) {
	env := nettest.NewEnv(t)
	root := t.TempDir()
	image, bin, conf := filepath.Join(root, "image"), filepath.Join(root, "opt/cni/bin"), filepath.Join(root, "etc/cni/net.d")
	for _, d := range []string{image, bin, conf} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct{ dir, name string }{
		{env.BinDir, "cni-usernet"}, {env.BinDir, "cni-usernet-stack"}, {env.BinDir, "cni-usernet-agent"},
		{metaBinDir(t), "portmap"}, {metaBinDir(t), "bandwidth"},
	} {
		copyExecutable(t, filepath.Join(f.dir, f.name), filepath.Join(image, f.name))
	}
	nodePortmap := []byte("#!/bin/sh\n# the distribution's portmap\n")
	if err := os.WriteFile(filepath.Join(bin, "portmap"), nodePortmap, 0o755); err != nil {
		t.Fatal(err)
	}
	beforeBin, beforeConf := listing(t, bin), listing(t, conf)

	stateDir := filepath.Join(env.Dir, "state")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agent := exec.CommandContext(ctx, filepath.Join(image, "cni-usernet-agent"),
		"--cni-bin-dir", bin, "--cni-conf-dir", conf, "--mode", "standalone", "--subnet", env.Subnet,
		"--state-dir", stateDir, "--run-dir", filepath.Join(env.Dir, "agent"),
		"--metrics-address", "", "--mount-ns", "", "--node-routes", "false")
	var log nettest.LockedBuffer
	agent.Stdout, agent.Stderr = &log, &log
	agent.Cancel = func() error { return agent.Process.Signal(syscall.SIGTERM) }
	if err := nettest.In(env.Node, agent.Start); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			agent.Wait()
		}
	}
	t.Cleanup(stop)

	conflist := filepath.Join(conf, "05-cni-usernet.conflist")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(conflist); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no conflist after 30 s; agent log:\n%s", log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	data, err := os.ReadFile(conflist)
	if err != nil {
		t.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatalf("the agent's conflist does not load: %v\n%s", err, data)
	}
	var types []string
	for _, p := range l.Plugins {
		types = append(types, p.Network.Type)
	}
	if want := []string{"cni-usernet", "portmap"}; !slices.Equal(types, want) {
		t.Errorf("plugins %v, want %v", types, want)
	}
	if !l.Plugins[0].Network.Capabilities["bandwidth"] {
		t.Errorf("cni-usernet's entry %s does not declare the bandwidth capability", l.Plugins[0].Bytes)
	}
	if got, _ := os.ReadFile(filepath.Join(bin, "portmap")); !bytes.Equal(got, nodePortmap) {
		t.Error("the node's portmap was replaced")
	}
	if _, err := os.Stat(filepath.Join(bin, "bandwidth")); err == nil {
		t.Error("bandwidth installed, which standalone cni-usernet does not chain")
	}
	if !strings.Contains(log.String(), "keeping the node's own plugin binary") {
		t.Errorf("the agent does not say it keeps the node's portmap:\n%s", log.String())
	}

	stop()
	out, err := exec.Command(filepath.Join(image, "cni-usernet"), "uninstall",
		"--record", filepath.Join(stateDir, "install", "install.json")).CombinedOutput()
	if err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	if got := listing(t, bin); !slices.Equal(got, beforeBin) {
		t.Errorf("plugin directory after uninstall: %v, want %v", got, beforeBin)
	}
	if got, _ := os.ReadFile(filepath.Join(bin, "portmap")); !bytes.Equal(got, nodePortmap) {
		t.Error("the node's portmap changed after uninstall")
	}
	if got := listing(t, conf); !slices.Equal(got, beforeConf) {
		t.Errorf("configuration directory after uninstall: %v, want %v", got, beforeConf)
	}
}

func copyExecutable(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	da, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	db, err := os.ReadFile(b)
	return err == nil && bytes.Equal(da, db)
}

// listing is the names in dir, sorted.
func listing(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
