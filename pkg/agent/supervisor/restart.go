package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/podnet"
	"github.com/cni-usernet/cni-usernet/pkg/api/stackconfig"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/node/attachment"
	"github.com/cni-usernet/cni-usernet/pkg/node/launch"
)

// clearCrashes forgets the crash record of proc, which has run for
// StableAfter. It returns false when it must be tried again (the
// attachment busy, or its state not saved).
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
		Args:         launch.StackArgs(att.ConfigPath),
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
