// Package docs checks the documentation against the repository and the
// code: every relative link and anchor resolves, and every conflist key,
// pod annotation, agent flag, environment variable and metric the code
// has is in the reference pages (docs/configuration.md, docs/metrics.md).
// A setting added without its line fails here, with where to add it.
package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cni-usernet/cni-usernet/pkg/agent/metrics"
	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/pkg/api/netconf"
)

// repo is the repository's root, seen from this package's directory.
const repo = "../.."

// markdownFiles are the pages whose links must resolve: the README, the
// benchmark report and everything under docs/.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{filepath.Join(repo, "README.md"), filepath.Join(repo, "BENCHMARKS.md")}
	err := filepath.WalkDir(filepath.Join(repo, "docs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var (
	fence      = regexp.MustCompile("(?ms)^ {0,3}```.*?^ {0,3}```[^\n]*$")
	inlineCode = regexp.MustCompile("`[^`\n]*`")
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading    = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	linkText   = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	scheme     = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// prose is a page without its fenced blocks: what a reader sees as text.
func prose(s string) string { return fence.ReplaceAllString(s, "") }

// slug is GitHub's anchor for a heading: lower case, punctuation dropped
// (letters, marks, digits, '_', '-' and spaces stay), spaces as '-'.
func slug(h string) string {
	h = linkText.ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsNumber(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the ids GitHub gives a page's headings (a repeated heading
// gets -1, -2, …).
func anchors(page string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range strings.Split(prose(page), "\n") {
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(m[2])
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// Every relative link (and its #anchor) in the README, BENCHMARKS.md and
// docs/ points at a file or directory of the repository and a heading of
// that page.
func TestLinksResolve(t *testing.T) {
	pages := map[string]string{}
	read := func(p string) (string, error) {
		if s, ok := pages[p]; ok {
			return s, nil
		}
		b, err := os.ReadFile(p)
		pages[p] = string(b)
		return string(b), err
	}
	links := 0
	for _, f := range markdownFiles(t) {
		page, err := read(f)
		if err != nil {
			t.Fatal(err)
		}
		text := inlineCode.ReplaceAllString(prose(page), "")
		name, _ := filepath.Rel(repo, f)
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if scheme.MatchString(target) {
				continue
			}
			links++
			path, frag, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %q: %s does not exist", name, target, filepath.Clean(path))
					continue
				}
			}
			if frag == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			d, err := read(dest)
			if err != nil {
				t.Errorf("%s: link %q: %v", name, target, err)
				continue
			}
			if !anchors(d)[frag] {
				t.Errorf("%s: link %q: no heading with anchor #%s in %s", name, target, frag, filepath.Clean(dest))
			}
		}
	}
	if links < 100 {
		t.Fatalf("found %d relative links, want the docs' (≥ 100): is the link pattern broken?", links)
	}
}

func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Choosing a pod's GSO mode":                           "choosing-a-pods-gso-mode",
		"Full run of 2026-12-01 21:52 UTC: `make bench`":      "full-run-of-2026-12-01-2152-utc-make-bench",
		"The applications' side: the pod's own kernel":        "the-applications-side-the-pods-own-kernel",
		"Latest full run: 2026-12-02 01:11 UTC, tree a86a546": "latest-full-run-2026-12-02-0111-utc-tree-a86a546",
		"Where the time goes ([link](x.md))":                  "where-the-time-goes-link",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
	got := anchors("# A\n```\n# not a heading\n```\n## A\n")
	if !got["a"] || !got["a-1"] || got["not-a-heading"] {
		t.Errorf("anchors: got %v, want a and a-1 only", got)
	}
}

// The blocks test/e2e runs from the README are there, one fenced block
// each: the README's install and uninstall commands are the tested ones.
func TestREADMEInstallBlocks(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, m := range []string{"e2e-install", "e2e-install-chain", "e2e-uninstall"} {
		open, end := "<!-- "+m+" -->", "<!-- /"+m+" -->"
		i, j := strings.Index(s, open), strings.Index(s, end)
		if i < 0 || j < i {
			t.Errorf("README.md has no %s ... %s section (test/e2e runs it)", open, end)
			continue
		}
		if n := strings.Count(s[i:j], "```"); n != 2 {
			t.Errorf("README.md section %s has %d fences, want one fenced block", m, n)
		}
	}
	if n := len(strings.Split(s, "\n")); n > 200 {
		t.Errorf("README.md has %d lines: it is the ten-minute page (about 150); move detail to docs/", n)
	}
}

// referenceRows returns, per "## " section of a reference page, the row of
// each name a table row's first cell gives in backticks (its cells).
func referenceRows(t *testing.T, page string) map[string]map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, page))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]string{}
	section := ""
	code := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(prose(string(b)), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			section = strings.TrimSpace(h)
			out[section] = map[string][]string{}
			continue
		}
		if !strings.HasPrefix(line, "|") || section == "" {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		for _, m := range code.FindAllStringSubmatch(cells[0], -1) {
			out[section][m[1]] = cells
		}
	}
	return out
}

