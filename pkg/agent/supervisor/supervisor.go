// Package agent is the node agent's work on running pods: it restarts
// stacks that die (with backoff, reporting crash loops), and reconciles
// the node with the state directory — attachments whose network namespace
// is gone are reclaimed, stacks nobody recorded are stopped. Stacks are
// never the agent's to keep alive: restarting or upgrading the agent
// leaves them running.
package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
)

// Config says where the node's attachments are and how to restart them.
type Config struct {
	Store state.Store
	// CNIPath finds the IPAM plugin when an attachment is reclaimed.
	CNIPath string
	// MountNS and CgroupRoot: see launch.Options. In a container they are
	// the host's, so restarted stacks live where the plugin put them.
	MountNS    string
	CgroupRoot string
	// StackBinary, when set, replaces the recorded binary on restarts: an
	// agent that cannot enter the node's mount namespace starts its own
	// executable, the recorded path meaning nothing in its container.
	StackBinary string
	// ReadyTimeout bounds one stack start. Zero: 10 s.
	ReadyTimeout time.Duration
	// ScanInterval is how often new attachments are picked up (a stack
	// started by ADD is watched from then on). Zero: 1 s.
	ScanInterval time.Duration
	// ReconcileInterval is how often the node is compared with the state
	// directory. Zero: 30 s.
	ReconcileInterval time.Duration
	// Backoff is the delay before the nth consecutive quick restart
	// (n ≥ 2; the first restart is immediate), doubling up to MaxBackoff.
	// Zero: 1 s and 60 s.
	Backoff, MaxBackoff time.Duration
	// StableAfter is how long a stack must run for its crashes to be
	// forgotten. Zero: 60 s.
	StableAfter time.Duration
	// CrashLoop is the number of consecutive quick exits after which the
	// attachment is reported unhealthy. Zero: 5.
	CrashLoop int
	// Refused, when set, is told of an attachment whose stack the agent
	// will not restart, and why (its files are newer than this release
	// understands): the node agent posts it as an Event on the pod.
	Refused func(att *state.Attachment, why string)
	Log     *slog.Logger
}

func (c *Config) defaults() {
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 10 * time.Second
	}
	if c.ScanInterval == 0 {
		c.ScanInterval = time.Second
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = 30 * time.Second
	}
	if c.Backoff == 0 {
		c.Backoff = time.Second
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 60 * time.Second
	}
	if c.StableAfter == 0 {
		c.StableAfter = 60 * time.Second
	}
	if c.CrashLoop == 0 {
		c.CrashLoop = 5
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Supervisor watches every attachment's stack.
type Supervisor struct {
	cfg     Config
	mu      sync.Mutex
	watched map[string]bool // guarded by mu
	// refused is why each attachment's restart was last refused
	// (tooNew), so that a refusal is logged and told once, not at every
	// retry.
	refused sync.Map
	wg      sync.WaitGroup
	stats   Stats
}

// Stats counts what this agent process did, for its metrics.
type Stats struct {
	ReconcileRuns atomic.Uint64
	// ReclaimedByReconcile and ReclaimedOnExit count attachments
	// reclaimed because their netns was gone: found by a reconcile pass,
	// or by the watcher when the stack died with its pod.
	ReclaimedByReconcile atomic.Uint64
	ReclaimedOnExit      atomic.Uint64
	// StackDirsRemoved counts stack directories nothing used any more.
	StackDirsRemoved atomic.Uint64
	// UntrackedStacks is how many stacks the last reconcile found running
	// without an attachment (left running, see Reconcile).
	UntrackedStacks atomic.Int64
	// StackRestarts and RestartFailures count this agent's restarts of
	// dead stacks.
	StackRestarts   atomic.Uint64
	RestartFailures atomic.Uint64
}

// Stats returns the supervisor's live counters.
func (s *Supervisor) Stats() *Stats { return &s.stats }

// New returns a supervisor; Run starts it.
func New(cfg Config) *Supervisor {
	cfg.defaults()
	return &Supervisor{cfg: cfg, watched: make(map[string]bool)}
}

// lockWait bounds how long the agent waits for an attachment that the
// plugin is working on; it simply tries again on the next pass.
const lockWait = 2 * time.Second

// Run reconciles once, calls ready, then watches until ctx ends. It never
// stops a stack on the way out.
func (s *Supervisor) Run(ctx context.Context, ready func()) error {
	s.Reconcile()
	s.scan(ctx)
	if ready != nil {
		ready()
	}
	scan := time.NewTicker(s.cfg.ScanInterval)
	defer scan.Stop()
	reconcile := time.NewTicker(s.cfg.ReconcileInterval)
	defer reconcile.Stop()
	for {
		select {
		case <-ctx.Done():
			s.wg.Wait()
			return nil
		case <-scan.C:
			s.scan(ctx)
		case <-reconcile.C:
			s.Reconcile()
		}
	}
}

// scan starts a watcher for every attachment not yet watched.
func (s *Supervisor) scan(ctx context.Context) {
	atts, _ := s.cfg.Store.List()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, att := range atts {
		key := state.Key(att.ContainerID, att.IfName)
		if s.watched[key] {
			continue
		}
		s.watched[key] = true
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.watch(ctx, att.ContainerID, att.IfName)
			s.mu.Lock()
			delete(s.watched, key)
			s.mu.Unlock()
		}()
	}
}

