package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/hack/bench/rig"
	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
)

// The peers: what a user would run instead of cni-usernet to give a pod a
// userspace network stack, set up so that the same workloads run against
// them in the same interleaved rounds.
//
//   - runsc: the pod namespace is attached through ptp exactly like the
//     kernel row; one runsc sandbox (systrap, --network=sandbox) joined to
//     that namespace runs every server for the whole run. On start, runsc
//     takes over eth0: it removes its addresses and routes from the kernel
//     and serves them from netstack through an AF_PACKET socket (with
//     PACKET_VNET_HDR when host GSO is on). A second sandbox in the same
//     namespace would find no addresses, hence one sandbox for all servers.
//   - pasta and slirp4netns: a tap device in the pod namespace, the process
//     in the node namespace, where it turns the pod's frames into ordinary
//     sockets (L2↔L4). Clients reach the pod through the peer's port
//     forwarding on a node address (peerVeth) that is not loopback, so
//     pasta uses its tap path, not its loopback splice.

const (
	// peerVeth is a veth pair inside the node namespace (both ends there;
	// this kernel has no dummy driver). It carries the addresses the tap
	// peers listen on and gives pasta a template interface; no packet
	// leaves the node namespace through it.
	peerVeth     = "ubpeer0"
	peerVethPeer = "ubpeer1"
	pastaNodeIP  = "10.199.1.1" // pasta listens here; the pod's gateway
	pastaPodIP   = "10.199.1.2"
	slirpNodeIP  = "10.199.3.1"    // slirp4netns listens here
	slirpCIDR    = "10.199.2.0/24" // slirp4netns' own network, inside the process
	// slirpMTU is slirp4netns' default and the pods' veth MTU. With 65520
	// (what podman and rootlesskit pass), redis-benchmark's 50 connections
	// stalled until reset on this machine (10000 SET+GET, reproduced by
	// hand), while 1500 served them; pasta keeps its default, 65520.
	slirpMTU = 1500
)

// serverPorts are the ports the peers forward to the pod.
var serverPorts = []int{iperfPort, redisPort, nginxPort, rrPort}

// peerMissing says why peer configuration c cannot run on this machine, or "".
func (b *bench) peerMissing(c *config) string {
	switch c.Peer {
	case "runsc":
		if _, err := os.Stat(filepath.Join(b.o.BinDir, "runsc")); err != nil {
			return "runsc not built (see build-runsc.log)"
		}
	case "pasta", "slirp4netns":
		if _, err := exec.LookPath(c.Peer); err != nil {
			return fmt.Sprintf("%s not installed (hack/deps.sh installs it)", c.Peer)
		}
	}
	return ""
}

// setupPeerNode creates peerVeth in the node namespace, once.
func (b *bench) setupPeerNode(ctx context.Context) error {
	b.mu.Lock()
	done := b.peerNodeUp
	b.peerNodeUp = true
	b.mu.Unlock()
	if done {
		return nil
	}
	for _, argv := range [][]string{
		{"ip", "-n", nodeNS, "link", "add", peerVeth, "type", "veth", "peer", "name", peerVethPeer},
		{"ip", "-n", nodeNS, "addr", "add", pastaNodeIP + "/32", "dev", peerVeth},
		{"ip", "-n", nodeNS, "addr", "add", slirpNodeIP + "/32", "dev", peerVeth},
		{"ip", "-n", nodeNS, "link", "set", peerVeth, "up"},
		{"ip", "-n", nodeNS, "link", "set", peerVethPeer, "up"},
	} {
		if _, err := rig.Output(ctx, 10*time.Second, "", argv...); err != nil {
			return err
		}
	}
	return nil
}

