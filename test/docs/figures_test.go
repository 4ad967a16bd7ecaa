package docs

import (
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// A figure is a measured number as a page writes it: one number or a
// range or list of them ("53 ms", "12.4 / 13.6 Gbit/s", "0.45×–0.56×",
// "146–228 µs") followed by a unit that only measurements carry here:
// ms, µs, Gbit/s, MiB, core·s, core·ms, rps, req/s, or the × of a ratio.
// Seconds, percentages, Mbit/s and byte sizes other than MiB are left
// out: they are mostly timeouts, limits and defaults.
var (
	figureNum  = `\d+(?:,\d{3})*(?:\.\d+)?k?`
	figureSep  = `\s?(?:–|-|/)\s?`
	figureUnit = `(ms|µs|Gbit/s|MiB|core·s|core·ms|rps|req/s|×)`
	figureRE   = regexp.MustCompile(`(?:^|[^\w.·])(` + figureNum + `×?(?:` + figureSep + figureNum + `×?)*)\s?` + figureUnit + `(?:[^\w/]|$)`)
	numberRE   = regexp.MustCompile(figureNum)
	// unitWord finds the unit a table's header cell gives its column.
	unitWord = regexp.MustCompile(`core·ms|core·s|Gbit/s|µs|MiB|rps|req/s|\bms\b`)
)

// notMeasurements are figures the pages may state without BENCHMARKS.md:
// limits, defaults and sizes the code sets, each with where it comes from.
var notMeasurements = map[string]string{
	"200 µs":  "the busy-poll window the benchmark's row uses (a setting)",
	"50 µs":   "the shorter busy-poll window of the A/B (a setting)",
	"200 ms":  "the wire queue's wedge timeout (pkg/stack)",
	"50 ms":   "the agent's policy debounce (pkg/agent)",
	"10 ms":   "Go's scheduler preemption slice",
	"20 µs":   "the fragment loop's sleep (pkg/stack)",
	"4 MiB":   "buffer sizes: a capture's queue, the receive window, Go's first collection",
	"1 MiB":   "plugin-ops.log's cap, the SYN ring",
	"2 MiB":   "the fragment socket's buffer",
	"6 MiB":   "the fragment flood's RSS bound (test/hostile)",
	"8 MiB":   "the scale section's PSS target",
	"15 MiB":  "the idle-stack RSS target",
	"12 MiB":  "stack.ReassemblyBound",
	"64 MiB":  "the stack's base memory allowance, a test transfer size",
	"256 MiB": "the dataplane suite's transfer size",
	"160 MiB": "the hostile test's memory bound",
	"136 MiB": "the hostile flooder's memory bound",
	"10×":     "the race detector's memory allowance",
	"40 ms":   "Linux's minimum delayed ACK",
	"2 ms":    "the stack's delayed ACK (pkg/stack/podstack)",
	"16 MiB":  "the captures' memory bound: 4 captures of 4 MiB",
	"150 ms":  "capture's pcapng ordering window",
}

type figure struct {
	text string
	nums []string
	unit string
}

// figuresIn finds the figures of a line.
func figuresIn(line string) []figure {
	var out []figure
	for _, m := range figureRE.FindAllStringSubmatch(line, -1) {
		unit := m[2]
		nums := numberRE.FindAllString(m[1], -1)
		f := figure{text: strings.TrimSpace(m[1]) + spaceBefore(unit) + unit, unit: unit}
		for _, n := range nums {
			u := unit
			if strings.HasSuffix(n, "k") {
				n, u = strings.TrimSuffix(n, "k"), "k"+unit
			}
			f.nums = append(f.nums, strings.ReplaceAll(n, ",", ""))
			f.unit = u
		}
		out = append(out, f)
	}
	return out
}

func spaceBefore(unit string) string {
	if unit == "×" {
		return ""
	}
	return " "
}

// heldFigures is what a source page holds: per unit, the numbers it
// gives with that unit ("*": a table's bare cell under a header without a
// unit). A source is read generously, the pages strictly:
// in a source's prose a bare number counts with the nearest unit of its
// clause ("here `hardware` 191 µs, busy polling 143" holds 143 µs), and a
// table's bare cells with the unit its column's header names.
func heldFigures(text string) map[string][]string {
	held := map[string][]string{}
	add := func(unit string, nums ...string) {
		for _, n := range nums {
			u := unit
			if strings.HasSuffix(n, "k") {
				n, u = strings.TrimSuffix(n, "k"), "k"+unit
			}
			held[u] = append(held[u], strings.ReplaceAll(n, ",", ""))
		}
	}
	var header []string
	var para []string
	flush := func() {
		for _, clause := range clauseSep.Split(strings.Join(para, " "), -1) {
			for _, f := range figuresIn(clause) {
				add(f.unit, f.nums...)
			}
			units := unitToken.FindAllStringIndex(clause, -1)
			for _, m := range numberRE.FindAllStringIndex(clause, -1) {
				// "2 rounds", "p99 of 100 pods": a count, not a figure.
				if rest := strings.TrimLeft(clause[m[1]:], " "); rest != "" && unicode.IsLetter([]rune(rest)[0]) && unitToken.FindStringIndex(rest) == nil {
					continue
				} else if loc := unitToken.FindStringIndex(rest); loc != nil && loc[0] != 0 && rest != "" && unicode.IsLetter([]rune(rest)[0]) {
					continue
				}
				best, dist := "", 31
				for _, u := range units {
					d := u[0] - m[1]
					if u[1] <= m[0] {
						d = m[0] - u[1]
					}
					if d >= 0 && d < dist {
						best, dist = clause[u[0]:u[1]], d
					}
				}
				if best != "" {
					add(best, clause[m[0]:m[1]])
				}
			}
		}
		para = nil
	}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "|") {
			header = nil
			if strings.TrimSpace(line) == "" {
				flush()
			} else {
				para = append(para, line)
			}
			continue
		}
		flush()
		for _, f := range figuresIn(line) {
			add(f.unit, f.nums...)
		}
		cells := strings.Split(strings.Trim(line, "| "), "|")
		if header == nil {
			header = cells
			continue
		}
		for i, c := range cells {
			if i >= len(header) {
				break
			}
			u := unitWord.FindString(header[i])
			if u == "" {
				// An archive's tables often give a column's unit only
				// in the prose around them ("node→pod", Gbit/s): a
				// bare cell counts in any unit.
				u = "*"
			}
			add(u, numberRE.FindAllString(c, -1)...)
		}
	}
	flush()
	return held
}

