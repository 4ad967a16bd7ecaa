package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/agent/noderoutes"
	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
)

// nodeRoutes keeps this node's routes to the other nodes' pod CIDRs
// (standalone mode: nothing else routes between nodes), direct or through
// VXLAN as --encapsulation says, polling the API server's node list.
type nodeRoutes struct {
	m        *noderoutes.Manager
	api      *apiClient
	interval time.Duration
	// statusPath receives the last sync's routes, problems and the pods'
	// MTU as JSON, for operators (`cat /run/cni-usernet/node-routes.json`).
	statusPath string
	// onNodes, when not nil, is given each node list read.
	onNodes func([]noderoutes.Node)
	log     *slog.Logger
}

// wantNodeRoutes says whether this agent programs routes between nodes.
func (f *agentFlags) wantNodeRoutes() (bool, error) {
	switch f.nodeRoutes {
	case "auto":
		return f.mode == "standalone" && f.install, nil
	case "true", "on":
		return true, nil
	case "false", "off":
		return false, nil
	}
	return false, fmt.Errorf("--node-routes %q: want auto, true or false", f.nodeRoutes)
}

// routeOptions are the Manager's options from the flags, checked (the
// node name aside: it may come later, from the environment).
func (f *agentFlags) routeOptions() (noderoutes.Options, error) {
	enc, err := noderoutes.ParseEncapsulation(f.encapsulation)
	if err != nil {
		return noderoutes.Options{}, fmt.Errorf("--encapsulation: %w", err)
	}
	if f.vxlanPort < 1 || f.vxlanPort > 65535 {
		return noderoutes.Options{}, fmt.Errorf("--vxlan-port %d: want 1..65535", f.vxlanPort)
	}
	if f.vxlanVNI < 1 || f.vxlanVNI >= 1<<24 {
		return noderoutes.Options{}, fmt.Errorf("--vxlan-vni %d: want 1..16777215", f.vxlanVNI)
	}
	return noderoutes.Options{Self: f.nodeName, Encapsulation: enc, VXLANPort: f.vxlanPort, VXLANVNI: f.vxlanVNI, PodMTU: f.mtu}, nil
}

// newNodeRoutes makes the node's routes; mtu is the pods' MTU the
// conflist carries (zero in chain mode: the primary plugin's).
func newNodeRoutes(f *agentFlags, c *apiClient, mtu noderoutes.MTUChoice, log *slog.Logger) (*nodeRoutes, error) {
	if c == nil || f.nodeName == "" {
		return nil, fmt.Errorf("--node-routes needs the agent in a cluster with --node-name")
	}
	o, err := f.routeOptions()
	if err != nil {
		return nil, err
	}
	o.Log = log
	if mtu.MTU != 0 {
		o.PodMTU, o.PodMTUSource = mtu.MTU, mtu.Source
	}
	m, err := noderoutes.New(o)
	if err != nil {
		return nil, err
	}
	return &nodeRoutes{m: m, api: c, interval: f.nodeRoutesInterval,
		statusPath: filepath.Join(f.runDir, "node-routes.json"), log: log.With("component", "noderoutes")}, nil
}

// run syncs at once and then every interval, until ctx ends. Node
// additions, changes (address, pod CIDRs) and deletions are followed
// within one interval.
func (r *nodeRoutes) run(ctx context.Context) {
	var lastErr string
	for {
		err := r.syncOnce(ctx)
		if msg := fmt.Sprint(err); err != nil && msg != lastErr {
			r.log.Error("syncing routes to other nodes", "err", err)
		}
		lastErr = fmt.Sprint(err)
		if err == nil {
			lastErr = ""
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.interval):
		}
	}
}

func (r *nodeRoutes) syncOnce(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nodes, err := r.api.listNodes(cctx)
	if err != nil {
		return err
	}
	if r.onNodes != nil {
		r.onNodes(nodes)
	}
	st, err := r.m.Sync(nodes)
	if b, jerr := json.MarshalIndent(st, "", "  "); jerr == nil {
		os.MkdirAll(filepath.Dir(r.statusPath), 0o755)
		atomicfile.Write(r.statusPath, append(b, '\n'), 0o644)
	}
	return err
}

// remove takes every route of ours and the VXLAN devices away
// (uninstall).
func (r *nodeRoutes) remove() {
	if err := r.m.RemoveAll(); err != nil {
		r.log.Error("removing routes to other nodes", "err", err)
		return
	}
	os.Remove(r.statusPath)
	r.log.Info("routes to other nodes removed")
}
