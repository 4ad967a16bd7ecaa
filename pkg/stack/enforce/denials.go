package enforce

import (
	"log/slog"
	"sync"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// Denial log lines: at most denialLogLines per denialLogWindow; the
// denials beyond get none, and the next line that is written says how
// many did not (a flood from a denied peer must not fill the stack's log).
const (
	denialLogLines  = 10
	denialLogWindow = time.Second
)

// denial is a record of the ring: plain values, so that recording one
// allocates nothing (the label is the matcher's string).
type denial struct {
	at    time.Time
	flow  policy.Flow
	why   policy.Reason
	label string
	gen   uint64
}

// denialLog keeps the recent denials of an Enforcer and logs them through
// a rate limit. Safe for concurrent use: denials are rare next to
// packets, even a flood's next to the work each of its packets costs, so
// a mutex serves.
type denialLog struct {
	mu sync.Mutex // guards everything below
	// ring holds the last policy.RecentDenials; allocated at the first denial,
	// so that a stack that denies nothing pays nothing for it.
	ring   *[policy.RecentDenials]denial
	next   int // where the next record goes
	held   int // records in ring
	limit  logLimit
	logger *slog.Logger // nil: no log lines
}

// Denied records a denial at now and writes its log line if the rate
// limit lets it.
func (l *denialLog) Denied(now time.Time, f policy.Flow, why policy.Reason, label string, gen uint64) {
	l.mu.Lock()
	if l.ring == nil {
		l.ring = new([policy.RecentDenials]denial)
	}
	l.ring[l.next] = denial{at: now, flow: f, why: why, label: label, gen: gen}
	l.next = (l.next + 1) % policy.RecentDenials
	l.held = min(l.held+1, policy.RecentDenials)
	logger := l.logger
	var (
		write      bool
		suppressed uint64
	)
	if logger != nil {
		write, suppressed = l.limit.take(now)
	}
	l.mu.Unlock()
	if !write {
		return
	}
	attrs := []any{"direction", f.Dir.String(), "protocol", policy.ProtoName(f.Proto), "peer", f.Peer,
		"port", f.Port, "local", f.Local, "policies", label, "reason", why.String(), "generation", gen}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	logger.Info("network policy denied", attrs...)
}

// recent returns the records held, oldest first.
func (l *denialLog) recent() (out []policy.Denial, suppressed uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == 0 {
		return nil, l.limit.total
	}
	out = make([]policy.Denial, 0, l.held)
	for i := range l.held {
		d := &l.ring[(l.next-l.held+i+policy.RecentDenials)%policy.RecentDenials]
		out = append(out, policy.Denial{
			Time: d.at, Direction: d.flow.Dir.String(), Protocol: policy.ProtoName(d.flow.Proto),
			Peer: d.flow.Peer, Port: d.flow.Port, Local: d.flow.Local,
			Policies: d.label, Reason: d.why.String(), Generation: d.gen,
		})
	}
	return out, l.limit.total
}

// logLimit lets denialLogLines lines through per denialLogWindow. Not
// safe for concurrent use (denialLog guards it).
type logLimit struct {
	window time.Time // when the current window began
	lines  int       // lines written in it
	// pending counts the denials without a line since the last line;
	// total all of them.
	pending, total uint64
}

// take reports whether a denial at now gets a log line, and if so how
// many went without one since the last line.
func (l *logLimit) take(now time.Time) (write bool, suppressed uint64) {
	if now.Sub(l.window) >= denialLogWindow || now.Before(l.window) {
		l.window, l.lines = now, 0
	}
	if l.lines >= denialLogLines {
		l.pending++
		l.total++
		return false, 0
	}
	l.lines++
	suppressed, l.pending = l.pending, 0
	return true, suppressed
}
