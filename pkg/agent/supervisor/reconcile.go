package supervisor

import (
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
)

// netnsGone reports whether the namespace path no longer names a network
// namespace (deleted, or its bind mount gone).
func netnsGone(path string) (bool, error) {
	if path == "" {
		return false, nil
	}
	n, err := ns.GetNS(path)
	if err == nil {
		n.Close()
		return false, nil
	}
	var notExist ns.NSPathNotExistErr
	var notNS ns.NSPathNotNSErr
	if errors.As(err, &notExist) || errors.As(err, &notNS) || errors.Is(err, os.ErrNotExist) {
		return true, nil
	}
	return false, err
}

// Reconcile compares the node with the state directory once: attachments
// whose netns is gone are reclaimed; stack directories that neither an
// attachment nor a running stack uses are removed; stacks no attachment
// records are reported, not stopped.
func (s *Supervisor) Reconcile() {
	log := s.cfg.Log
	defer func() {
		s.stats.ReconcileRuns.Add(1)
		s.stats.LastReconcile.Store(time.Now().UnixNano())
	}()
	atts, errs := s.cfg.Store.List()
	for _, err := range errs {
		log.Error("unreadable attachment state (left in place)", "err", err)
	}
	known := make(map[string]bool)
	for _, att := range atts {
		key := state.Key(att.ContainerID, att.IfName)
		known[key] = true
		gone, err := netnsGone(att.Netns)
		if err != nil || !gone {
			continue
		}
		lock, err := s.cfg.Store.LockKey(key, lockWait)
		if err != nil {
			continue
		}
		att, err := s.cfg.Store.Load(att.ContainerID, att.IfName)
		if err != nil {
			lock.Release()
			continue
		}
		err = attachment.Reclaim(s.cfg.Store, att, s.cfg.CNIPath, s.cfg.MountNS, log)
		lock.Release()
		if err != nil {
			log.Error("reclaiming attachment of a deleted netns", "containerID", att.ContainerID, "err", err)
			continue
		}
		s.stats.ReclaimedByReconcile.Add(1)
		log.Info("reclaimed attachment: its netns is gone", "containerID", att.ContainerID, "ifName", att.IfName, "netns", att.Netns)
	}
	s.reconcileGuards()
	stacksDir := filepath.Join(s.cfg.Store.Dir, "stacks")
	running := make(map[string]bool)
	var untracked int64
	defer func() { s.stats.UntrackedStacks.Store(untracked) }()
	for _, st := range launch.FindStacks(stacksDir) {
		key := filepath.Base(filepath.Dir(st.ConfigPath))
		running[key] = true
		if known[key] {
			continue
		}
		untracked++
		// Its state is lost, but it may well serve a live pod: stopping
		// it on a guess would take that pod's network down with nobody to
		// notice. DEL still finds it by its config path.
		log.Warn("a stack runs that no attachment records (state lost?); left running", "pid", st.PID, "config", st.ConfigPath)
	}
	entries, _ := os.ReadDir(stacksDir)
	for _, e := range entries {
		if known[e.Name()] || running[e.Name()] {
			continue
		}
		s.orphan(e.Name(), func() {
			os.RemoveAll(filepath.Join(stacksDir, e.Name()))
			s.stats.StackDirsRemoved.Add(1)
			log.Info("removed a stack directory no attachment or process uses", "key", e.Name())
		})
	}
}

// orphan runs f for a key without state, unless an ADD holds its lock (ADD
// writes the stack directory and starts the stack before its state is
// complete) or the state appeared meanwhile.
func (s *Supervisor) orphan(key string, f func()) {
	lock, err := s.cfg.Store.LockKey(key, 0)
	if err != nil {
		return
	}
	// No attachment, so no lock file to keep.
	defer lock.Release()
	if _, err := os.Stat(filepath.Join(s.cfg.Store.Dir, key+".json")); err == nil {
		return
	}
	f()
}
