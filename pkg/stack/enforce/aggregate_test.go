// SPDX-License-Identifier: Apache-2.0

package enforce

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/policy"
)

func egressTo(peer string, port uint16, at time.Time) denial {
	return denial{at: at, why: policy.NoRuleAdmits, label: "ns/out", gen: 3, flow: policy.Flow{Dir: policy.Egress, Proto: policy.ProtoTCP,
		Peer: netip.MustParseAddr(peer), Port: port, Local: netip.MustParseAddr("10.0.0.2")}}
}

// TestAggregateOneKey: a pod that sends to one denied peer all day gets
// a line for the first denial, then one line a window saying how many
// repeats it had, not a line each.
func TestAggregateOneKey(t *testing.T) {
	var a denialAgg
	t0 := time.Unix(1000, 0)
	lines := 0
	var summaries []logLine
	const perWindow = 5000
	const windows = 6
	for w := range windows {
		for i := range perWindow {
			now := t0.Add(time.Duration(w)*denialLogWindow + time.Duration(i)*denialLogWindow/perWindow)
			s, _, write := a.add(now, egressTo("10.9.0.1", 443, now))
			summaries = append(summaries, s...)
			lines += len(s)
			if write {
				lines++
			}
		}
	}
	summaries = append(summaries, a.flush(t0.Add(windows*denialLogWindow))...)
	lines++
	if want := 1 + windows; lines != want {
		t.Fatalf("lines for %d denials of one key over %d windows: got %d, want %d", perWindow*windows, windows, lines, want)
	}
	var counted uint64
	for _, s := range summaries {
		if s.kind != lineRepeated || s.d.flow.Port != 443 || s.d.label != "ns/out" {
			t.Fatalf("summary: got %+v, want the key's repeats", s)
		}
		counted += s.count
	}
	if want := uint64(perWindow*windows - 1); counted != want || a.total != want {
		t.Fatalf("repeats said: got %d (total %d), want %d", counted, a.total, want)
	}
}

// TestAggregateManyKeys: a flood to ever new peers and ports gets at most
// denialLogKeys first lines a window, and one line for the rest; a key
// seen again in the window is summarised, not logged anew.
func TestAggregateManyKeys(t *testing.T) {
	var a denialAgg
	t0 := time.Unix(1000, 0)
	var first, repeated, unlogged int
	var unloggedCount, repeatCount uint64
	tally := func(ls []logLine) {
		for _, l := range ls {
			switch l.kind {
			case lineRepeated:
				repeated++
				repeatCount += l.count
			case lineUnlogged:
				unlogged++
				unloggedCount += l.count
			}
		}
	}
	const n = 1000
	for i := range n {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		d := egressTo(netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)}).String(), uint16(1000+i), now)
		s, _, write := a.add(now, d)
		tally(s)
		if write {
			first++
		}
		// The first key, again: a repeat.
		s, _, write = a.add(now, egressTo("10.9.0.0", 1000, now))
		tally(s)
		if write {
			t.Fatalf("denial %d: a repeat of a followed key got a line of its own", i)
		}
	}
	tally(a.flush(t0.Add(denialLogWindow)))
	if first != denialLogKeys || repeated != 1 || unlogged != 1 {
		t.Fatalf("lines in one window: got %d first, %d repeated, %d unlogged; want %d, 1, 1", first, repeated, unlogged, denialLogKeys)
	}
	if repeatCount != n || unloggedCount != n-denialLogKeys || a.total != repeatCount+unloggedCount {
		t.Fatalf("counts: repeats %d unlogged %d total %d, want %d, %d and their sum", repeatCount, unloggedCount, a.total, n, n-denialLogKeys)
	}
	// The keys without repeats left with the window: new ones are
	// logged in the next; the one with repeats stays followed.
	now := t0.Add(denialLogWindow + time.Millisecond)
	if _, _, write := a.add(now, egressTo("10.9.9.9", 9, now)); !write {
		t.Fatal("a new key in the next window got no line")
	}
	if _, _, write := a.add(now, egressTo("10.9.0.0", 1000, now)); write {
		t.Fatal("a key followed across windows got a line of its own")
	}
}

// TestAggregateLinesBounded: whatever the mix, no window gets more than
// 2*denialLogKeys+1 lines.
func TestAggregateLinesBounded(t *testing.T) {
	var a denialAgg
	t0 := time.Unix(1000, 0)
	perWindow := map[int64]int{}
	for i := range 200000 {
		now := t0.Add(time.Duration(i) * 250 * time.Microsecond)
		// A few hot keys, many cold ones.
		port := uint16(i % 7)
		if i%3 == 0 {
			port = uint16(100 + i%5000)
		}
		s, _, write := a.add(now, egressTo("10.9.0.1", port, now))
		w := int64(now.Sub(t0) / denialLogWindow)
		perWindow[w] += len(s)
		if write {
			perWindow[w]++
		}
	}
	for w, n := range perWindow {
		if n > 2*denialLogKeys+1 {
			t.Errorf("window %d: got %d lines, want at most %d", w, n, 2*denialLogKeys+1)
		}
	}
}

// TestAggregateClockBack: a clock that went back ends the window rather
// than muting every new key until it catches up.
func TestAggregateClockBack(t *testing.T) {
	var a denialAgg
	t0 := time.Unix(1000, 0)
	for i := range denialLogKeys {
		a.add(t0, egressTo("10.9.0.1", uint16(i), t0))
	}
	if _, _, write := a.add(t0, egressTo("10.9.0.1", 999, t0)); write {
		t.Fatal("a key beyond denialLogKeys got a line")
	}
	back := t0.Add(-time.Hour)
	s, _, write := a.add(back, egressTo("10.9.0.1", 999, back))
	if !write || len(s) != 1 || s[0].kind != lineUnlogged || s[0].count != 1 {
		t.Fatalf("after the clock went back: got line %v, summary %+v; want a line and the unlogged one", write, s)
	}
}
