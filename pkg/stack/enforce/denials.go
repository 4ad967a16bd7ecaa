package enforce

import (
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

// Denial log lines are aggregated per denialKey and window: the first
// denial of a key gets a line at once; its repeats in the window are
// counted, and one line at the window's end says how many there were.
// At most denialLogKeys keys are followed at a time; the denials of
// further keys are counted, and one line at the window's end says how
// many went unlogged. So a window has at most 2*denialLogKeys+1 lines,
// however many denials and peers a pod floods with: a pod denied all
// day writes a few lines a minute, not a line per packet.
const (
	denialLogWindow = 10 * time.Second
	denialLogKeys   = 10
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

// denialLog keeps the recent denials of an Enforcer and logs them,
// aggregated. Safe for concurrent use: denials are rare next to packets,
// even a flood's next to the work each of its packets costs, so a mutex
// serves.
type denialLog struct {
	mu sync.Mutex // guards everything below
	// ring holds the last policy.RecentDenials; allocated at the first denial,
	// so that a stack that denies nothing pays nothing for it.
	ring   *[policy.RecentDenials]denial
	next   int // where the next record goes
	held   int // records in ring
	agg    denialAgg
	logger *slog.Logger // nil: no log lines
	// flushing: a timer will write the window's summary lines, for a
	// flood that stops (no next denial would write them).
	flushing bool
}

// Denied records a denial at now and writes its log line if it is the
// first of its key in the window.
func (l *denialLog) Denied(now time.Time, f policy.Flow, why policy.Reason, label string, gen uint64) {
	l.mu.Lock()
	if l.ring == nil {
		l.ring = new([policy.RecentDenials]denial)
	}
	d := denial{at: now, flow: f, why: why, label: label, gen: gen}
	l.ring[l.next] = d
	l.next = (l.next + 1) % policy.RecentDenials
	l.held = min(l.held+1, policy.RecentDenials)
	logger := l.logger
	if logger == nil {
		l.mu.Unlock()
		return
	}
	summary, first, write := l.agg.add(now, d)
	if l.agg.pending() && !l.flushing {
		l.flushing = true
		time.AfterFunc(l.agg.start.Add(denialLogWindow).Sub(now), l.tick)
	}
	l.mu.Unlock()
	logLines(logger, summary)
	if write {
		first.log(logger)
	}
}

// tick writes the summary of a window that has ended, when no denial
// came after it to do so.
func (l *denialLog) tick() {
	now := time.Now()
	l.mu.Lock()
	l.flushing = false
	var lines []logLine
	if l.agg.ended(now) {
		lines = l.agg.flush(now)
	}
	if l.agg.pending() {
		l.flushing = true
		time.AfterFunc(max(l.agg.start.Add(denialLogWindow).Sub(now), time.Millisecond), l.tick)
	}
	logger := l.logger
	l.mu.Unlock()
	if logger != nil {
		logLines(logger, lines)
	}
}

// recent returns the records held, oldest first, and how many denials
// got no line of their own.
func (l *denialLog) recent() (out []policy.Denial, suppressed uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == 0 {
		return nil, l.agg.total
	}
	out = make([]policy.Denial, 0, l.held)
	for i := range l.held {
		d := &l.ring[(l.next-l.held+i+policy.RecentDenials)%policy.RecentDenials]
		out = append(out, policy.Denial{
			Time: d.at, Direction: d.flow.Dir.String(), Protocol: policy.ProtoName(d.flow.Proto),
			Peer: d.flow.Peer, Port: d.flow.Port, Local: d.flow.Local,
			Layer: d.why.Layer(), Policies: d.label, Reason: d.why.String(), Generation: d.gen,
		})
	}
	return out, l.agg.total
}

// denialKey is what makes two denials the same for the log.
type denialKey struct {
	dir   policy.Dir
	proto uint8
	port  uint16
	why   policy.Reason
	peer  netip.Addr
}

func keyOf(d *denial) denialKey {
	return denialKey{dir: d.flow.Dir, proto: d.flow.Proto, port: d.flow.Port, why: d.why, peer: d.flow.Peer}
}

// logKind is what a log line says.
type logKind uint8

const (
	lineFirst    logKind = iota // a key's first denial
	lineRepeated                // a key's repeats in a window
	lineUnlogged                // the denials of keys not followed in a window
)

// logLine is a line to write: d's fields, and count denials it stands for.
type logLine struct {
	kind  logKind
	d     denial
	count uint64
	since time.Time // the window's start, for summaries
}

func (ln *logLine) log(logger *slog.Logger) {
	switch ln.kind {
	case lineUnlogged:
		logger.Info("network policy denials not logged", "suppressed", ln.count, "since", ln.since)
		return
	case lineRepeated:
		f := ln.d.flow
		logger.Info("network policy denied, repeated", "direction", f.Dir.String(), "protocol", policy.ProtoName(f.Proto), "peer", f.Peer,
			"port", f.Port, "local", f.Local, "layer", ln.d.why.Layer(), "policies", ln.d.label, "reason", ln.d.why.String(), "generation", ln.d.gen,
			"suppressed", ln.count, "since", ln.since)
		return
	}
	f := ln.d.flow
	logger.Info("network policy denied", "direction", f.Dir.String(), "protocol", policy.ProtoName(f.Proto), "peer", f.Peer,
		"port", f.Port, "local", f.Local, "layer", ln.d.why.Layer(), "policies", ln.d.label, "reason", ln.d.why.String(), "generation", ln.d.gen)
}

func logLines(logger *slog.Logger, lines []logLine) {
	for i := range lines {
		lines[i].log(logger)
	}
}

// denialAgg decides which denials get a log line: the aggregation of
// the package comment's constants. Not safe for concurrent use
// (denialLog guards it); times come from its caller, so that a test
// drives it with a clock of its own.
type denialAgg struct {
	start time.Time // the current window's start; zero before any denial
	// keys are the keys followed in the window, keys[:n]: the first
	// denial of each got a line; repeats counts the ones since.
	keys [denialLogKeys]struct {
		key     denialKey
		last    denial
		repeats uint64
	}
	n int
	// unlogged counts the window's denials of keys beyond the ones
	// followed; total every denial without a line of its own.
	unlogged, total uint64
}

// ended reports whether the window is over at now (a clock that went
// back ends it too, rather than muting the log until it catches up).
func (a *denialAgg) ended(now time.Time) bool {
	return a.start.IsZero() || now.Sub(a.start) >= denialLogWindow || now.Before(a.start)
}

// pending reports whether the window has denials that a summary line
// will count.
func (a *denialAgg) pending() bool {
	if a.unlogged > 0 {
		return true
	}
	for i := range a.n {
		if a.keys[i].repeats > 0 {
			return true
		}
	}
	return false
}

// add takes a denial at now. summary are the lines of a window that
// ended before now; first, when write, is d's own line.
func (a *denialAgg) add(now time.Time, d denial) (summary []logLine, first logLine, write bool) {
	if a.ended(now) {
		summary = a.flush(now)
	}
	k := keyOf(&d)
	for i := range a.n {
		if e := &a.keys[i]; e.key == k {
			e.repeats++
			e.last = d
			a.total++
			return summary, logLine{}, false
		}
	}
	if a.n == len(a.keys) {
		a.unlogged++
		a.total++
		return summary, logLine{}, false
	}
	e := &a.keys[a.n]
	e.key, e.last, e.repeats = k, d, 0
	a.n++
	return summary, logLine{kind: lineFirst, d: d}, true
}

// flush ends the window at now: a line per key with repeats, which stay
// followed (their next repeats are summarised, not logged anew), and
// one for the unlogged; the keys without repeats are dropped.
func (a *denialAgg) flush(now time.Time) []logLine {
	var lines []logLine
	kept := 0
	for i := range a.n {
		e := a.keys[i]
		if e.repeats == 0 {
			continue
		}
		lines = append(lines, logLine{kind: lineRepeated, d: e.last, count: e.repeats, since: a.start})
		e.repeats = 0
		a.keys[kept] = e
		kept++
	}
	a.n = kept
	if a.unlogged > 0 {
		lines = append(lines, logLine{kind: lineUnlogged, count: a.unlogged, since: a.start})
		a.unlogged = 0
	}
	a.start = now
	return lines
}
