package policyctl

import (
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
)

// target is where one attachment's policy goes.
type target struct {
	key            string // attachment key (state.Key)
	namespace, pod string
	ips            []netip.Addr
	socket, file   string
}

// podKey is the target's pod as the pod cache keys it.
func (t target) podKey() string { return t.namespace + "/" + t.pod }

func targetOf(a *state.Attachment) (target, error) {
	t := target{
		key: state.Key(a.ContainerID, a.IfName), namespace: a.PodNS, pod: a.PodName,
		socket: a.ControlSocket, file: policyPath(a),
	}
	for _, s := range a.IPs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return t, fmt.Errorf("attachment %s/%s: address %q: %w", a.ContainerID, a.IfName, s, err)
		}
		t.ips = append(t.ips, p.Addr())
	}
	return t, nil
}

// localTargets are the node's pods whose stacks take a policy: every
// attachment of a Kubernetes pod whose stack has started. live holds
// their keys.
func localTargets(store state.Store, log *slog.Logger) (targets []target, live map[string]bool) {
	atts, errs := store.List()
	for _, err := range errs {
		log.Warn("reading attachment state", "err", err)
	}
	live = map[string]bool{}
	for _, a := range atts {
		if a.PodName == "" || a.ControlSocket == "" {
			continue // not a Kubernetes pod, or not started yet
		}
		t, err := targetOf(a)
		if err != nil {
			log.Warn("skipping an attachment", "err", err)
			continue
		}
		targets = append(targets, t)
		live[t.key] = true
	}
	return targets, live
}

// policyPath is the attachment's policy file: the one its record names,
// or for a record that names none, the file beside its stack's
// configuration (docs/policy.md: <attachment dir>/policy.json). Every
// reader of an attachment's policy file goes through it.
func policyPath(a *state.Attachment) string {
	if a.PolicyPath != "" {
		return a.PolicyPath
	}
	if a.ConfigPath == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(a.ConfigPath), "policy.json")
}
