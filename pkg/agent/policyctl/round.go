package policyctl

import (
	"net/netip"
	"strings"
	"sync"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
)

// round is one recompute of local pods against one snapshot of the
// cache: the work shared between the pods (netpolicy.Compiler's index) is
// done once, when the round is made; compile then compiles each pod.
type round struct {
	snap     *netpolicy.Snapshot
	pods     func(key string) *netpolicy.Pod
	node     []netip.Addr
	compiler *netpolicy.Compiler
	warnings *warnings
}

// newRound prepares the recompute of targets against snap, with the
// cluster's pods and namespaces from idx and the local pods' objects
// from pods. Every target whose pod is known is a local pod of the round,
// so that one the API shows no address for yet (during its ADD) is
// already a peer of the others.
func newRound(snap *netpolicy.Snapshot, idx netpolicy.Indexes, pods func(key string) *netpolicy.Pod, node []netip.Addr, targets []target, w *warnings) *round {
	var local []netpolicy.LocalPod
	for _, t := range targets {
		if pod := pods(t.podKey()); pod != nil {
			local = append(local, netpolicy.LocalPod{Pod: pod, IPs: t.ips})
		}
	}
	return &round{snap: snap, pods: pods, node: node, compiler: netpolicy.NewIndexedCompiler(idx, snap, local), warnings: w}
}

// pod is t's pod; nil when the cache does not hold it (yet, or any
// more).
func (r *round) pod(t target) *netpolicy.Pod { return r.pods(t.podKey()) }

// compile is t's policy (generation 0: not numbered yet) and what it
// depends on; its pod is r.pod(t).
func (r *round) compile(pod *netpolicy.Pod, t target) netpolicy.Compiled {
	lp := netpolicy.LocalPod{Pod: pod, IPs: t.ips}
	res := r.compiler.CompilePod(lp, r.node, 0)
	r.warnings.note(pod, res.Warnings)
	return res
}

// warnings passes on each pod's compiler warnings (parts of policies the
// compiler could not use, which stay closed) when they change, not at
// every round.
type warnings struct {
	// changed is given a pod's warnings, joined, when they changed and
	// are not none.
	changed func(pod *netpolicy.Pod, warnings string)

	mu   sync.Mutex
	said map[string]string // pod -> its last warnings
}

func newWarnings(changed func(pod *netpolicy.Pod, warnings string)) *warnings {
	return &warnings{changed: changed, said: map[string]string{}}
}

// note records pod's warnings of this round.
func (w *warnings) note(pod *netpolicy.Pod, ws []netpolicy.Warning) {
	if pod == nil {
		return
	}
	key := pod.Metadata.Namespace + "/" + pod.Metadata.Name
	var parts []string
	for _, x := range ws {
		parts = append(parts, x.String())
	}
	now := strings.Join(parts, "; ")
	w.mu.Lock()
	changed := w.said[key] != now
	if now == "" {
		delete(w.said, key)
	} else {
		w.said[key] = now
	}
	w.mu.Unlock()
	if changed && now != "" {
		w.changed(pod, now)
	}
}
