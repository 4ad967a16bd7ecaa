package agent

import (
	"log/slog"
	"net/netip"
	"strings"
	"sync"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// netpolicyCompile is the CompileFunc of pkg/agent/netpolicy: one Compiler per
// snapshot; its warnings (parts of policies it could not use, which stay
// closed) are logged, and given to warn (when not nil), when a pod's
// change.
func netpolicyCompile(log *slog.Logger, warn func(pod *netpolicy.Pod, warnings string)) CompileFunc {
	var mu sync.Mutex
	said := map[string]string{} // pod -> its last warnings
	return func(snap *netpolicy.Snapshot, local []netpolicy.LocalPod) func(netpolicy.LocalPod, []netip.Addr) *policy.PodPolicy {
		c := netpolicy.NewCompiler(snap, local)
		return func(pod netpolicy.LocalPod, node []netip.Addr) *policy.PodPolicy {
			p, warnings := c.Compile(pod, node, 0)
			if pod.Pod == nil {
				return p
			}
			key := pod.Pod.Metadata.Namespace + "/" + pod.Pod.Metadata.Name
			var ws []string
			for _, w := range warnings {
				ws = append(ws, w.String())
			}
			now := strings.Join(ws, "; ")
			mu.Lock()
			changed := said[key] != now
			if now == "" {
				delete(said, key)
			} else {
				said[key] = now
			}
			mu.Unlock()
			if changed && now != "" {
				log.Warn("parts of the network policies selecting the pod were skipped (what they would allow stays closed)", "pod", key, "warnings", now)
				if warn != nil {
					warn(pod.Pod, now)
				}
			}
			return p
		}
	}
}