// goFiles parses the non-test Go files under dir (recursively).
func goFiles(t *testing.T, dir string) map[string][]*ast.File {
	t.Helper()
	fset := token.NewFileSet()
	pkgs := map[string][]*ast.File{}
	err := filepath.WalkDir(filepath.Join(repo, dir), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkgs[filepath.Dir(p)] = append(pkgs[filepath.Dir(p)], f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// stringConsts evaluates a package's string constants: literals, other
// constants of the package and their concatenations.
func stringConsts(files []*ast.File) map[string]string {
	exprs := map[string]ast.Expr{}
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						exprs[n.Name] = vs.Values[i]
					}
				}
			}
		}
	}
	out := map[string]string{}
	var eval func(e ast.Expr, depth int) (string, bool)
	eval = func(e ast.Expr, depth int) (string, bool) {
		if depth > 10 {
			return "", false
		}
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind == token.STRING {
				s, err := strconv.Unquote(e.Value)
				return s, err == nil
			}
		case *ast.Ident:
			if x, ok := exprs[e.Name]; ok {
				return eval(x, depth+1)
			}
		case *ast.BinaryExpr:
			if e.Op == token.ADD {
				a, ok1 := eval(e.X, depth+1)
				b, ok2 := eval(e.Y, depth+1)
				return a + b, ok1 && ok2
			}
		case *ast.ParenExpr:
			return eval(e.X, depth+1)
		}
		return "", false
	}
	for n, e := range exprs {
		if s, ok := eval(e, 0); ok {
			out[n] = s
		}
	}
	return out
}

// stringValue is e's value when it is a string literal or one of consts.
func stringValue(e ast.Expr, consts map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		}
	case *ast.Ident:
		s, ok := consts[e.Name]
		return s, ok
	}
	return "", false
}

// conflistKeys are the JSON keys of netconf.NetConf's own fields (the
// CNI spec's common keys, from the embedded PluginConf, are allowed but
// not required), nested ones as parent.child.
func conflistKeys() (required, allowed []string) {
	var walk func(t reflect.Type, prefix string, embedded bool)
	walk = func(t reflect.Type, prefix string, embedded bool) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if f.Anonymous {
				walk(f.Type, prefix, true)
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "" || name == "-" {
				continue
			}
			allowed = append(allowed, prefix+name)
			if !embedded {
				required = append(required, prefix+name)
			}
			if f.Type.Kind() == reflect.Struct && !embedded {
				walk(f.Type, prefix+name+".", false)
			}
		}
	}
	walk(reflect.TypeOf(netconf.NetConf{}), "", false)
	return required, allowed
}

// flagDefiners are the flag.FlagSet methods that define a flag; those
// ending in Var (and Var itself) take the variable first.
var flagDefiners = []string{
	"Bool", "BoolVar", "BoolFunc", "Duration", "DurationVar", "Float64", "Float64Var", "Func",
	"Int", "IntVar", "Int64", "Int64Var", "String", "StringVar", "TextVar", "Uint", "UintVar",
	"Uint64", "Uint64Var", "Var",
}

type agentFlag struct {
	name string
	// def is the default as the reference writes it, "" when the code
	// computes it (e.g. from the environment).
	def string
	pos string
}

