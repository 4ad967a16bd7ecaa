package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
)

// meter measures one agent against one fake cluster: its CPU, the pushes
// its stacks take, its memory.
type meter struct {
	agent  *agentProc
	stacks *fakeStacks
	// quiet is how long without a push, and with the agent's CPU back at
	// its idle rate, an event takes to count as settled.
	quiet time.Duration
	// idleNS is the agent's CPU per second with nothing to do (its
	// supervisor's scans, its watches' bookmarks), subtracted from each
	// window.
	idleNS, idleTicks float64
}

// window is what one injection (or the initial sync) cost.
type window struct {
	took    time.Duration // injection to the last push; zero without pushes
	span    time.Duration // injection to settled: the CPU window
	ticks   uint64        // utime+stime over the window
	schedNS uint64        // threads' run time over the window
	pushes  pushTally
	settled bool
}

// netCPU is the window's CPU less what the agent spends idle in as long,
// in milliseconds: from ticks and from the threads' run time.
func (m *meter) netCPU(w window) (tickMS, schedMS float64) {
	sec := w.span.Seconds()
	tickMS = (float64(w.ticks) - m.idleTicks*sec) * float64(clockTick) / float64(time.Millisecond)
	schedMS = (float64(w.schedNS) - m.idleNS*sec) / 1e6
	return tickMS, schedMS
}

// measureIdle samples the agent's CPU rate over d with nothing happening.
func (m *meter) measureIdle(ctx context.Context, d time.Duration) error {
	a, err := m.agent.sample()
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
	}
	b, err := m.agent.sample()
	if err != nil {
		return err
	}
	sec := b.at.Sub(a.at).Seconds()
	m.idleNS = float64(b.schedNS-a.schedNS) / sec
	m.idleTicks = float64(b.ticks-a.ticks) / sec
	return nil
}

// settle waits from start (sample s0, push index p0) until the agent has
// pushed to at least minPods pods, then no push for m.quiet and its CPU
// is back at its idle rate, or timeout. The window it returns ends a
// little after the agent's last activity (its last push, or its last busy
// sample), not when the quiet time has passed: the less idle time a
// window holds, the less the idle rate's noise weighs on it.
func (m *meter) settle(ctx context.Context, s0 cpuSample, p0, minPods int, timeout time.Duration) (window, error) {
	hist := []cpuSample{s0}
	deadline := s0.at.Add(timeout)
	for {
		select {
		case <-ctx.Done():
			return window{}, ctx.Err()
		case <-time.After(sampleEvery):
		}
		if err := m.agent.exited(); err != nil {
			return window{}, err
		}
		s, err := m.agent.sample()
		if err != nil {
			return window{}, fmt.Errorf("sampling the agent: %w", err)
		}
		hist = append(hist, s)
		ps, _ := m.stacks.pushesSince(p0)
		t := tally(ps)
		last := s0.at
		if t.last.After(last) {
			last = t.last
		}
		timedOut := s.at.After(deadline)
		if !timedOut && (t.pods < minPods || s.at.Sub(last) < m.quiet) {
			continue
		}
		// The CPU over the last half of the quiet time: at most twice the
		// idle rate (before it is known, in the initial sync: a tenth of
		// a core) and 2 ms, so that a round that compiles without pushing
		// counts, and idle noise does not.
		ref := at(hist, s.at.Add(-m.quiet/2))
		rate := max(2*m.idleNS, 1e8)
		if !timedOut && (ref.at.Equal(s0.at) ||
			float64(sub(s.schedNS, ref.schedNS)) > rate*s.at.Sub(ref.at).Seconds()+2e6) {
			continue
		}
		return m.windowOf(hist, t, last, !timedOut), nil
	}
}

// sampleEvery is how often settle samples the agent's CPU.
const sampleEvery = 20 * time.Millisecond

// minWindow is the shortest event window: an event that leads to no push
// and little work still has the agent's debounce and a round in it.
const minWindow = 500 * time.Millisecond

// windowOf is the window from hist[0] to a little after the last push or
// the last busy sample (one that took more than 4 ms of CPU in its 20 ms:
// idle, the agent takes 0 to 3), at least minWindow.
func (m *meter) windowOf(hist []cpuSample, t pushTally, lastPush time.Time, settled bool) window {
	s0 := hist[0]
	end := s0.at.Add(minWindow)
	if lastPush.After(end) {
		end = lastPush
	}
	for i := 1; i < len(hist); i++ {
		if sub(hist[i].schedNS, hist[i-1].schedNS) > 4e6 && hist[i].at.After(end) {
			end = hist[i].at
		}
	}
	e := at(hist, end.Add(100*time.Millisecond))
	if e.at.Before(end) {
		e = hist[len(hist)-1]
	}
	w := window{span: e.at.Sub(s0.at), ticks: e.ticks - s0.ticks, schedNS: sub(e.schedNS, s0.schedNS), pushes: t, settled: settled}
	w.took = lastPush.Sub(s0.at)
	return w
}

// at is the last sample of hist taken at or before t (hist[0] if none).
func at(hist []cpuSample, t time.Time) cpuSample {
	i := sort.Search(len(hist), func(i int) bool { return hist[i].at.After(t) })
	if i == 0 {
		return hist[0]
	}
	return hist[i-1]
}

func sub(a, b uint64) uint64 {
	if a < b {
		return 0 // a thread exited, taking its count with it
	}
	return a - b
}

// eventResult is one event kind's repetitions.
type eventResult struct {
	kind    string
	reps    []window
	cpuMS   float64 // mean over the repetitions, from ticks, net of idle
	schedMS float64 // the same from the threads' run time
	// schedMedianMS is the median repetition's threads' run time: the
	// agent's idle work (its collector, its watches) comes in bursts of
	// ~15 ms that land in some repetitions and not others, which for an
	// event that costs next to nothing moves the mean more than the
	// event does.
	schedMedianMS float64
	touched       int     // the most pods one repetition pushed to
	pushes        int     // pushes, summed over the repetitions
	maxPush       int     // the largest push
	tookMS        float64 // mean injection to last push
	settled       bool    // every repetition settled before its timeout
}

// runEvent injects reps events of kind and measures each.
func (m *meter) runEvent(ctx context.Context, c *cluster, st *fakeapi.Store, kind string, reps int, timeout time.Duration) (eventResult, error) {
	r := eventResult{kind: kind, settled: true}
	if err := m.measureIdle(ctx, 2*time.Second); err != nil {
		return r, err
	}
	var scheds []float64
	for range reps {
		ch, err := c.event(kind)
		if err != nil {
			return r, err
		}
		_, p0 := m.stacks.pushesSince(0)
		s0, err := m.agent.sample()
		if err != nil {
			return r, err
		}
		if _, err := st.Put(ch.resource, ch.obj); err != nil {
			return r, err
		}
		w, err := m.settle(ctx, s0, p0, 0, timeout)
		if err != nil {
			return r, err
		}
		r.reps = append(r.reps, w)
		tick, sched := m.netCPU(w)
		scheds = append(scheds, sched)
		r.cpuMS += tick / float64(reps)
		r.schedMS += sched / float64(reps)
		r.tookMS += float64(w.took.Microseconds()) / 1e3 / float64(reps)
		r.touched = max(r.touched, w.pushes.pods)
		r.pushes += w.pushes.pushes
		r.maxPush = max(r.maxPush, w.pushes.max)
		r.settled = r.settled && w.settled
	}
	r.schedMedianMS = median(scheds)
	return r, nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	} else {
		return s[n/2]
	}
}