// watch keeps one attachment's stack running until its state is gone.
func (s *Supervisor) watch(ctx context.Context, containerID, ifName string) {
	log := s.cfg.Log.With("containerID", containerID, "ifName", ifName)
	for ctx.Err() == nil {
		att, err := s.cfg.Store.Load(containerID, ifName)
		if err != nil {
			if !errors.Is(err, state.ErrNotFound) {
				log.Error("unreadable state, not supervising", "err", err)
			}
			return
		}
		proc := launch.Process{PID: att.StackPID, StartTime: att.StackStartTime}
		if proc.PID == 0 {
			// ADD has saved the state but not started the stack yet.
			if !sleep(ctx, s.cfg.ScanInterval) {
				return
			}
			continue
		}
		if launch.Alive(proc) {
			if !s.waitExit(ctx, att, proc, log) {
				return
			}
		}
		if !s.handleExit(ctx, containerID, ifName, proc, log) {
			return
		}
	}
}

// waitExit blocks until proc exits (true) or ctx ends (false). A stack
// that has run for StableAfter has its crash record cleared.
func (s *Supervisor) waitExit(ctx context.Context, att *state.Attachment, proc launch.Process, log *slog.Logger) bool {
	fd, err := unix.PidfdOpen(proc.PID, 0)
	if err != nil {
		return ctx.Err() == nil // already gone
	}
	defer unix.Close(fd)
	if !launch.Alive(proc) {
		return true // the PID was reused before we opened it
	}
	stableAt := time.Now().Add(s.cfg.StableAfter)
	cleared := att.Supervision == nil || (att.Supervision.Crashes == 0 && att.Supervision.Unhealthy == "")
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 250)
		if err == nil && n > 0 {
			reap(proc.PID)
			return true
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			log.Error("waiting for stack", "err", err)
		}
		if ctx.Err() != nil {
			return false
		}
		if !cleared && time.Now().After(stableAt) {
			cleared = s.clearCrashes(att.ContainerID, att.IfName, proc, log)
		}
	}
}

// reap collects a stack this agent started (a restarted stack is its
// child); for others the kernel's init or the runtime's subreaper does.
func reap(pid int) {
	var ws unix.WaitStatus
	unix.Wait4(pid, &ws, unix.WNOHANG, nil)
}

func (s *Supervisor) clearCrashes(containerID, ifName string, proc launch.Process, log *slog.Logger) bool {
	lock, err := s.cfg.Store.Lock(containerID, ifName, lockWait)
	if err != nil {
		return false
	}
	defer lock.Release()
	att, err := s.cfg.Store.Load(containerID, ifName)
	if err != nil || att.StackPID != proc.PID || att.Supervision == nil {
		return true
	}
	att.Supervision.Crashes = 0
	att.Supervision.Unhealthy = ""
	att.Supervision.NextRestart = time.Time{}
	if err := s.cfg.Store.Save(att); err != nil {
		log.Error("saving state", "err", err)
		return false
	}
	log.Info("stack is stable again", "pid", proc.PID)
	return true
}