// agentFlags reads the node agent's flags from pkg/agent's source:
// every flag defined on a FlagSet made by flag.NewFlagSet (or on the
// flag package's own set).
func agentFlags(t *testing.T) []agentFlag {
	t.Helper()
	consts := map[string]string{}
	for _, pkg := range []string{"pkg/agent", "pkg/api/netconf"} {
		for dir, files := range goFiles(t, pkg) {
			if dir != filepath.Join(repo, pkg) {
				continue
			}
			for n, v := range stringConsts(files) {
				consts[n] = v
				consts[filepath.Base(pkg)+"."+n] = v
			}
		}
	}
	var out []agentFlag
	fset := token.NewFileSet()
	matches, _ := filepath.Glob(filepath.Join(repo, "pkg/agent/*.go"))
	for _, p := range matches {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		sets := map[string]bool{"flag": true}
		ast.Inspect(f, func(n ast.Node) bool {
			if a, ok := n.(*ast.AssignStmt); ok && len(a.Lhs) == 1 && len(a.Rhs) == 1 {
				if c, ok := a.Rhs[0].(*ast.CallExpr); ok {
					if s, ok := c.Fun.(*ast.SelectorExpr); ok && s.Sel.Name == "NewFlagSet" {
						if id, ok := a.Lhs[0].(*ast.Ident); ok {
							sets[id.Name] = true
						}
					}
				}
			}
			c, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			s, ok := c.Fun.(*ast.SelectorExpr)
			if !ok || !slices.Contains(flagDefiners, s.Sel.Name) {
				return true
			}
			recv, ok := s.X.(*ast.Ident)
			if !ok || !sets[recv.Name] {
				return true
			}
			i := 0
			if strings.HasSuffix(s.Sel.Name, "Var") {
				i = 1
			}
			pos := strings.TrimPrefix(fset.Position(c.Pos()).String(), repo+"/")
			if len(c.Args) <= i {
				t.Errorf("%s: flag definition without a name", pos)
				return true
			}
			name, ok := stringValue(c.Args[i], consts)
			if !ok {
				t.Errorf("%s: flag name is not a constant string; the reference cannot be checked", pos)
				return true
			}
			fl := agentFlag{name: name, pos: pos}
			if strings.HasSuffix(s.Sel.Name, "Func") || s.Sel.Name == "Var" || s.Sel.Name == "TextVar" || len(c.Args) <= i+1 {
				out = append(out, fl)
				return true
			}
			fl.def = defaultText(c.Args[i+1], consts)
			out = append(out, fl)
			return true
		})
	}
	return out
}

// defaultText is a flag default as the reference writes it (30s, :9437,
// true), or "" when it is not a constant.
func defaultText(e ast.Expr, consts map[string]string) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			s, _ := strconv.Unquote(e.Value)
			return s
		}
		return e.Value
	case *ast.Ident:
		if e.Name == "true" || e.Name == "false" {
			return e.Name
		}
		return consts[e.Name]
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			if x.Name == "time" {
				return durationUnit(e.Sel.Name, "1")
			}
			return consts[x.Name+"."+e.Sel.Name]
		}
	case *ast.BinaryExpr:
		n, ok1 := e.X.(*ast.BasicLit)
		u, ok2 := e.Y.(*ast.SelectorExpr)
		if ok1 && ok2 && e.Op == token.MUL {
			return durationUnit(u.Sel.Name, n.Value)
		}
	}
	return ""
}

func durationUnit(unit, n string) string {
	switch unit {
	case "Second":
		return n + "s"
	case "Minute":
		return n + "m"
	case "Millisecond":
		return n + "ms"
	case "Hour":
		return n + "h"
	}
	return ""
}

// envVars are the environment variables the plugin, the stack and the
// agent read: the names passed to os.Getenv / os.LookupEnv (or a getenv
// function value) and every CNI_USERNET_* string in pkg/ and cmd/.
func envVars(t *testing.T) map[string]string {
	t.Helper()
	own := regexp.MustCompile(`^CNI_USERNET_[A-Z0-9_]+$`)
	out := map[string]string{}
	for _, dir := range []string{"pkg", "cmd"} {
		for pkgDir, files := range goFiles(t, dir) {
			consts := stringConsts(files)
			for _, f := range files {
				ast.Inspect(f, func(n ast.Node) bool {
					switch n := n.(type) {
					case *ast.BasicLit:
						if s, err := strconv.Unquote(n.Value); n.Kind == token.STRING && err == nil && own.MatchString(s) {
							out[s] = pkgDir
						}
					case *ast.CallExpr:
						var fn string
						switch f := n.Fun.(type) {
						case *ast.SelectorExpr:
							fn = f.Sel.Name
						case *ast.Ident:
							fn = f.Name
						}
						if len(n.Args) != 1 || !slices.Contains([]string{"Getenv", "LookupEnv", "getenv", "lookupEnv"}, fn) {
							return true
						}
						if s, ok := stringValue(n.Args[0], consts); ok {
							out[s] = pkgDir
						}
					}
					return true
				})
			}
		}
	}
	return out
}