var (
	clauseSep = regexp.MustCompile(`[;:]\s|\.\s|[()]`)
	unitToken = regexp.MustCompile(`core·ms|core·s|Gbit/s|µs|MiB|rps|req/s|×|\bms\b`)
)

// holds reports whether a source gives n (a page may round: 8.16 is
// quoted as 8.2).
func holds(src []string, n string) bool {
	want, err := strconv.ParseFloat(n, 64)
	if err != nil {
		return false
	}
	dec := 0
	if i := strings.IndexByte(n, '.'); i >= 0 {
		dec = len(n) - i - 1
	}
	for _, s := range src {
		if s == n {
			return true
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || !strings.Contains(s, ".") || len(s)-strings.IndexByte(s, '.')-1 <= dec {
			continue
		}
		p := math.Pow(10, float64(dec))
		if math.Abs(math.Round(v*p)/p-want) < 1e-9 {
			return true
		}
	}
	return false
}

var archiveLink = regexp.MustCompile(`\]\(((?:\.\./)*(?:docs/)?benchmarks/[^)#\s]+\.md)(?:#[^)]*)?\)`)

// figurePages are the pages that must take their measured figures from
// BENCHMARKS.md: the README and docs/*.md (not the archive under
// docs/benchmarks/, whose files are the dated records BENCHMARKS.md
// cites, nor docs/reliability/, the suites' own lab notes).
func figurePages(t *testing.T) []string {
	t.Helper()
	pages := []string{filepath.Join(repo, "README.md")}
	m, err := filepath.Glob(filepath.Join(repo, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append(pages, m...)
}

// figureFindings lists the figures of page that neither BENCHMARKS.md
// (bench) nor a docs/benchmarks/ file linked from the same section holds.
func figureFindings(t *testing.T, name, dir, text string, bench map[string][]string) []string {
	var out []string
	archives := map[string]map[string][]string{}
	sectionHeld := func(section string) []map[string][]string {
		var hs []map[string][]string
		for _, m := range archiveLink.FindAllStringSubmatch(section, -1) {
			p := filepath.Join(dir, m[1])
			h, ok := archives[p]
			if !ok {
				b, err := os.ReadFile(p)
				if err != nil {
					continue // TestLinksResolve reports it
				}
				h = heldFigures(string(b))
				archives[p] = h
			}
			hs = append(hs, h)
		}
		return hs
	}
	lines := proseLines(text)
	start := 0
	for start < len(lines) {
		end := start + 1
		for end < len(lines) && !heading.MatchString(lines[end]) {
			end++
		}
		sources := append([]map[string][]string{bench}, sectionHeld(strings.Join(lines[start:end], "\n"))...)
		// A figure may wrap: read each paragraph (or table row) as one
		// line, and report the line the figure starts on.
		for i := start; i < end; {
			j := i + 1
			if strings.TrimSpace(lines[i]) != "" && !strings.HasPrefix(lines[i], "|") {
				for j < end && strings.TrimSpace(lines[j]) != "" && !strings.HasPrefix(lines[j], "|") && !listItem.MatchString(lines[j]) {
					j++
				}
			}
			para := inlineCode.ReplaceAllString(strings.Join(lines[i:j], "\n"), "")
			for _, loc := range figureRE.FindAllStringSubmatchIndex(para, -1) {
				f := figuresIn(strings.ReplaceAll(para[loc[0]:loc[1]], "\n", " "))
				if len(f) == 0 {
					continue
				}
				line := i + 1 + strings.Count(para[:loc[2]], "\n")
				if msg := checkFigure(f[0], sources); msg != "" {
					out = append(out, name+":"+itoa(line)+": "+msg)
				}
			}
			i = j
		}
		start = end
	}
	return out
}

var listItem = regexp.MustCompile(`^\s*(?:[-*]|\d+\.)\s`)

// checkFigure says what is wrong with f, "" when a source holds it.
func checkFigure(f figure, sources []map[string][]string) string {
	if _, ok := notMeasurements[f.text]; ok {
		return ""
	}
	var missing []string
	for _, n := range f.nums {
		found := false
		for i, src := range sources {
			// BENCHMARKS.md (the first source) names its columns' units;
			// only an archive file's bare cells count in any unit.
			if holds(src[f.unit], n) || (i > 0 && holds(src["*"], n)) {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, n)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return quote(f.text) + ": BENCHMARKS.md does not hold " + strings.Join(missing, ", ") + " " + f.unit +
		" (nor a docs/benchmarks/ file this section links): link BENCHMARKS.md instead of restating it, quote the figure it holds, or add a setting to notMeasurements"
}

// Every measured figure a page quotes is one BENCHMARKS.md holds (or the
// dated archive file the same section links, for a past A/B): each number
// has one home, and the pages cannot drift from it.
func TestFiguresFromBenchmarks(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repo, "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	bench := heldFigures(string(b))
	if n := len(bench["×"]); n < 100 {
		t.Fatalf("found %d ratios in BENCHMARKS.md, want its tables' (≥ 100): is the figure pattern broken?", n)
	}
	for _, f := range figurePages(t) {
		page, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(repo, f)
		for _, e := range figureFindings(t, name, filepath.Dir(f), string(page), bench) {
			t.Error(e)
		}
	}
}

func TestFigurePattern(t *testing.T) {
	for line, want := range map[string]string{
		"an ADD takes about 55 ms one at a time": "55 ms",
		"bulk 0.69× / 0.67× the kernel":          "0.69× / 0.67×",
		"12.4 / 13.6 Gbit/s (19.4 / 19.4 then)":  "12.4 / 13.6 Gbit/s",
		"redis 0.45×–0.56× on the same path":     "0.45×–0.56×",
		"63.0k / 59.0k rps":                      "63.0k / 59.0k rps",
		"0.71 core·s per GB":                     "0.71 core·s",
		"TCP_RR p50 191 µs":                      "191 µs",
		"a stack starts in 25–45 ms":             "25–45 ms",
	} {
		got := figuresIn(line)
		if len(got) != 1 || got[0].text != want {
			t.Errorf("figuresIn(%q) = %+v, want one figure %q", line, got, want)
		}
	}
	for _, line := range []string{"--metrics-address :9437", "gso_max_size 65536", "10 s interval", "p99 of 100 pods", "a 1-byte ping-pong", "2^32-1 bits", "x86_64 msr"} {
		if got := figuresIn(line); len(got) != 0 {
			t.Errorf("figuresIn(%q) = %+v, want none", line, got)
		}
	}
	src := heldFigures("| config | TCP_RR p50 | core·s per GB |\n|---|---|---|\n| a | 8.16× | 1.56 / 0.710 |\n")
	for unit, n := range map[string]string{"×": "8.2", "core·s": "0.71"} {
		if !holds(src[unit], n) {
			t.Errorf("a table's %s %s is not held: %v", n, unit, src)
		}
	}
	if holds(src["×"], "8.1") {
		t.Errorf("8.1× held by 8.16×")
	}
}