// attachTap sets up a pasta or slirp4netns pod: namespace, the peer's
// process in the node namespace, and its port forwarding.
func (b *bench) attachTap(ctx context.Context, a *attachment) error {
	if err := b.setupPeerNode(ctx); err != nil {
		return err
	}
	if err := b.rig.AddNS(ctx, a.NS); err != nil {
		return err
	}
	b.mu.Lock()
	b.atts = append(b.atts, a)
	b.mu.Unlock()
	var (
		argv     []string
		dev      string
		wantAddr string
	)
	switch a.cfg.Peer {
	case "pasta":
		ports := make([]string, len(serverPorts))
		for i, p := range serverPorts {
			ports[i] = strconv.Itoa(p)
		}
		// --runas 0: pasta otherwise drops to nobody and then cannot
		// join a namespace it did not create. -T/-u/-U none: nothing
		// forwarded from the pod, and no UDP; the pod reaches the node
		// through the tap only.
		argv = []string{"pasta", "-f", "-q", "--runas", "0:0", "-4", "--config-net",
			"-i", peerVeth, "-a", pastaPodIP, "-n", "24", "-g", pastaNodeIP, "-I", "eth0",
			"-t", pastaNodeIP + "/" + strings.Join(ports, ","), "-T", "none", "-u", "none", "-U", "none",
			"--netns", "/run/netns/" + a.NS}
		dev, wantAddr, a.IP = "eth0", pastaPodIP, pastaNodeIP
	case "slirp4netns":
		a.apiSock = filepath.Join(b.tmp, "slirp4netns.sock")
		argv = []string{"slirp4netns", "--configure", "--mtu", strconv.Itoa(slirpMTU), "--cidr", slirpCIDR,
			"--disable-host-loopback", "--api-socket", a.apiSock, "--netns-type=path", "/run/netns/" + a.NS, "tap0"}
		dev, wantAddr, a.IP = "tap0", "10.199.2.100", slirpNodeIP
	default:
		return fmt.Errorf("unknown tap peer %q", a.cfg.Peer)
	}
	a.HostVeth, a.tapDev = a.cfg.Peer+" tap "+dev, dev
	p, err := b.rig.Start(nodeNS, a.Config+"-"+a.cfg.Peer, argv...)
	if err != nil {
		return err
	}
	a.StackPID = p.Pid() // ip netns exec execs the peer in place
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, _ := rig.Output(ctx, 5*time.Second, "", "ip", "-n", a.NS, "-4", "-o", "addr", "show", "dev", dev)
		if strings.Contains(string(out), wantAddr+"/") {
			break
		}
		select {
		case <-p.Done():
			raw, _ := os.ReadFile(p.Log())
			return fmt.Errorf("%s exited: %s", a.cfg.Peer, runlog.Tail(string(raw), 400))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not configure %s in %s within 15s", a.cfg.Peer, dev, a.NS)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if a.cfg.Peer == "slirp4netns" {
		// slirp4netns configures the tap before it creates its API socket.
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if _, err := os.Stat(a.apiSock); err == nil || time.Now().After(end) {
				break
			}
		}
		for _, port := range serverPorts {
			if err := slirpForward(a.apiSock, slirpNodeIP, port); err != nil {
				return err
			}
		}
	}
	return nil
}

// slirpForward asks slirp4netns to forward nodeIP:port to the pod's port.
func slirpForward(sock, nodeIP string, port int) error {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return fmt.Errorf("slirp4netns API: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	req := map[string]any{"execute": "add_hostfwd", "arguments": map[string]any{
		"proto": "tcp", "host_addr": nodeIP, "host_port": port, "guest_port": port}}
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return fmt.Errorf("slirp4netns API: %w", err)
	}
	var resp struct {
		Error any `json:"error"`
	}
	if err := json.NewDecoder(c).Decode(&resp); err != nil {
		return fmt.Errorf("slirp4netns API, forwarding port %d: %w", port, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("slirp4netns API, forwarding port %d: %v", port, resp.Error)
	}
	return nil
}

// runscRoot is runsc's state directory for the benchmark's sandboxes.
func (b *bench) runscRoot() string { return filepath.Join(b.tmp, "runsc-root") }

func (b *bench) runscArgv(a *attachment, verb ...string) []string {
	argv := []string{filepath.Join(b.o.BinDir, "runsc"), "--root", b.runscRoot(), "--ignore-cgroups",
		"--network=sandbox", "--overlay2=root:memory"}
	argv = append(argv, a.cfg.PeerArgs...)
	return append(argv, verb...)
}

