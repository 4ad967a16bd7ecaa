package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestTroubleshootingCheckedOnTheLab: every symptom of
// docs/troubleshooting.md has a row in its "Checked on the lab" table, and
// every check a row names exists in test/e2e (the top-level test and the
// subtest), so the page cannot promise a check that is gone.
func TestTroubleshootingCheckedOnTheLab(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repo, "docs", "troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	var symptoms []string
	for _, m := range regexp.MustCompile(`(?m)^## (.+)$`).FindAllStringSubmatch(page, -1) {
		if m[1] != "Where to look" && m[1] != "Checked on the lab" {
			symptoms = append(symptoms, slug(m[1]))
		}
	}
	i := strings.Index(page, "## Checked on the lab")
	if i < 0 {
		t.Fatal(`docs/troubleshooting.md has no "## Checked on the lab" section`)
	}
	table := page[i:]
	rowLink := regexp.MustCompile(`(?m)^\| \[[^\]]+\]\(#([^)]+)\) \| (.+?) \|`)
	rows := map[string]string{}
	for _, m := range rowLink.FindAllStringSubmatch(table, -1) {
		rows[m[1]] = m[2]
	}
	var e2e strings.Builder
	files, _ := filepath.Glob(filepath.Join(repo, "test", "e2e", "*.go"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		e2e.Write(b)
	}
	src := e2e.String()
	for _, s := range symptoms {
		checks, ok := rows[s]
		if !ok {
			t.Errorf("symptom #%s has no row in \"Checked on the lab\": name the test/e2e check that makes it happen", s)
			continue
		}
		for _, m := range regexp.MustCompile("`(Test[A-Za-z]+)/([A-Za-z]+)`").FindAllStringSubmatch(checks, -1) {
			if !strings.Contains(src, "func "+m[1]+"(t *testing.T)") {
				t.Errorf("row #%s names %s, which test/e2e does not define", s, m[1])
			}
			// A subtest's name is a string literal of test/e2e: passed to
			// check, step or t.Run, or held in a variable first.
			if !strings.Contains(src, `"`+m[2]+`"`) {
				t.Errorf("row #%s names the subtest %s/%s, which test/e2e does not run", s, m[1], m[2])
			}
		}
	}
}
