package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompatibilityMatrixIsTheRecords: docs/compatibility.md's matrix is
// what the committed hack/k8s/runs.tsv, the lab's own records, gives
// (hack/k8s/compat.sh renders it), and holds at least one passing run: a
// setup claimed in the docs is one a command ran. The committed records,
// not the work tree's: every `make e2e` appends to those.
func TestCompatibilityMatrixIsTheRecords(t *testing.T) {
	records, err := exec.Command("git", "-C", repo, "show", "HEAD:hack/k8s/runs.tsv").Output()
	if err != nil {
		t.Fatalf("the lab's committed records (git show HEAD:hack/k8s/runs.tsv): %v", err)
	}
	runs := filepath.Join(t.TempDir(), "runs.tsv")
	if err := os.WriteFile(runs, records, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("hack/k8s/compat.sh", "check")
	cmd.Env = append(os.Environ(), "COMPAT_RUNS="+runs)
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/k8s/compat.sh check: %v\n%s", err, out)
	}
	page, err := os.ReadFile(filepath.Join(repo, "docs/compatibility.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(page)
	i, j := strings.Index(s, "<!-- matrix -->"), strings.Index(s, "<!-- /matrix -->")
	if i < 0 || j < i || !strings.Contains(s[i:j], " | pass (") {
		t.Error("docs/compatibility.md's matrix holds no passing run")
	}
}