// handleExit records the death of proc and restarts the stack after the
// backoff. It returns false when the attachment is gone or ctx ended.
func (s *Supervisor) handleExit(ctx context.Context, containerID, ifName string, proc launch.Process, log *slog.Logger) bool {
	lock, err := s.cfg.Store.Lock(containerID, ifName, lockWait)
	if err != nil {
		log.Warn("attachment busy, retrying", "err", err)
		return sleep(ctx, s.cfg.ScanInterval)
	}
	att, err := s.cfg.Store.Load(containerID, ifName)
	if err != nil {
		lock.Release()
		return false // DEL removed it (and stopped the stack)
	}
	if att.StackPID != proc.PID || att.StackStartTime != proc.StartTime {
		lock.Release()
		return true // restarted by someone else meanwhile: watch the new one
	}
	if gone, err := netnsGone(att.Netns); err != nil {
		log.Error("checking netns", "netns", att.Netns, "err", err)
	} else if gone {
		err := attachment.Reclaim(s.cfg.Store, att, s.cfg.CNIPath, s.cfg.MountNS, log)
		lock.Release()
		if err != nil {
			log.Error("reclaiming attachment of a deleted netns", "err", err)
			return sleep(ctx, s.cfg.ScanInterval)
		}
		s.stats.ReclaimedOnExit.Add(1)
		log.Info("reclaimed attachment: its netns is gone", "netns", att.Netns)
		return false
	}
	sv := att.Supervision
	if sv == nil {
		sv = &state.Supervision{}
		att.Supervision = sv
	}
	now := time.Now().UTC()
	if sv.NextRestart.IsZero() {
		// A new death (not a failed restart being retried).
		sv.Crashes++
		sv.LastExit = now
		sv.LastReason = lastLine(att.LogPath)
	}
	delay := s.backoff(sv.Crashes)
	if sv.Crashes >= s.cfg.CrashLoop {
		sv.Unhealthy = fmt.Sprintf("crash loop: the stack exited %d times in a row within %s of starting; last: %s (log %s)",
			sv.Crashes, s.cfg.StableAfter, sv.LastReason, att.LogPath)
	}
	sv.NextRestart = now.Add(delay)
	if err := s.cfg.Store.Save(att); err != nil {
		log.Error("saving state", "err", err)
	}
	lock.Release()
	log.Warn("stack exited", "pid", proc.PID, "crashes", sv.Crashes, "restartIn", delay, "reason", sv.LastReason)

	if !sleep(ctx, delay) {
		return false
	}
	return s.restart(containerID, ifName, proc, log)
}

func (s *Supervisor) backoff(crashes int) time.Duration {
	if crashes <= 1 {
		return 0
	}
	d := s.cfg.Backoff
	for i := 2; i < crashes && d < s.cfg.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, s.cfg.MaxBackoff)
}

// tooNew says why att's stack must not be restarted by this release: its
// configuration or spec is of a newer format than this release
// understands. "" when it may.
func tooNew(att *state.Attachment) string {
	if _, err := stackconfig.Read(att.ConfigPath); errors.Is(err, stackconfig.ErrNewer) {
		return fmt.Sprintf("not restarted: %v; the release that started it (or a newer one) must run it: install it again, or delete the pod", err)
	}
	if _, err := podnet.ReadSpec(att.SpecPath); errors.Is(err, podnet.ErrNewer) {
		return fmt.Sprintf("not restarted: %v; the release that started it (or a newer one) must run it: install it again, or delete the pod", err)
	}
	return ""
}

