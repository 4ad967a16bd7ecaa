package policy

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
)

// ErrStale is the error of a push older than the policy in force.
var ErrStale = errors.New("policy is older than the one in force")

// ErrOff is the error of a push to a stack that does not enforce policy
// (stackconfig.Config.Policy false).
var ErrOff = errors.New("policy enforcement is off")

// Enforcer holds the policy a stack enforces, shared by the wire leg and
// the relay, and counts its denials. The verdict sites ask For(d): nil
// when d allows everything, so that a pod no policy selects pays one
// atomic load and a nil check per packet or flow they look at. A new
// policy is swapped in whole; a verdict already taken stands (connections
// and flows that exist are not cut).
type Enforcer struct {
	// dirs holds the matcher in force for each direction that is
	// isolated, nil for one that is not.
	dirs [2]atomic.Pointer[Matcher]
	cur  atomic.Pointer[Matcher]
	// mu serializes Set and guards denied.
	mu sync.Mutex
	// denied counts denials per direction and label, across policies: a
	// new policy with the same isolating policies counts on.
	denied [2]map[string]*atomic.Uint64
	// log keeps the recent denials, whichever policy denied them.
	log denialLog
}

// NewEnforcer returns an Enforcer holding p.
func NewEnforcer(p *PodPolicy) (*Enforcer, error) {
	e := &Enforcer{}
	for d := range e.denied {
		e.denied[d] = make(map[string]*atomic.Uint64)
	}
	m, err := Compile(p)
	if err != nil {
		return nil, err
	}
	e.install(m)
	return e, nil
}

// AllowAll is an Enforcer that allows everything, for a stack that does
// not enforce policy.
func AllowAll() *Enforcer {
	e, err := NewEnforcer(&PodPolicy{Version: FormatVersion})
	if err != nil {
		panic(err) // the empty policy is valid
	}
	return e
}

// For is the matcher to ask for a new connection or flow in direction d,
// nil when d allows everything.
func (e *Enforcer) For(d Dir) *Matcher {
	if e == nil {
		return nil
	}
	return e.dirs[d].Load()
}

// Current is the matcher in force.
func (e *Enforcer) Current() *Matcher { return e.cur.Load() }

// Set compiles p and puts it in force, unless it is invalid or older than
// the policy in force (ErrStale). A push of the same generation is
// accepted: the agent repeats its last push to a restarted stack.
func (e *Enforcer) Set(p *PodPolicy) error {
	m, err := Compile(p)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if cur := e.cur.Load(); p.Generation < cur.gen {
		return fmt.Errorf("generation %d, in force %d: %w", p.Generation, cur.gen, ErrStale)
	}
	e.install(m)
	return nil
}

// install attaches the denial counters to m and swaps it in. Called with
// mu held, or before e is shared.
func (e *Enforcer) install(m *Matcher) {
	for d := range m.dirs {
		dm := &m.dirs[d]
		if !dm.isolated {
			continue
		}
		c := e.denied[d][dm.label]
		if c == nil {
			c = new(atomic.Uint64)
			e.denied[d][dm.label] = c
		}
		dm.denied = c
	}
	m.log = &e.log
	e.cur.Store(m)
	for d := range m.dirs {
		if m.dirs[d].isolated {
			e.dirs[d].Store(m)
		} else {
			e.dirs[d].Store(nil)
		}
	}
}

// SetLogger has each denial logged to l, at most denialLogLines a second
// (the lines beyond are counted, and the next line says how many). Nil:
// none.
func (e *Enforcer) SetLogger(l *slog.Logger) {
	e.log.mu.Lock()
	e.log.logger = l
	e.log.mu.Unlock()
}

// Status is the policy in force and the denials, for the control socket.
type Status struct {
	Generation      uint64 `json:"generation"`
	IngressIsolated bool   `json:"ingressIsolated"`
	EgressIsolated  bool   `json:"egressIsolated"`
	Denied          Denied `json:"denied"`
	// RecentDenials are the last RecentDenials denials, oldest first.
	RecentDenials []Denial `json:"recentDenials,omitempty"`
	// DenialLogsSuppressed counts the denials that got no log line
	// (the rate limit).
	DenialLogsSuppressed uint64 `json:"denialLogsSuppressed,omitempty"`
}

// Denied counts denials per isolating policies' label.
type Denied struct {
	Ingress map[string]uint64 `json:"ingress"`
	Egress  map[string]uint64 `json:"egress"`
}

// Status reads the policy in force and the denial counters.
func (e *Enforcer) Status() Status {
	m := e.cur.Load()
	s := Status{Generation: m.gen, IngressIsolated: m.dirs[Ingress].isolated, EgressIsolated: m.dirs[Egress].isolated}
	e.mu.Lock()
	defer e.mu.Unlock()
	read := func(d Dir) map[string]uint64 {
		out := make(map[string]uint64, len(e.denied[d]))
		for k, c := range maps.All(e.denied[d]) {
			out[k] = c.Load()
		}
		return out
	}
	s.Denied = Denied{Ingress: read(Ingress), Egress: read(Egress)}
	s.RecentDenials, s.DenialLogsSuppressed = e.log.recent()
	return s
}
