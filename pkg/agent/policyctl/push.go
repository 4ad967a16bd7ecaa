package policyctl

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/control"
	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
	"github.com/cni-usernet/cni-usernet/pkg/api/state"
	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
)

// pusher brings each stack to hold its pod's policy: it numbers the
// policies, writes the pod's policy file, then pushes to the stack's
// control socket, and remembers what each stack holds so that a policy
// that did not change is not pushed again.
//
// The file comes first so that a stack the supervisor restarts comes back
// with the latest policy, and so that an agent killed between the two
// finds, once restarted, what it had decided: its first pass pushes every
// pod, whatever it believes the stack holds.
type pusher struct {
	timeout time.Duration // of one PUT /policy

	mu sync.Mutex // guards gen and stacks
	// gen is the last generation handed out.
	gen    uint64
	stacks map[string]*podState // by attachment key
}

// podState is what the controller knows of one attachment's stack.
type podState struct {
	// mu serializes compiling and pushing for the pod, so that its
	// pushes go out in the order of their generations.
	mu sync.Mutex
	// applied is what the stack holds; nil: not known (this agent has
	// not pushed to it yet).
	applied *heldPolicy
	// failures is the run of failed pushes the reporter tells of.
	failures failures
}

// newPusher starts the generations above those of the node's policy
// files (startGeneration).
func newPusher(store state.Store, timeout time.Duration) *pusher {
	var fileMax uint64
	atts, _ := store.List()
	for _, a := range atts {
		if p, err := policy.ReadFile(policyPath(a)); err == nil {
			fileMax = max(fileMax, p.Generation)
		}
	}
	return &pusher{timeout: timeout, gen: startGeneration(fileMax, time.Now()), stacks: map[string]*podState{}}
}

// Generations start from the time in microseconds, or past the largest in
// the policy files when that is larger: a restarted agent continues above
// what any stack may hold, even with its files lost (a clock set back
// while the files are lost is the one case that breaks this).
func startGeneration(fileMax uint64, now time.Time) uint64 {
	return max(fileMax, uint64(now.UnixMicro()))
}

// lock returns the state of the stack of attachment key, locked: the
// caller compiles and pushes, then unlocks ps.mu.
func (p *pusher) lock(key string) *podState {
	p.mu.Lock()
	ps := p.stacks[key]
	if ps == nil {
		ps = &podState{}
		p.stacks[key] = ps
	}
	p.mu.Unlock()
	ps.mu.Lock()
	return ps
}

// inStep says whether this agent pushed key's stack its policy and knows
// what it holds: a stack not in step is compiled and pushed at every
// round until it is.
func (p *pusher) inStep(key string) bool {
	p.mu.Lock()
	ps := p.stacks[key]
	p.mu.Unlock()
	if ps == nil {
		return false
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.applied != nil
}

// countInStep is how many stacks hold what this agent pushed them.
func (p *pusher) countInStep() int {
	p.mu.Lock()
	stacks := make([]*podState, 0, len(p.stacks))
	for _, ps := range p.stacks {
		stacks = append(stacks, ps)
	}
	p.mu.Unlock()
	n := 0
	for _, ps := range stacks {
		ps.mu.Lock()
		if ps.applied != nil {
			n++
		}
		ps.mu.Unlock()
	}
	return n
}

// forget drops the state of the stacks whose attachments are not in live.
func (p *pusher) forget(live map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := range p.stacks {
		if !live[k] {
			delete(p.stacks, k)
		}
	}
}

// push brings t's stack, whose state ps the caller holds locked, to hold
// pol: nothing to do when it holds it already (false), else written and
// pushed (true). A policy without a generation is given one. cost
// receives the time spent on the file and on the stack.
func (p *pusher) push(ps *podState, t target, pol *policy.PodPolicy, cost *podCost) (bool, error) {
	digest := digestOf(pol)
	if ps.applied != nil && ps.applied.digest == digest {
		return false, nil
	}
	if ps.applied == nil {
		// This agent never pushed to the stack: the file holds what the
		// last agent decided, pushed or not (killed in between). The same
		// policy keeps its generation; the push goes out regardless.
		if old, err := policy.ReadFile(t.file); err == nil && digestOf(old) == digest {
			pol.Generation = old.Generation
		}
	}
	if pol.Generation == 0 {
		pol.Generation = p.nextGeneration()
	}
	err := p.write(t, pol, cost)
	var stale *staleError
	if errors.As(err, &stale) {
		// The stack holds a newer generation than ours (its file was
		// lost, or the clock went back): continue above it.
		p.mu.Lock()
		p.gen = max(p.gen, stale.held)
		p.mu.Unlock()
		pol.Generation = p.nextGeneration()
		err = p.write(t, pol, cost)
	}
	if err != nil {
		// What the stack holds is not known any more (the PUT may have
		// reached it), and the file holds pol: the next pass pushes again.
		ps.applied = nil
		return false, err
	}
	ps.applied = &heldPolicy{digest: digest, generation: pol.Generation}
	return true, nil
}

func (p *pusher) nextGeneration() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	return p.gen
}

// staleError is a push the stack refused as older than what it holds.
type staleError struct{ held uint64 }

func (e *staleError) Error() string {
	return fmt.Sprintf("the stack holds a newer policy (generation %d)", e.held)
}

// write puts pol in t's policy file, atomically, then in its stack.
func (p *pusher) write(t target, pol *policy.PodPolicy, cost *podCost) error {
	if t.file == "" {
		return errors.New("the attachment has no policy file path")
	}
	begin := time.Now()
	if err := writePolicyFile(t.file, pol); err != nil {
		return fmt.Errorf("writing %s: %w", t.file, err)
	}
	cost.file += time.Since(begin)
	begin = time.Now()
	gen, err := control.PutPolicy(t.socket, p.timeout, pol)
	cost.put += time.Since(begin)
	var refused *control.RefusedError
	if errors.As(err, &refused) && refused.Status == http.StatusConflict {
		// Older than what the stack holds, or the stack enforces no
		// policy (started without networkPolicy): its status tells.
		var st control.Status
		if control.FetchStatus(t.socket, p.timeout, &st) == nil && st.Policy != nil && st.Policy.Generation > pol.Generation {
			return &staleError{held: st.Policy.Generation}
		}
	}
	if err != nil {
		return err
	}
	if gen != pol.Generation {
		return fmt.Errorf("pushing generation %d: the stack answered %d", pol.Generation, gen)
	}
	return nil
}

// writePolicyFile replaces path with pol through a temporary file and a
// rename, so that no reader sees a torn policy, but without syncing it
// to disk: the file is read by processes of this boot only (a stack its
// supervisor restarts, an agent started again), which the page cache
// serves. A host that crashes takes every stack with it, and each pod's
// stack is started again by an ADD that gets its policy from the agent,
// not from the file. A sync per file costs a journal commit each: a round
// that changes every local pod's policy spent a third as long in those
// as in its PUTs, and a thousand times what compiling took.
func writePolicyFile(path string, pol *policy.PodPolicy) error {
	b, err := policy.Marshal(pol)
	if err != nil {
		return fmt.Errorf("encoding the policy: %w", err)
	}
	return atomicfile.WriteVolatile(path, b, 0o600)
}
