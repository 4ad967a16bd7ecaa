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

// notebookPhrases tell a reference page's reader about the project's
// past instead of what holds: releases before this one (it has made
// none), "until this release", a statement dated "Before (2026-12-02)".
var notebookPhrases = regexp.MustCompile(`(?i)\b(?:until|since|before|as of) this release\b|\bearlier releases?\b|\b(?:before|after|until|since|as of)\s*\(?\s*20\d\d-[01]\d-[0-3]\d\b`)

// proseDate is a date in a page's prose: a run told as a diary entry
// ("measured on the lab on 2026-12-02"). A link to the dated archive
// (its target, or a date as the link's text: a citation) is not prose.
var (
	proseDate     = regexp.MustCompile(`\b20\d\d-[01]\d-[0-3]\d\b`)
	linkTarget    = regexp.MustCompile(`\]\([^)]*\)`)
	datedCitation = regexp.MustCompile(`\[[^\]]*20\d\d-[01]\d-[0-3]\d[^\]]*\]\(`)
)

// referencePages are the pages written in the present tense: the README,
// SECURITY.md, the chart's README and docs/*.md. BENCHMARKS.md (whose
// runs are dated by nature), CHANGELOG.md and the archive under
// docs/benchmarks/ tell history by design.
func referencePages(t *testing.T) []string {
	t.Helper()
	pages := []string{"README.md", "SECURITY.md", "charts/cni-usernet/README.md"}
	m, err := filepath.Glob(filepath.Join(repo, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m {
		rel, _ := filepath.Rel(repo, p)
		pages = append(pages, rel)
	}
	return pages
}

// presentTenseOwed are the reference pages still dated in places, each
// with who rewrites it; the test fails when one of them no longer needs
// its entry, so that the list only shrinks.
var presentTenseOwed = map[string]string{}

// notebookFindings lists the lines of a reference page that read like a
// lab notebook.
func notebookFindings(name, text string) []string {
	var out []string
	for i, line := range proseLines(text) {
		if m := notebookPhrases.FindString(line); m != "" {
			out = append(out, fmtFinding(name, i+1, m, "the project's past: say what holds now; the story belongs in CHANGELOG.md and the archive docs/benchmarks/"))
		}
		prose := linkTarget.ReplaceAllString(datedCitation.ReplaceAllString(line, "]("), "]")
		if d := proseDate.FindString(prose); d != "" {
			out = append(out, fmtFinding(name, i+1, d, "a dated run in a reference page: give the figure BENCHMARKS.md holds and link it (or the archive file), without the diary date"))
		}
	}
	return out
}

// The reference pages are written in the present tense: no "until this
// release", no releases before (there are none), no dated runs in prose.
func TestReferencePagesPresentTense(t *testing.T) {
	for _, p := range referencePages(t) {
		b, err := os.ReadFile(filepath.Join(repo, p))
		if err != nil {
			t.Fatal(err)
		}
		f := notebookFindings(p, string(b))
		if why, owed := presentTenseOwed[p]; owed {
			if len(f) == 0 {
				t.Errorf("%s is in the present tense now: remove it from presentTenseOwed", p)
			} else {
				t.Logf("%s: %d dated or historical lines still owed (%s)", p, len(f), why)
			}
			continue
		}
		for _, e := range f {
			t.Error(e)
		}
	}
}

func TestNotebookPatterns(t *testing.T) {
	for _, s := range []string{
		"Until this release the applications' side was a second netstack",
		"attachments made by earlier releases",
		"Before (2026-12-02) the queue held",
		"Measured on the lab on 2026-12-02: new agents ready",
		"(2026-12-03 07:56 UTC, a quiet 2-vCPU VM)",
	} {
		if len(notebookFindings("docs/x.md", s)) == 0 {
			t.Errorf("no finding in %q", s)
		}
	}
	for _, s := range []string{
		"the stack's CPU per GB in alternated runs ([2026-12-01](benchmarks/2026-12-01-relay-writev-gro.md))",
		"[BENCHMARKS.md](../BENCHMARKS.md#latest-full-run-2026-12-03-2344-utc)",
		"a release's chart names that release's image",
	} {
		if f := notebookFindings("docs/x.md", s); len(f) != 0 {
			t.Errorf("false finding in %q: %v", s, f)
		}
	}
}

// docs/README.md, the index of the documentation, links the dated
// archive once, through its own index (docs/benchmarks/README.md), and
// none of its files: the archive is the record BENCHMARKS.md cites, not
// a page to read.
func TestArchiveOutOfTheIndex(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repo, "docs", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var links []string
	for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
		if strings.HasPrefix(m[1], "benchmarks/") || strings.HasPrefix(m[1], "./benchmarks/") {
			links = append(links, m[1])
		}
	}
	if len(links) != 1 || links[0] != "benchmarks/README.md" {
		t.Errorf("docs/README.md links the archive as %v, want once, benchmarks/README.md", links)
	}
	if _, err := os.Stat(filepath.Join(repo, "docs", "benchmarks", "README.md")); err != nil {
		t.Errorf("the archive has no index: %v", err)
	}
}
