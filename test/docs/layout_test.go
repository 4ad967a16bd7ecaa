package docs

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The layout's limits: a file a reader can hold, a type with one job, a
// package that is more than a name unless it says why.
const (
	maxFileLines    = 600
	maxMethods      = 25
	minPackageLines = 150
)

// processOf is the process column a package's group must show in
// docs/architecture.md's layout table.
var processOf = map[string]string{
	"pkg/cni": "plugin", "pkg/cli": "commands", "pkg/agent": "agent", "pkg/stack": "stack",
	"pkg/api": "contract", "pkg/node": "node", "pkg/util": "any",
}

// pkgDirs are the directories under pkg/ that hold a package (a non-test
// .go file), relative to the repository, with the package's lines
// (non-test files) and its parsed files.
func pkgDirs(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	err := filepath.WalkDir(filepath.Join(repo, "pkg"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		rel, _ := filepath.Rel(repo, filepath.Dir(p))
		out[rel] += countLines(t, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func countLines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// layoutRows reads docs/architecture.md's layout table: package → process.
func layoutRows(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(repo, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `(pkg/[^`]+)` \\| ([a-z]+) \\| .+ \\|$")
	rows := map[string]string{}
	in := false
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Layout"
			continue
		}
		if m := row.FindStringSubmatch(line); in && m != nil {
			if _, dup := rows[m[1]]; dup {
				t.Errorf("docs/architecture.md lists %s twice", m[1])
			}
			rows[m[1]] = m[2]
		}
	}
	if len(rows) < 10 {
		t.Fatalf("found %d rows in docs/architecture.md's Layout table, want the whole tree: is the table's format changed?", len(rows))
	}
	return rows
}

// TestLayoutTableMatchesTree: docs/architecture.md's layout table lists
// every package under pkg/, only those, each with the process its path
// says it runs in.
func TestLayoutTableMatchesTree(t *testing.T) {
	rows := layoutRows(t)
	dirs := pkgDirs(t)
	for dir := range dirs {
		if _, ok := rows[dir]; !ok {
			t.Errorf("%s is not in docs/architecture.md's Layout table: add \"| `%s` | process | job |\"", dir, dir)
		}
	}
	for pkg, process := range rows {
		if _, ok := dirs[pkg]; !ok {
			t.Errorf("docs/architecture.md's Layout table lists %s, which the tree does not have", pkg)
		}
		group := strings.Join(strings.SplitN(pkg, "/", 3)[:2], "/")
		if want, ok := processOf[group]; !ok {
			t.Errorf("%s is in no group (pkg/cni, pkg/agent, pkg/stack, pkg/api, pkg/node, pkg/cli, pkg/util)", pkg)
		} else if process != want {
			t.Errorf("docs/architecture.md gives %s the process %q; its path says %q", pkg, process, want)
		}
	}
}

// TestLayoutLimits: no file in pkg/ over maxFileLines, no type with more
// than maxMethods methods, and a package under minPackageLines says in
// its doc comment why it is a package of its own.
func TestLayoutLimits(t *testing.T) {
	for dir, lines := range pkgDirs(t) {
		fset := token.NewFileSet()
		methods := map[string]int{}
		var doc string
		entries, err := os.ReadDir(filepath.Join(repo, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			p := filepath.Join(repo, dir, name)
			if n := countLines(t, p); n > maxFileLines {
				t.Errorf("%s/%s: %d lines, want <= %d: split it by job", dir, name, n, maxFileLines)
			}
			f, err := parser.ParseFile(fset, p, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			if f.Doc != nil {
				doc += f.Doc.Text()
			}
			for _, d := range f.Decls {
				if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv != nil && len(fn.Recv.List) == 1 {
					methods[receiverType(fn.Recv.List[0].Type)]++
				}
			}
		}
		var big []string
		for typ, n := range methods {
			if n > maxMethods {
				big = append(big, typ)
			}
		}
		sort.Strings(big)
		for _, typ := range big {
			t.Errorf("%s: type %s has %d methods, want <= %d: split it by job", dir, typ, methods[typ], maxMethods)
		}
		if lines < minPackageLines && !strings.Contains(strings.Join(strings.Fields(doc), " "), "package of its own") {
			t.Errorf("%s: %d lines; a package under %d lines says in its doc comment why it is a package of its own (or joins its only user)", dir, lines, minPackageLines)
		}
	}
}

func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return "?"
		}
	}
}

// history matches what a code comment must not cite: issue numbers,
// commit hashes, dates and the dated benchmark files. The docs keep the
// measurements (BENCHMARKS.md and its archive), the git log the story.
var history = regexp.MustCompile(`(?i)\bissue #?\d+|(^|[\s(])#\d{1,4}\b|\b20\d\d-[01]\d-[0-3]\d\b|docs/benchmarks/20\d\d-|\bbefore the fix\b|\b(since|up to|until|as of|in|from|at) [0-9a-f]{7,12}\b|\b[0-9a-f]{7,12}('s)?\b`)

// TestCommentsSpeakOfTheCode: no .go file's comments cite issue numbers,
// commit hashes, dates or dated benchmark files.
func TestCommentsSpeakOfTheCode(t *testing.T) {
	hexWord := regexp.MustCompile(`^[0-9a-f]{7,12}('s)?$`)
	for _, dir := range []string{"cmd", "pkg", "test", "hack"} {
		err := filepath.WalkDir(filepath.Join(repo, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, p, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(repo, p)
			if filepath.Dir(rel) == "test/docs" {
				return nil // the checks themselves name what they look for
			}
			for _, cg := range f.Comments {
				for _, c := range cg.List {
					for i, line := range strings.Split(c.Text, "\n") {
						for _, m := range history.FindAllString(line, -1) {
							m = strings.TrimSpace(m)
							// A bare hex word is a hash only if it has a digit and a letter
							// (not "deadbeef" in prose, not "1234567").
							if hexWord.MatchString(m) && !(strings.ContainsAny(m, "0123456789") && strings.ContainsAny(m, "abcdef")) {
								continue
							}
							t.Errorf("%s:%d: comment cites %q: say what the code does and why; the docs keep figures, the git log history",
								rel, fset.Position(c.Pos()).Line+i, m)
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
}
