package docs

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Code comments say why, and the project's figures live in BENCHMARKS.md
// and docs/: a comment that states a measurement ("redis 0.44× against
// 0.61×", "930 MiB RSS") goes stale the day the code or the machine
// changes, and nothing checks it. A comment may name a setting (a
// buffer's size, a timeout) and point to the page that holds the
// measurement behind it.

// measuredWords catch what figureRE's units do not: a number the comment
// says was measured or observed.
var measuredWords = regexp.MustCompile(`(?i)\bmeasured\b[^.;]{0,12}\d|\d[^.;]{0,24}\bmeasured\b|\bRSS\b[^.;]{0,20}\d+(\.\d+)?\s?(MiB|MB|GiB|KiB)|\d+(\.\d+)?\s?(MiB|MB|GiB|KiB)\s+RSS\b|[+-]\d+(\.\d+)?\s?%|\d+(\.\d+)?\s?% of (its|the|a|their|one) (CPU|core|time|throughput)`)

// settingsInComments are figures comments may state: settings and limits
// of the code or of the kernel, not measurements.
var settingsInComments = map[string]string{
	"10 Gbit/s": "the link speed buffer sizes are chosen for",
}

// commentFigures lists, for every Go file of the project's own code
// (third_party excluded), the comment lines that state a measured figure.
func commentFigures(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, top := range []string{"cmd", "pkg", "hack", "test"} {
		err := filepath.WalkDir(filepath.Join(repo, top), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			// test/docs holds the checks of figures, with examples.
			if d.IsDir() && (d.Name() == "testdata" || d.Name() == "third_party" || p == filepath.Join(repo, "test", "docs")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(p, ".go") {
				return nil
			}
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, p, src, parser.ParseComments)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(repo, p)
			for _, g := range f.Comments {
				for _, c := range g.List {
					line := fset.Position(c.Pos()).Line
					for i, text := range strings.Split(c.Text, "\n") {
						if hit := measuredIn(text); hit != "" {
							out = append(out, rel+":"+itoa(line+i)+": "+hit+": "+strings.TrimSpace(text))
						}
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// measuredIn returns the first measured figure of a comment line, "" if
// it has none.
func measuredIn(line string) string {
	// "a × b" with spaces is a product, not a ratio.
	line = strings.ReplaceAll(line, " × ", " * ")
	for _, f := range figuresIn(line) {
		if _, ok := settingsInComments[f.text]; ok {
			continue
		}
		if _, ok := notMeasurements[f.text]; ok {
			continue
		}
		// One duration or size alone is mostly a setting (a timeout, a
		// buffer, a workload's file); a range of them is what runs gave.
		if (f.unit == "ms" || f.unit == "MiB") && len(f.nums) == 1 {
			continue
		}
		return f.text
	}
	return measuredWords.FindString(line)
}

// TestNoFiguresInCodeComments: no comment in the project's Go code states
// a measured figure.
func TestNoFiguresInCodeComments(t *testing.T) {
	for _, hit := range commentFigures(t) {
		t.Error(hit)
	}
}

// TestMeasuredIn: what the check catches and what it lets through.
func TestMeasuredIn(t *testing.T) {
	for line, want := range map[string]bool{
		"redis 0.44× against 0.61× the kernel":                        true,
		"memory without bound (measured before this cap: 930 MiB RSS": true,
		"25-60 µs per wake-up":                                        true,
		"streams moved 6.2–8.2 Gbit/s on one thread":                  true,
		"+54 % pod→node":                                              true,
		"(measured: 4 drops in":                                       true,
		"4 MiB holds about 2,700 full-size frames":                    false,
		"a 64 KiB segment from the link":                              false,
		"several milliseconds of traffic at 10 Gbit/s":                false,
		"the clock LogEvery is measured on, for tests":                false,
		"the baseline the other modes are measured against":           false,
		"base + BulkTCP × 4 × TCP buffer":                             false,
	} {
		if got := measuredIn(line) != ""; got != want {
			t.Errorf("measuredIn(%q) = %q, want a figure: %v", line, measuredIn(line), want)
		}
	}
}