// annotations are the pod annotations the code reads: every string
// constant or literal in pkg/ and cmd/ under netconf.AnnotationPrefix but
// the ClusterNetworkPolicies' status condition, whose type shares the
// domain (policy.md documents it).
func annotations(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	add := func(s, where string) {
		if s == netpolicy.ImplementedCondition {
			return
		}
		if strings.HasPrefix(s, netconf.AnnotationPrefix) && len(s) > len(netconf.AnnotationPrefix) && !strings.ContainsAny(s, " *") {
			out[s] = where
		}
	}
	for _, dir := range []string{"pkg", "cmd"} {
		for pkgDir, files := range goFiles(t, dir) {
			pkgDir = strings.TrimPrefix(pkgDir, repo+"/")
			for _, v := range stringConsts(files) {
				add(v, pkgDir)
			}
			for _, f := range files {
				ast.Inspect(f, func(n ast.Node) bool {
					if l, ok := n.(*ast.BasicLit); ok && l.Kind == token.STRING {
						if s, err := strconv.Unquote(l.Value); err == nil {
							add(s, pkgDir)
						}
					}
					return true
				})
			}
		}
	}
	return out
}

// Every conflist key, annotation, agent flag and environment variable the
// code has is a row of docs/configuration.md, in its section, and the
// flags' defaults there are the code's.
func TestConfigurationReference(t *testing.T) {
	const page = "docs/configuration.md"
	rows := referenceRows(t, page)
	section := func(name string) map[string][]string {
		s, ok := rows[name]
		if !ok {
			t.Fatalf("%s has no section %q", page, name)
		}
		return s
	}
	t.Run("ConflistKeys", func(t *testing.T) {
		sec := section("Conflist keys")
		required, allowed := conflistKeys()
		if len(required) < 20 {
			t.Fatalf("found %d conflist keys in netconf.NetConf, want ≥ 20", len(required))
		}
		for _, k := range required {
			if _, ok := sec[k]; !ok {
				t.Errorf("conflist key %q (pkg/api/netconf NetConf) has no row in %s: add \"| `%s` | default | meaning |\" to the table under \"## Conflist keys\"", k, page, k)
			}
		}
		for k := range sec {
			if !slices.Contains(allowed, k) && !strings.HasPrefix(k, "runtimeConfig.") {
				t.Errorf("%s documents conflist key %q, which pkg/api/netconf NetConf does not have: remove or rename its row", page, k)
			}
		}
	})
	t.Run("Annotations", func(t *testing.T) {
		sec := section("Pod annotations")
		found := annotations(t)
		if _, ok := found[netconf.AnnotationGSO]; !ok {
			t.Fatalf("the scan of pkg/ did not find %s: is it broken?", netconf.AnnotationGSO)
		}
		for a, where := range found {
			if _, ok := sec[a]; !ok {
				t.Errorf("pod annotation %q (%s) has no row in %s: add \"| `%s` | default | values |\" under \"## Pod annotations\"", a, where, page, a)
			}
		}
		for a := range sec {
			if _, ok := found[a]; !ok {
				t.Errorf("%s documents annotation %q, which no code in pkg/ or cmd/ reads: remove or rename its row", page, a)
			}
		}
	})
	t.Run("AgentFlags", func(t *testing.T) {
		sec := section("Node agent flags")
		flags := agentFlags(t)
		if len(flags) < 20 {
			t.Fatalf("found %d flags in pkg/agent, want ≥ 20: is the scan broken?", len(flags))
		}
		names := map[string]bool{}
		for _, f := range flags {
			names["--"+f.name] = true
			cells, ok := sec["--"+f.name]
			if !ok {
				t.Errorf("agent flag --%s (%s) has no row in %s: add \"| `--%s` | default | meaning |\" under \"## Node agent flags\"", f.name, f.pos, page, f.name)
				continue
			}
			if f.def != "" && (len(cells) < 2 || !strings.Contains(cells[1], f.def)) {
				t.Errorf("%s: --%s's default is %q in the code (%s), the row says %q", page, f.name, f.def, f.pos, cells[1])
			}
		}
		for k := range sec {
			if !names[k] {
				t.Errorf("%s documents agent flag %q, which pkg/agent does not define: remove or rename its row", page, k)
			}
		}
	})
	t.Run("EnvironmentVariables", func(t *testing.T) {
		sec := section("Environment variables")
		vars := envVars(t)
		for _, want := range []string{"CNI_USERNET_SANDBOX", "NODE_NAME"} {
			if _, ok := vars[want]; !ok {
				t.Fatalf("the scan of pkg/ and cmd/ did not find %s: is it broken?", want)
			}
		}
		for v, where := range vars {
			if _, ok := sec[v]; !ok {
				rel, _ := filepath.Rel(repo, where)
				t.Errorf("environment variable %s (read in %s) has no row in %s: add \"| `%s` | default | read by | meaning |\" under \"## Environment variables\"", v, rel, page, v)
			}
		}
	})
}

