package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/cni-usernet/cni-usernet/hack/bench/runlog"
	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// benchPolicy is the policy a configuration with PolicyRules pushes: both
// directions isolated by rules rules each, the first rules-1 allowing /24s
// of addresses no benchmark uses to one port each (every tenth a range),
// the last allowing the benchmark's peer, the node (every protocol and
// port). The node is not named as the node (PodPolicy.Node): its
// connections take the rules' path, as another pod's would, so every new
// connection is judged against the whole table.
func benchPolicy(rules int, peers []netip.Addr) *policy.PodPolicy {
	dir := func(name string) policy.Direction {
		d := policy.Direction{Isolated: true, Policies: []string{name}}
		for i := range rules - 1 {
			pr := policy.PortRange{Protocol: policy.TCP, First: uint16(20000 + i)}
			if i%10 == 0 {
				pr.Last = pr.First + 5
			}
			d.Rules = append(d.Rules, policy.Rule{Policy: name,
				Peers: []policy.Peer{{CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 20 + byte(i/250), byte(i % 250), 0}), 24)}},
				Ports: []policy.PortRange{pr}})
		}
		last := policy.Rule{Policy: name}
		for _, a := range peers {
			last.Peers = append(last.Peers, policy.Peer{CIDR: netip.PrefixFrom(a, a.BitLen())})
		}
		d.Rules = append(d.Rules, last)
		return d
	}
	return &policy.PodPolicy{Version: policy.FormatVersion, Generation: 1,
		Ingress: dir("bench/ingress"), Egress: dir("bench/egress")}
}

// pushPolicy puts c's policy in force in a's stack as the node agent
// would: the attachment's policy file, then the control socket.
func (b *bench) pushPolicy(c *config, a *attachment, res *current.Result) error {
	var peers []netip.Addr
	for _, ip := range res.IPs {
		if gw, ok := netip.AddrFromSlice(ip.Gateway); ok {
			peers = append(peers, gw.Unmap())
		}
	}
	if len(peers) == 0 {
		return fmt.Errorf("the ADD result names no gateway to allow")
	}
	p := benchPolicy(c.PolicyRules, peers)
	att, err := state.Store{Dir: filepath.Join(b.tmp, "state")}.Load(a.ID, "eth0")
	if err != nil {
		return err
	}
	if err := policy.WriteFile(att.PolicyPath, p); err != nil {
		return err
	}
	start := time.Now()
	if _, err := control.PutPolicy(att.ControlSocket, 20*time.Second, p); err != nil {
		return err
	}
	runlog.Logf("  %d-rule policy in force in %s", c.PolicyRules, time.Since(start).Round(time.Millisecond))
	return nil
}

// standInAgent serves the node agent's socket in the policy row's run
// directory: with networkPolicy on, ADD asks the agent for the pod's
// policy (docs/policy.md) and returns once the stack holds it. It pushes
// the row's policy, allowing host-local's gateways (the first address of
// each subnet), as the agent would push the pod's.
func (b *bench) standInAgent(c *config) error {
	dir := filepath.Join(b.tmp, "run")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "agent.sock"))
	if err != nil {
		return fmt.Errorf("serving the node agent's socket: %w", err)
	}
	var peers []netip.Addr
	for _, s := range []string{subnet4, subnet6} {
		peers = append(peers, netip.MustParsePrefix(s).Addr().Next())
	}
	p := benchPolicy(c.PolicyRules, peers)
	go (&http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q struct {
			ControlSocket string `json:"controlSocket"`
			PolicyPath    string `json:"policyPath"`
		}
		if err := json.NewDecoder(r.Body).Decode(&q); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := policy.WriteFile(q.PolicyPath, p); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		g, err := control.PutPolicy(q.ControlSocket, 20*time.Second, p)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, `{"generation": %d}`, g)
	})}).Serve(ln)
	return nil
}