// restart starts the stack again from its saved config and spec.
func (s *Supervisor) restart(containerID, ifName string, dead launch.Process, log *slog.Logger) bool {
	lock, err := s.cfg.Store.Lock(containerID, ifName, lockWait)
	if err != nil {
		return true // busy: the next pass sees whatever the holder did
	}
	defer lock.Release()
	att, err := s.cfg.Store.Load(containerID, ifName)
	if err != nil {
		return false
	}
	if att.StackPID != dead.PID || att.StackStartTime != dead.StartTime {
		return true
	}
	sv := att.Supervision
	if sv == nil {
		sv = &state.Supervision{}
		att.Supervision = sv
	}
	key := containerID + "/" + ifName
	if why := tooNew(att); why != "" {
		// Never start it wrong: a stack of this release in a namespace
		// a newer one shaped can look healthy and pass nothing. Counted
		// as a failed start, retried with the backoff (the newer release
		// may come back), reported unhealthy at once.
		sv.Crashes++
		sv.LastExit = time.Now().UTC()
		sv.LastReason = why
		sv.NextRestart = time.Time{}
		sv.Unhealthy = why
		if err := s.cfg.Store.Save(att); err != nil {
			log.Error("saving state", "err", err)
		}
		if old, _ := s.refused.Swap(key, why); old != why {
			log.Error("stack not restarted", "reason", why)
			if s.cfg.Refused != nil {
				s.cfg.Refused(att, why)
			}
		}
		return true
	}
	s.refused.Delete(key)
	binary := att.StackBinary
	if s.cfg.StackBinary != "" {
		binary = s.cfg.StackBinary
	} else if split, err := attachment.StackBinary(binary); err == nil && split != binary {
		// Recorded when the stack ran from the multi-call binary: the
		// stack binary beside it is the one this release installed;
		// recorded for the next restart.
		binary = split
		att.StackBinary = split
	}
	proc, err := launch.Start(launch.Options{
		Binary:       binary,
		Args:         attachment.StackArgs(att.ConfigPath),
		Netns:        att.Netns,
		WireNetns:    att.WireNetns,
		LogPath:      att.LogPath,
		ReadyTimeout: s.cfg.ReadyTimeout,
		Cgroups:      att.StackCgroups,
		CgroupRoot:   s.cfg.CgroupRoot,
		MountNS:      s.cfg.MountNS,
		OOMScoreAdj:  launch.StackOOMScoreAdj,
	})
	if err != nil {
		// Counted as another quick exit: backoff grows, a stack that can
		// never start ends up reported as a crash loop.
		sv.Crashes++
		sv.LastExit = time.Now().UTC()
		sv.LastReason = "restart failed: " + err.Error()
		sv.NextRestart = time.Time{}
		if sv.Crashes >= s.cfg.CrashLoop {
			sv.Unhealthy = fmt.Sprintf("crash loop: %d failed starts in a row; last: %s", sv.Crashes, sv.LastReason)
		}
		// Keep the dead process recorded so the watcher retries.
		if err := s.cfg.Store.Save(att); err != nil {
			log.Error("saving state", "err", err)
		}
		s.stats.RestartFailures.Add(1)
		log.Error("restarting stack failed", "err", err, "crashes", sv.Crashes)
		return true
	}
	if proc.Warning != nil {
		log.Warn("restarted stack is not in its recorded cgroups", "err", proc.Warning)
	}
	att.StackPID, att.StackStartTime = proc.PID, proc.StartTime
	sv.Restarts++
	sv.NextRestart = time.Time{}
	if err := s.cfg.Store.Save(att); err != nil {
		// The stack runs but the state names the dead one: stop it rather
		// than leave a process nobody tracks; the next pass retries.
		launch.Stop(proc, 5*time.Second)
		log.Error("saving state after restart", "err", err)
		return true
	}
	s.stats.StackRestarts.Add(1)
	log.Info("stack restarted", "pid", proc.PID, "restarts", sv.Restarts)
	return true
}

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

// lastLine returns the last non-empty line of the stack's log, trimmed:
// for a panic or a fatal error, the runtime's own words.
func lastLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "exited (no log)"
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > 64<<10 {
		f.Seek(st.Size()-64<<10, 0)
	}
	var last, panicLine string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		last = line
		if strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:") {
			panicLine = line
		}
	}
	if panicLine != "" {
		last = panicLine
	}
	if last == "" {
		return "exited without a message (killed?)"
	}
	if len(last) > 300 {
		last = last[:300] + "…"
	}
	return last
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Reconcile compares the node with the state directory once: attachments
// whose netns is gone are reclaimed; stack directories that neither an
// attachment nor a running stack uses are removed; stacks no attachment
// records are reported, not stopped.
func (s *Supervisor) Reconcile() {
	log := s.cfg.Log
	defer s.stats.ReconcileRuns.Add(1)
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
