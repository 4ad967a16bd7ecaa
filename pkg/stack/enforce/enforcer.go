// Package enforce holds the network policy a stack enforces: the compiled
// policy in force for each direction, swapped atomically when the agent
// pushes a new one, the denial counters that survive the swap, and the
// recent denials with their aggregated log lines. The wire leg and the
// relay take their verdicts from it; what a policy means is
// pkg/api/policy's.
package enforce

import (
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// Enforcer holds the policy a stack enforces, shared by the wire leg and
// the relay, and counts its denials. The verdict sites ask For(d): nil
// when d allows everything, so that a pod no policy selects pays one
// atomic load and a nil check per packet or flow they look at. A new
// policy is swapped in whole; a verdict already taken stands (connections
// and flows that exist are not cut).
type Enforcer struct {
	// dirs holds the matcher in force for each direction that is
	// isolated, nil for one that is not.
	dirs [2]atomic.Pointer[policy.Matcher]
	cur  atomic.Pointer[policy.Matcher]
	// mu serializes Set and guards denied.
	mu sync.Mutex
	// denied counts denials per direction and label, across policies: a
	// new policy with the same isolating policies counts on.
	denied [2]map[string]*atomic.Uint64
	// log keeps the recent denials, whichever policy denied them.
	log denialLog
}

// NewEnforcer returns an Enforcer holding p.
func NewEnforcer(p *policy.PodPolicy) (*Enforcer, error) {
	e := &Enforcer{}
	for d := range e.denied {
		e.denied[d] = make(map[string]*atomic.Uint64)
	}
	m, err := policy.Compile(p)
	if err != nil {
		return nil, err
	}
	e.install(m)
	return e, nil
}

// AllowAll is an Enforcer that allows everything, for a stack that does
// not enforce policy.
func AllowAll() *Enforcer {
	e, err := NewEnforcer(&policy.PodPolicy{Version: policy.FormatVersion})
	if err != nil {
		panic(err) // the empty policy is valid
	}
	return e
}

// For is the matcher to ask for a new connection or flow in direction d,
// nil when d allows everything.
func (e *Enforcer) For(d policy.Dir) *policy.Matcher {
	if e == nil {
		return nil
	}
	return e.dirs[d].Load()
}

// Current is the matcher in force.
func (e *Enforcer) Current() *policy.Matcher { return e.cur.Load() }

// Set compiles p and puts it in force, unless it is invalid or older than
// the policy in force (policy.ErrStale). A push of the same generation is
// accepted: the agent repeats its last push to a restarted stack.
func (e *Enforcer) Set(p *policy.PodPolicy) error {
	m, err := policy.Compile(p)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if cur := e.cur.Load(); p.Generation < cur.Generation() {
		return fmt.Errorf("generation %d, in force %d: %w", p.Generation, cur.Generation(), policy.ErrStale)
	}
	e.install(m)
	return nil
}

// install attaches the denial counters to m and swaps it in. Called with
// mu held, or before e is shared.
func (e *Enforcer) install(m *policy.Matcher) {
	m.Attach(func(d policy.Dir, label string) *atomic.Uint64 {
		c := e.denied[d][label]
		if c == nil {
			c = new(atomic.Uint64)
			e.denied[d][label] = c
		}
		return c
	}, &e.log)
	e.cur.Store(m)
	for _, d := range []policy.Dir{policy.Ingress, policy.Egress} {
		if m.Isolated(d) {
			e.dirs[d].Store(m)
		} else {
			e.dirs[d].Store(nil)
		}
	}
}

// SetLogger has the denials logged to l, aggregated: a line for the
// first denial of a peer, protocol, port and reason, one a window for its
// repeats, at most 2*denialLogKeys+1 lines a window (denials.go). Nil:
// none.
func (e *Enforcer) SetLogger(l *slog.Logger) {
	e.log.mu.Lock()
	e.log.logger = l
	e.log.mu.Unlock()
}

// Status reads the policy in force and the denial counters.
func (e *Enforcer) Status() policy.Status {
	m := e.cur.Load()
	s := policy.Status{Generation: m.Generation(), IngressIsolated: m.Isolated(policy.Ingress), EgressIsolated: m.Isolated(policy.Egress),
		Layers: m.Layers()}
	e.mu.Lock()
	defer e.mu.Unlock()
	read := func(d policy.Dir) map[string]uint64 {
		out := make(map[string]uint64, len(e.denied[d]))
		for k, c := range maps.All(e.denied[d]) {
			out[k] = c.Load()
		}
		return out
	}
	s.Denied = policy.Denied{Ingress: read(policy.Ingress), Egress: read(policy.Egress)}
	s.RecentDenials, s.DenialLogsSuppressed = e.log.recent()
	return s
}
