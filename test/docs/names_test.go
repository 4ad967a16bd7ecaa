package docs

import (
	"go/ast"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// eventReasons are the Event reasons the plugin and the agent post: the
// reason argument of the plugin's event(typ, reason, msg) and the Reason
// of every kube.Event literal in pkg/.
func eventReasons(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for dir, files := range goFiles(t, "pkg") {
		rel, _ := filepath.Rel(repo, dir)
		consts := stringConsts(files)
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CallExpr:
					var name string
					switch fn := n.Fun.(type) {
					case *ast.SelectorExpr:
						name = fn.Sel.Name
					case *ast.Ident:
						name = fn.Name
					}
					if name == "event" && len(n.Args) == 3 {
						if s, ok := stringValue(n.Args[1], consts); ok {
							out[s] = rel
						}
					}
				case *ast.CompositeLit:
					sel, ok := n.Type.(*ast.SelectorExpr)
					if !ok || sel.Sel.Name != "Event" {
						return true
					}
					for _, e := range n.Elts {
						kv, ok := e.(*ast.KeyValueExpr)
						if k, _ := kv.Key.(*ast.Ident); ok && k != nil && k.Name == "Reason" {
							if s, ok := stringValue(kv.Value, consts); ok {
								out[s] = rel
							}
						}
					}
				}
				return true
			})
		}
	}
	return out
}

// kubernetesReasons are Event reasons of Kubernetes itself (kubelet) that
// the pages may name: they are not cni-usernet's.
var kubernetesReasons = []string{"FailedCreatePodSandBox", "FailedKillPod", "SandboxChanged", "NetworkNotReady", "Unhealthy", "BackOff", "Killing", "FailedMount", "Scheduled"}

var (
	// "an Event `X`", "reason X", "`X` Event", "Warning Event `X`", and
	// kubectl's "Warning  X  3s" lines.
	reasonAfter  = regexp.MustCompile("\\b(?:[Ee]vents?|[Rr]easons?)(?: \\x60| )([A-Z][A-Za-z0-9]+)\\b")
	reasonBefore = regexp.MustCompile("\\x60([A-Z][A-Za-z0-9]+)\\x60 (?:(?:Warning|Normal) )?[Ee]vents?\\b")
	reasonKubect = regexp.MustCompile(`(?m)^\s*(?:Normal|Warning)\s+([A-Z][A-Za-z0-9]+)\s`)
	reasonTable  = regexp.MustCompile("^\\| \\x60([A-Z][A-Za-z0-9]+)\\x60 \\|")
)

// camel is a reason-shaped word: two capitals or more and a lower-case
// letter (GSOMode, StackNotRestarted; not Event, not GSO).
func camel(s string) bool {
	upper, lower := 0, 0
	for _, r := range s {
		switch {
		case unicode.IsUpper(r):
			upper++
		case unicode.IsLower(r):
			lower++
		}
	}
	return upper >= 2 && lower >= 1
}

// namedReasons are the Event reasons a page names, with their lines.
func namedReasons(text string) map[string]int {
	out := map[string]int{}
	add := func(s string, line int) {
		if camel(s) {
			if _, ok := out[s]; !ok {
				out[s] = line
			}
		}
	}
	lines := strings.Split(text, "\n")
	inReasonTable := false
	for i, line := range lines {
		for _, re := range []*regexp.Regexp{reasonAfter, reasonBefore, reasonKubect} {
			for _, m := range re.FindAllStringSubmatch(line, -1) {
				add(m[1], i+1)
			}
		}
		switch {
		case strings.HasPrefix(line, "| reason |"):
			inReasonTable = true
		case !strings.HasPrefix(line, "|"):
			inReasonTable = false
		case inReasonTable:
			if m := reasonTable.FindStringSubmatch(line); m != nil {
				add(m[1], i+1)
			}
		}
	}
	return out
}

