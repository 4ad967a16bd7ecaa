// Package supervisor keeps the node's pod stacks running: it restarts
// stacks that die (with backoff, reporting crash loops), and reconciles
// the node with the state directory — attachments whose network namespace
// is gone are reclaimed, stacks nobody recorded are reported and left
// running. Stacks are never the agent's to keep alive: restarting or
// upgrading the agent leaves them running.
package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
	"github.com/cni-usernet/cni-usernet/pkg/node/sourceguard"
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

// The defaults of Config's restart and reconcile fields, and of the node
// agent's flags that set them.
const (
	DefaultReconcileInterval = 30 * time.Second
	DefaultBackoff           = time.Second
	DefaultMaxBackoff        = 60 * time.Second
	DefaultStableAfter       = 60 * time.Second
	DefaultCrashLoop         = 5
)

func (c *Config) defaults() {
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 10 * time.Second
	}
	if c.ScanInterval == 0 {
		c.ScanInterval = time.Second
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = DefaultReconcileInterval
	}
	if c.Backoff == 0 {
		c.Backoff = DefaultBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.StableAfter == 0 {
		c.StableAfter = DefaultStableAfter
	}
	if c.CrashLoop == 0 {
		c.CrashLoop = DefaultCrashLoop
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
	// LastReconcile is when the last reconcile pass ended (Unix
	// nanoseconds; 0: none yet): the agent's liveness (its /healthz).
	LastReconcile atomic.Int64
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
	// SourceGuardsRestored counts pods' source guards put back after
	// something on the node removed them.
	SourceGuardsRestored atomic.Uint64
}

// Stats returns the supervisor's live counters.
func (s *Supervisor) Stats() *Stats { return &s.stats }

// New returns a supervisor; Run starts it.
func New(cfg Config) *Supervisor {
	cfg.defaults()
	return &Supervisor{cfg: cfg, watched: make(map[string]bool)}
}

// guardSettle is how long after an nftables deletion the pods' source
// guards are checked: long enough for a flush's or a firewall reload's
// burst of deletions to end, short enough that frames pass unchecked for
// no longer.
const guardSettle = 200 * time.Millisecond

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
	// A deletion in nftables may have taken pods' source guards: they
	// are checked a moment later (a flush reports every object it
	// deletes; one check follows them all), else at each reconcile.
	changes, err := sourceguard.Changes(ctx)
	if err != nil {
		s.cfg.Log.Warn("not watching nftables: pods' source guards are checked at each reconcile only", "err", err)
	}
	var guardCheck <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			s.wg.Wait()
			return nil
		case <-scan.C:
			s.scan(ctx)
		case <-reconcile.C:
			s.Reconcile()
		case _, ok := <-changes:
			if !ok {
				changes = nil
				continue
			}
			if guardCheck == nil {
				guardCheck = time.After(guardSettle)
			}
		case <-guardCheck:
			guardCheck = nil
			s.reconcileGuards()
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