// startRunsc starts the sandbox that runs every server of pod a and waits
// until each server accepts connections from the node.
func (b *bench) startRunsc(ctx context.Context, a *attachment) error {
	nginxDir, nginxConfPath, err := b.writeNginxConf(a)
	if err != nil {
		return err
	}
	sh := fmt.Sprintf("iperf3 -s -p %d & "+
		"redis-server --port %d --bind 0.0.0.0 --protected-mode no --save '' --appendonly no --dir %s & "+
		"nginx -e %s -p %s -c %s & "+
		"%s rr-server -listen :%d & wait",
		iperfPort, redisPort, b.tmp, filepath.Join(nginxDir, "error.log"), nginxDir, nginxConfPath, b.self, rrPort)
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SETUID", "CAP_SETGID", "CAP_NET_BIND_SERVICE", "CAP_KILL"}
	spec := map[string]any{
		"ociVersion": "1.0.0",
		"process": map[string]any{
			"user":         map[string]int{"uid": 0, "gid": 0},
			"args":         []string{"/bin/sh", "-c", sh},
			"env":          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"cwd":          "/",
			"capabilities": map[string][]string{"bounding": caps, "effective": caps, "permitted": caps},
			"rlimits":      []map[string]any{{"type": "RLIMIT_NOFILE", "hard": 65536, "soft": 65536}},
		},
		// The host's root, read through runsc's gofer, writes kept in
		// memory (--overlay2=root:memory): the same binaries and files as
		// the other rows' servers.
		"root":     map[string]any{"path": "/", "readonly": false},
		"hostname": "ub-runsc",
		"mounts": []map[string]string{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
		},
		"linux": map[string]any{"namespaces": []map[string]string{
			{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
			{"type": "network", "path": "/run/netns/" + a.NS},
		}},
	}
	bundle := filepath.Join(b.tmp, "runsc-"+a.Config)
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return err
	}
	raw, _ := json.MarshalIndent(spec, "", "  ")
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), raw, 0o644); err != nil {
		return err
	}
	a.runscID = "ub-" + a.Config
	p, err := b.rig.Start("", a.Config+"-runsc", b.runscArgv(a, "run", "--bundle", bundle, a.runscID)...)
	if err != nil {
		return err
	}
	for _, port := range serverPorts {
		if _, err := rig.Output(ctx, time.Minute, nodeNS, b.self, "probe", "-addr", net.JoinHostPort(a.IP, strconv.Itoa(port)), "-timeout", "45s"); err != nil {
			raw, _ := os.ReadFile(p.Log())
			return fmt.Errorf("runsc sandbox: port %d: %w (sandbox log: %s)", port, err, runlog.Tail(string(raw), 400))
		}
	}
	out, err := rig.Output(ctx, 20*time.Second, "", b.runscArgv(a, "state", a.runscID)...)
	if err != nil {
		return err
	}
	var st struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.PID <= 0 {
		return fmt.Errorf("runsc state %s: %q: %v", a.runscID, out, err)
	}
	a.StackPID = st.PID // the sandbox (Sentry): netstack and the servers' system calls
	if out, _ := rig.Output(ctx, 5*time.Second, "", "ip", "-n", a.NS, "-4", "-o", "addr", "show", "dev", "eth0"); strings.Contains(string(out), a.IP+"/") {
		return fmt.Errorf("runsc left %s on the kernel's eth0: its netstack did not take the interface over", a.IP)
	}
	runlog.Logf("%s: runsc sandbox pid %d serves %s from netstack", a.Config, a.StackPID, a.IP)
	return nil
}

// stopPeer ends a runsc sandbox; the tap peers are ordinary processes that
// cleanup stops with the servers.
func (b *bench) stopPeer(ctx context.Context, a *attachment) {
	if a.runscID == "" {
		return
	}
	_, _ = rig.Output(ctx, 20*time.Second, "", b.runscArgv(a, "kill", "--all", a.runscID, "KILL")...)
	if _, err := rig.Output(ctx, 30*time.Second, "", b.runscArgv(a, "delete", "--force", a.runscID)...); err != nil {
		runlog.Logf("cleanup: runsc delete %s: %v", a.runscID, err)
	}
}

// probeMain dials a TCP address until it accepts or the timeout passes.
func probeMain(args []string) int {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	addr := fs.String("addr", "", "host:port")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var last error
	for end := time.Now().Add(*timeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", *addr, 2*time.Second)
		if err == nil {
			c.Close()
			return 0
		}
		last = err
	}
	fmt.Fprintf(os.Stderr, "%s did not accept within %s: %v\n", *addr, *timeout, last)
	return 1
}
