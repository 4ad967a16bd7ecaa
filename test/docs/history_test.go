package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// pagesOutsideArchive are the pages that describe the product as it is:
// the README, BENCHMARKS.md and docs/, without the dated archive under
// docs/benchmarks/ (each file there is a record of its day, and may tell
// what changed) and without CHANGELOG.md (history is its subject).
func pagesOutsideArchive(t *testing.T) []string {
	t.Helper()
	var out []string
	archive := filepath.Join(repo, "docs", "benchmarks") + string(filepath.Separator)
	for _, f := range markdownFiles(t) {
		if !strings.HasPrefix(f, archive) {
			out = append(out, f)
		}
	}
	return out
}

// historyPhrases are ways of telling the work instead of the product: an
// issue or pull request number, a fix seen from before or after, "this
// time".
var historyPhrases = regexp.MustCompile(`(?i)\b(?:issues?|pr|pull requests?) #\d+|\b(?:before|after|since|until) (?:the |its )?(?:[\w-]+ )?fix(?:es)?\b|\bthis time\b|\b(?:since|until|before|after|as of) (?:commit )?[0-9a-f]{7,40}\b`)

// commitHash is an abbreviated or full commit name: 7 to 40 hex digits,
// at least one a–f letter and one digit (so neither a number nor an
// English word).
var commitHash = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)

func isCommitHash(s string) bool {
	return strings.ContainsAny(s, "abcdef") && strings.ContainsAny(s, "0123456789")
}

// revisionLine is where BENCHMARKS.md may name commits: the revision a
// run measured is data. Its run headers' "- **Revision**:" field, and the
// rows of its run tables (a header row whose first cell is "run (UTC)").
func revisionAllowed(page string) func(line string, inRunTable bool) bool {
	if filepath.Base(page) != "BENCHMARKS.md" {
		return func(string, bool) bool { return false }
	}
	return func(line string, inRunTable bool) bool {
		return strings.HasPrefix(line, "- **Revision**:") || inRunTable
	}
}

// historyFindings lists the lines of page (its text, fences dropped) that
// tell history rather than describe the product.
func historyFindings(name, text string) []string {
	allowed := revisionAllowed(name)
	var out []string
	inRunTable := false
	for i, line := range proseLines(text) {
		switch {
		case strings.HasPrefix(line, "| run (UTC) |"):
			inRunTable = true
		case !strings.HasPrefix(line, "|"):
			inRunTable = false
		}
		if m := historyPhrases.FindString(line); m != "" {
			out = append(out, fmtFinding(name, i+1, m, "tells the work, not the product: say what holds (a guarantee, a target) and leave the story to CHANGELOG.md and the commit log"))
		}
		if allowed(line, inRunTable) {
			continue
		}
		for _, h := range commitHash.FindAllString(line, -1) {
			if isCommitHash(h) {
				out = append(out, fmtFinding(name, i+1, h, "a commit hash as history: describe the behaviour; a benchmark's revision belongs in BENCHMARKS.md's Revision field or run tables"))
			}
		}
	}
	return out
}

func fmtFinding(name string, line int, what, why string) string {
	return name + ":" + itoa(line) + ": " + quote(what) + ": " + why
}

// The pages describe the product, not the work that made it: no issue
// numbers, no "before the fix", no commit hashes as history, outside
// CHANGELOG.md and the dated archive in docs/benchmarks/.
func TestNoHistoryInDocs(t *testing.T) {
	pages := pagesOutsideArchive(t)
	if len(pages) < 15 {
		t.Fatalf("found %d pages, want the README, BENCHMARKS.md and docs/ (≥ 15)", len(pages))
	}
	for _, f := range pages {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(repo, f)
		for _, e := range historyFindings(name, string(b)) {
			t.Error(e)
		}
	}
}

// The patterns catch what they are for and leave the rest.
func TestHistoryPatterns(t *testing.T) {
	for _, s := range []string{
		"# Releases side by side (issue #29)",
		"That read is gone since 802ee11: `recvmsg`",
		"| before the fixes | 40,000/s |",
		"an earlier run, before the DEL fix and ADD's retry",
		"(the peers' TCP_RR included this time).",
		"the tree before the fragment socket (2ec5bdb) and",
	} {
		if len(historyFindings("docs/x.md", s)) == 0 {
			t.Errorf("no finding in %q", s)
		}
	}
	for _, s := range []string{
		"gVisor has no delayed ACK (its issue 387)",
		"`CapEff` `0000000000002400`",
		"a capture's `deadbeef` is not a hash, nor 20261202",
		"```\ncontainer_id=\"e2af20b2…\"\n```",
	} {
		if f := historyFindings("docs/x.md", s); len(f) != 0 {
			t.Errorf("false finding in %q: %v", s, f)
		}
	}
	bench := "| run (UTC) | revision | what |\n|---|---|---|\n| 2026-12-02 18:20 | 8067f6a | x |\n\n- **Revision**: 8067f6a\n"
	if f := historyFindings("BENCHMARKS.md", bench); len(f) != 0 {
		t.Errorf("BENCHMARKS.md's revision fields flagged: %v", f)
	}
	if f := historyFindings("BENCHMARKS.md", "Against the run of 8067f6a, faster."); len(f) == 0 {
		t.Errorf("a hash in BENCHMARKS.md's prose not flagged")
	}
}