// exportedMetrics are the metric names the agent exports: what its
// collector describes, every podDesc/nodeDesc name in pkg/agent/metrics, and
// every full cni_usernet_* name written in pkg/ (another collector's).
func exportedMetrics(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	ch := make(chan *prometheus.Desc)
	go func() {
		metrics.New(metrics.Options{}).Describe(ch)
		close(ch)
	}()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			out[m[1]] = "pkg/agent/metrics Collector.Describe"
		}
	}
	full := regexp.MustCompile(`^cni_usernet_[a-z0-9_]*[a-z0-9]$`)
	prefix := map[string]string{"podDesc": "cni_usernet_pod_", "nodeDesc": "cni_usernet_"}
	for pkgDir, files := range goFiles(t, "pkg") {
		rel, _ := filepath.Rel(repo, pkgDir)
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CallExpr:
					id, ok := n.Fun.(*ast.Ident)
					if !ok || prefix[id.Name] == "" || len(n.Args) == 0 {
						return true
					}
					if s, ok := stringValue(n.Args[0], nil); ok {
						out[prefix[id.Name]+s] = rel
					}
				case *ast.BasicLit:
					if s, err := strconv.Unquote(n.Value); n.Kind == token.STRING && err == nil && full.MatchString(s) {
						out[s] = rel
					}
				}
				return true
			})
		}
	}
	return out
}

// documentedMetrics are the names in docs/metrics.md's tables, with the
// short forms (`_udp_flows_total` beside `cni_usernet_pod_udp_flows`)
// spelled out and label sets ({leg,direction}) dropped.
func documentedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, sec := range referenceRows(t, "docs/metrics.md") {
		byRow := map[string][]string{}
		for name, cells := range sec {
			byRow[cells[0]] = append(byRow[cells[0]], name)
		}
		for first := range byRow {
			base := "cni_usernet"
			if strings.Contains(first, "`cni_usernet_pod_") {
				base = "cni_usernet_pod"
			}
			for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(first, -1) {
				n, _, _ := strings.Cut(m[1], "{")
				if strings.HasPrefix(n, "_") {
					n = base + n
				}
				out[n] = true
			}
		}
	}
	return out
}

// Every metric the agent exports has a row in docs/metrics.md, and every
// row names a metric that exists.
func TestMetricsDocumented(t *testing.T) {
	exported := exportedMetrics(t)
	if len(exported) < 30 {
		t.Fatalf("found %d metrics, want the agent's (≥ 30): is the scan broken?", len(exported))
	}
	documented := documentedMetrics(t)
	for n, where := range exported {
		if !documented[n] {
			table := "\"## Node series\""
			if strings.HasPrefix(n, "cni_usernet_pod_") {
				table = "\"## Pod series\""
			}
			t.Errorf("metric %s (%s) has no row in docs/metrics.md: add \"| `%s` | type | what |\" to the table under %s", n, where, n, table)
		}
	}
	for n := range documented {
		if strings.HasPrefix(n, "cni_usernet") && exported[n] == "" {
			t.Errorf("docs/metrics.md documents %s, which the agent does not export: remove or rename its row", n)
		}
	}
}

// The repository speaks of dates and commits, not of how its authors
// organised their working days: no numbered working periods ("S 12",
// "S12-full", "this S", "S 9's tree", S being the word built below) in
// docs, code, tables or file names. Another sense (a capture's S, a
// process S) stays. The word is assembled here so that a grep of the tree
// for it finds only real uses.
func TestNoWorkingPeriods(t *testing.T) {
	w := "ses" + "sion"
	period := regexp.MustCompile(`(?i)\b` + w + `s?[ -]?\d+|\b(this|previous|next|last|that) ` + w + `\b|\b` + w + `'s (tree|build|run|start|time|changes?)\b`)
	exts := []string{".go", ".md", ".sh", ".py", ".yaml", ".yml", ".json", ".conflist", ".tpl", ".txt"}
	for _, dir := range []string{"README.md", "BENCHMARKS.md", "Makefile", "docs", "pkg", "cmd", "hack", "test", "manifests", "charts", ".ci"} {
		err := filepath.WalkDir(filepath.Join(repo, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(repo, p)
			if period.MatchString(d.Name()) {
				t.Errorf("%s: a file name that cites a working period; name it by date and subject", rel)
			}
			if d.IsDir() {
				return nil
			}
			if !slices.Contains(exts, filepath.Ext(p)) && d.Name() != "Makefile" && filepath.Dir(rel) != ".ci" {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(b), "\n") {
				if m := period.FindString(line); m != "" {
					t.Errorf("%s:%d: %q: cite the date and/or commit it refers to", rel, i+1, m)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