// allFlags are the flags the repository's commands define: every
// flag.FlagSet definition in pkg/, cmd/, hack/ and test/ (the agent's,
// the CLI's, the benchmark's, the lab's).
func allFlags(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, f := range agentFlags(t) {
		out[f.name] = true
	}
	for _, top := range []string{"pkg", "cmd", "hack", "test"} {
		for _, files := range goFiles(t, top) {
			consts := stringConsts(files)
			for _, f := range files {
				ast.Inspect(f, func(n ast.Node) bool {
					c, ok := n.(*ast.CallExpr)
					if !ok {
						return true
					}
					s, ok := c.Fun.(*ast.SelectorExpr)
					if !ok || !slices.Contains(flagDefiners, s.Sel.Name) {
						return true
					}
					i := 0
					if strings.HasSuffix(s.Sel.Name, "Var") {
						i = 1
					}
					if len(c.Args) > i+1 {
						if name, ok := stringValue(c.Args[i], consts); ok {
							out[name] = true
						}
					}
					return true
				})
			}
		}
	}
	// The scripts' own options (hack/bench/run.sh's --baseline): the
	// patterns of their case statements.
	caseFlag := regexp.MustCompile(`(?m)^\s*(?:[^\s()]+\|)*--([a-z0-9][a-z0-9-]*)(?:=\*)?(?:\|[^\s()]+)*\)`)
	for _, top := range []string{"hack", "test"} {
		err := filepath.WalkDir(filepath.Join(repo, top), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".sh") {
				return err
			}
			b, err := os.ReadFile(p)
			for _, m := range caseFlag.FindAllStringSubmatch(string(b), -1) {
				out[m[1]] = true
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// externalFlags are other programs' flags the pages name, each in its
// program's own words (kube-apiserver, kube-controller-manager, kubeadm,
// flanneld, runsc, pasta, slirp4netns, promtool, Go's test tool, tcpdump,
// helm, kubectl).
var externalFlags = []string{
	"service-account-extend-token-expiration", "allocate-node-cidrs", "cluster-cidr", "pod-network-cidr",
	"kube-subnet-mgr", "overlay2", "network", "ignore-cgroups", "gso", "software-gso", "platform",
	"short", "race", "fuzz", "run", "count", "set", "field-selector", "timeout", "kubeconfig", "namespace",
	"previous", "tail", "since", "all-namespaces", "flood", "rand-source", "extended", "runas", "configure",
}

var (
	// A flag named on its own in inline code: `--name` or `--name=value`.
	flagSpan = regexp.MustCompile("\\x60--([a-z0-9][a-z0-9-]*)(?:[= ][^\\x60]*)?\\x60")
	// A metric's name anywhere on a page, queries and output included.
	metricName = regexp.MustCompile(`\bcni_usernet_[a-z0-9_]*[a-z0-9]\b`)
)

// The pages name only Event reasons, metrics and flags that exist: a
// renamed one in the code, or a misspelt one in a page, fails here.
func TestNamesExist(t *testing.T) {
	reasons := eventReasons(t)
	for _, want := range []string{"GSOMode", "InvalidGSOAnnotation", "StackNotRestarted", "NetworkPolicyNotApplied"} {
		if _, ok := reasons[want]; !ok {
			t.Fatalf("the scan of pkg/ did not find the Event reason %s (found %v): is it broken?", want, reasons)
		}
	}
	metrics := exportedMetrics(t)
	flags := allFlags(t)
	for _, want := range []string{"metrics-address", "state-dir", "leg", "baseline"} {
		if !flags[want] {
			t.Fatalf("the scan did not find the flag --%s: is it broken?", want)
		}
	}
	for _, f := range pagesOutsideArchive(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(repo, f)
		text := string(b)
		for r, line := range namedReasons(text) {
			if _, ok := reasons[r]; !ok && !slices.Contains(kubernetesReasons, r) {
				t.Errorf("%s:%d: names the Event reason %s, which neither the plugin nor the agent posts (they post %s)", name, line, r, strings.Join(sortedKeys(reasons), ", "))
			}
		}
		for i, line := range strings.Split(text, "\n") {
			for _, m := range metricName.FindAllString(line, -1) {
				base := m
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(m, suf); ok && metrics[b] != "" {
						base = b
					}
				}
				if metrics[base] == "" {
					t.Errorf("%s:%d: names the metric %s, which the agent does not export", name, i+1, m)
				}
			}
		}
		for i, line := range proseLines(text) {
			for _, m := range flagSpan.FindAllStringSubmatch(line, -1) {
				if !flags[m[1]] && !slices.Contains(externalFlags, m[1]) {
					t.Errorf("%s:%d: names the flag --%s, which no command of the repository defines (nor is it in externalFlags)", name, i+1, m[1])
				}
			}
		}
	}
}

func sortedKeys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestReasonPatterns(t *testing.T) {
	page := "a Warning Event `StackNotRestarted` on the pod\n" +
		"reason `GSOMode`; a `NetworkPolicySkipped` Event\n" +
		"```\n  Warning  BadGSO    1s   cni-usernet  annotation\n```\n" +
		"| reason | type |\n|---|---|\n| `InvalidBusyPollAnnotation` | Warning |\n" +
		"the `Event` call and GSO mode `PodAnnotations`\n"
	got := namedReasons(page)
	var names []string
	for k := range got {
		names = append(names, k)
	}
	slices.Sort(names)
	want := []string{"BadGSO", "GSOMode", "InvalidBusyPollAnnotation", "NetworkPolicySkipped", "StackNotRestarted"}
	if !slices.Equal(names, want) {
		t.Errorf("namedReasons = %v, want %v", names, want)
	}
}
