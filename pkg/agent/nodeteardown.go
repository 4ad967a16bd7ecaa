package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/install"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/node/sockmap"
)

// shutdown uninstalls when the agent stops because its DaemonSet is gone
// (kubectl delete), and leaves everything for a restart or an upgrade.
func (n *nodeSetup) shutdown(log *slog.Logger) {
	if !n.f.uninstallOnDelete || n.api == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	ns, err := inClusterNamespace()
	if err != nil {
		log.Error("cannot tell deletion from restart; leaving the CNI files", "err", err)
		return
	}
	exists, err := n.api.daemonSetExists(ctx, ns, n.f.daemonSet)
	if apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err) {
		// `kubectl delete -f` of the manifest removes our service account
		// or its role too: nobody revokes those for a mere restart.
		log.Info("DaemonSet check refused: taken as deleted with the manifest", "reason", apiFailure(err), "err", err)
		exists, err = false, nil
	}
	if err != nil {
		log.Error("cannot tell deletion from restart; leaving the CNI files", "reason", apiFailure(err), "err", err)
		return
	}
	if exists {
		log.Info("DaemonSet still exists (restart or upgrade): CNI files stay")
		return
	}
	if !n.drain(log) {
		return
	}
	if err := install.Uninstall(n.opts); err != nil {
		log.Error("uninstalling", "err", err)
		return
	}
	if n.f.kubeconfigOut != "" {
		os.Remove(n.f.kubeconfigOut)
		// WriteKubeconfig made the directory; leave no trace of it.
		os.Remove(filepath.Dir(n.f.kubeconfigOut))
	}
	if n.routes != nil {
		n.routes.remove()
	}
	// The socket redirect's programs, which the node's first ADD loaded
	// and pinned in the node's bpffs: with no pod left, nothing uses them.
	if err := launch.InMountNS(n.f.mountNS, func() error { return sockmap.Unload(netconf.DefaultBPFDir) }); err != nil {
		log.Warn("cannot unload the socket redirect", "dir", netconf.DefaultBPFDir, "err", err)
	}
	releaseClaim(n.f.claimFile())
	log.Info("DaemonSet deleted: CNI files restored")
}

// newerAgentStarted reports whether another agent claimed the node since
// this one did (the manifest applied again: its pod starts while this one
// terminates), or is ready there: the deferred uninstall is then dropped.
func (n *nodeSetup) newerAgentStarted(log *slog.Logger) bool {
	if p, ok := newerAgent(n.f.claimFile()); ok {
		log.Info("another agent started on this node (installed again): the deferred uninstall is dropped", "pid", p.PID)
		return true
	}
	// An agent of a release without the claim file says so when ready.
	if probeAgent(n.f.readyFile()) == nil {
		log.Info("another agent is ready on this node (installed again): the deferred uninstall is dropped")
		return true
	}
	return false
}

// drainPoll is how often a deferred uninstall looks at the attachments.
const drainPoll = time.Second

// drain defers the uninstall while pods on this node still have an
// attachment: their sandboxes' DEL needs the plugin binary and the
// configuration that names it (with neither, containerd fails every DEL
// with "cni plugin not initialized" and the pods hang in Terminating), and
// the routes to other nodes keep their traffic flowing meanwhile. It
// returns true once the last attachment is gone, false when the DaemonSet
// is back (installed again: nothing to undo). The kubelet's grace period
// (the manifest's terminationGracePeriodSeconds) bounds the wait: killed
// first, the agent leaves everything installed, which `cni-usernet
// uninstall` on the node removes.
func (n *nodeSetup) drain(log *slog.Logger) bool {
	store := state.Store{Dir: n.f.stateDir}
	ns, _ := inClusterNamespace()
	said := ""
	for i := 0; ; i++ {
		// First: with no pod left, this would uninstall what a newer
		// agent is installing.
		if n.newerAgentStarted(log) {
			return false
		}
		atts, errs := store.List()
		for _, err := range errs {
			log.Warn("reading attachment state", "err", err)
		}
		if len(atts) == 0 {
			if said != "" {
				log.Info("the last pod using cni-usernet on this node is gone: uninstalling")
			}
			return true
		}
		var pods []string
		for _, a := range atts {
			p := a.PodNS + "/" + a.PodName
			if a.PodName == "" {
				p = "container " + a.ContainerID
			}
			pods = append(pods, p)
		}
		sort.Strings(pods)
		if now := strings.Join(pods, ", "); now != said {
			kept := "the plugin binary, its configuration and the routes to other nodes stay"
			if n.f.mode == "chain" {
				kept = "the plugin binary and its entry in the node's configuration stay"
			}
			log.Warn("DaemonSet deleted, uninstall deferred: pods on this node still use cni-usernet; "+
				kept+" until they are deleted, so that their deletion (CNI DEL) works; delete them to finish the uninstall",
				"pods", now, "count", len(pods))
			said = now
		}
		if i%10 == 9 && ns != "" && n.api != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			exists, err := n.api.daemonSetExists(ctx, ns, n.f.daemonSet)
			cancel()
			switch {
			case err != nil:
				// Expected after the manifest was deleted and applied
				// again: the new ServiceAccount's tokens are not ours.
				// The claim file still tells.
				log.Warn("deferred uninstall: cannot ask the API server whether the DaemonSet is back", "reason", apiFailure(err), "err", err)
			case exists:
				log.Info("DaemonSet installed again while the uninstall was deferred: CNI files stay")
				return false
			}
		}
		time.Sleep(drainPoll)
	}
}
