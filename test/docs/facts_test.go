// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// A fact is one labelled quantity a page may restate: its value has one
// home (BENCHMARKS.md for a measurement, a constant of the code for a
// setting), and every page that gives it must give that value. The
// figures check (TestFiguresFromBenchmarks) asks only that a number be
// somewhere in BENCHMARKS.md; this one asks that it be the number
// BENCHMARKS.md gives for that very quantity.
type fact struct {
	name string
	// home says where the value lives, for the message.
	home string
	// want reads the value(s) from the home: one per capture group of
	// page, in order.
	want func(t *testing.T) []string
	// sentence selects the sentences that speak of the quantity (nil:
	// every one); page finds its value there, one number per group (an
	// empty group: not given).
	sentence *regexp.Regexp
	page     *regexp.Regexp
	// other: a sentence that also matches it speaks of another quantity
	// (another configuration, another binary).
	other *regexp.Regexp
}

// claim is a statement a page must not make, because the code says
// otherwise.
type claim struct {
	name  string
	wrong *regexp.Regexp
	// unless: a sentence that also matches it is not the claim.
	unless *regexp.Regexp
	truth  string
}

func readRepo(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, p))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// from reads a value from a file of the repository with a pattern whose
// groups are the values.
func from(path, pattern string) func(t *testing.T) []string {
	re := regexp.MustCompile(pattern)
	return func(t *testing.T) []string {
		t.Helper()
		m := re.FindStringSubmatch(readRepo(t, path))
		if m == nil {
			t.Fatalf("%s no longer matches %s: the fact's home moved, update facts_test.go", path, re)
		}
		return m[1:]
	}
}

var number = `(\d+(?:\.\d+)?)`

var facts = []fact{
	{
		name:     "an idle stack's RSS (MiB, round 1, the default configuration)",
		home:     "BENCHMARKS.md, the latest full run's table, cni-usernet hardware, idle stack RSS",
		want:     from("BENCHMARKS.md", `(?m)^\| \*\*cni-usernet hardware\*\*.*\| `+number+` / \d+(?:\.\d+)? MiB \|\s*$`),
		sentence: regexp.MustCompile(`(?i)\bidle\b`),
		page:     regexp.MustCompile(`(?i)\b` + number + ` MiB (?:of )?RSS\b|\bRSS,? (?:of )?` + number + ` MiB`),
		other:    regexp.MustCompile(`(?i)multi-call|runsc|pasta|slirp|median|busy poll|software|\boff\b`),
	},
	{
		name:     "pod to pod across nodes, TCP_RR p50 (µs)",
		home:     "BENCHMARKS.md, the latest run's pod-to-pod section (pod to pod across two nodes)",
		want:     from("BENCHMARKS.md", `Pod to pod across two\s+nodes: TCP_RR `+number+` µs`),
		sentence: regexp.MustCompile(`(?i)across (?:two )?nodes|cross-node`),
		page:     regexp.MustCompile(`TCP_RR.*?` + number + ` µs`),
	},
	{
		name:     "pod to pod across nodes, redis SET / GET (× the kernel's pod to pod)",
		home:     "BENCHMARKS.md, the latest run's pod-to-pod section (pod to pod across two nodes)",
		want:     from("BENCHMARKS.md", `across two\s+nodes: TCP_RR \d+ µs direct, redis `+number+`×\s*/\s*`+number+`×`),
		sentence: regexp.MustCompile(`(?i)across (?:two )?nodes|cross-node`),
		page:     regexp.MustCompile(`redis[^.;\d]*` + number + `×(?:\s*/\s*` + number + `×)?`),
	},
	{
		name: "nginx 10 MiB, cni-usernet hardware and runsc (× the kernel)",
		home: "the last full run with runsc (docs/benchmarks/2026-12-03-2344-full-run.md), its table's nginx 10 MiB column",
		want: func(t *testing.T) []string {
			b := readRepo(t, "docs/benchmarks/2026-12-03-2344-full-run.md")
			row := func(label string) string {
				m := regexp.MustCompile(`(?m)^\| ` + regexp.QuoteMeta(label) + `[^|]*\|[^|]*\|[^|]*\|[^|]*\| ` + number + `× \|`).FindStringSubmatch(b)
				if m == nil {
					t.Fatalf("the last full run with runsc has no nginx cell for %q", label)
				}
				return m[1]
			}
			return []string{row("**cni-usernet hardware**"), row("gVisor runsc, host GSO")}
		},
		sentence: regexp.MustCompile(`(?i)nginx.*runsc`),
		page:     regexp.MustCompile(`nginx[^×]*?` + number + `×.*?runsc[^\d]*` + number + `×`),
	},
	{
		name:     "the policy debounce: the longest a change waits for more (ms)",
		home:     "pkg/agent/policyctl/options.go, Options.Debounce's default",
		want:     from("pkg/agent/policyctl/options.go", `o\.Debounce = (\d+) \* time\.Millisecond`),
		sentence: regexp.MustCompile(`(?i)debounc|polic`),
		page:     regexp.MustCompile(`(?i)(?:debounce[^.;\d]*|at most |up to )(\d+) ms\b`),
	},
	{
		name: "the policy debounce's quiet: a lone change's wait (ms)",
		home: "pkg/agent/policyctl/controller.go, a fifth of Options.Debounce",
		want: func(t *testing.T) []string {
			v := from("pkg/agent/policyctl/options.go", `o\.Debounce = (\d+) \* time\.Millisecond`)(t)
			if !strings.Contains(readRepo(t, "pkg/agent/policyctl/controller.go"), "c.o.Debounce / 5") {
				t.Fatalf("pkg/agent/policyctl/controller.go no longer waits a fifth of the debounce: update facts_test.go")
			}
			n, _ := strconv.Atoi(v[0])
			return []string{strconv.Itoa(n / 5)}
		},
		page: regexp.MustCompile(`(\d+) ms (?:of quiet|without another)`),
	},
	{
		name:     "the metrics port",
		home:     "pkg/agent/servemetrics.go, defaultMetricsAddress",
		want:     from("pkg/agent/servemetrics.go", `defaultMetricsAddress = ":(\d+)"`),
		sentence: regexp.MustCompile(`(?i)metrics`),
		page:     regexp.MustCompile(`(?i)(?:port \**|:)(\d{4,5})\b(?:\**)?(?:,? ?/metrics|\b)`),
	},
	{
		name:     "the agent's /healthz port",
		home:     "pkg/agent/health.go, defaultHealthAddress",
		want:     from("pkg/agent/health.go", `defaultHealthAddress = "127\.0\.0\.1:(\d+)"`),
		sentence: regexp.MustCompile(`healthz|liveness`),
		page:     regexp.MustCompile(`(?:127\.0\.0\.1:|port )(\d{4,5})\b`),
	},
}

var claims = []claim{
	{
		name:   "the metrics port declared as a container port",
		wrong:  regexp.MustCompile(`(?i)(?:declares|declared)[^.;]{0,20}\bport\b|metrics port is declared`),
		unless: regexp.MustCompile(`(?i)\bnot\b|capabilit`),
		truth:  "the DaemonSet declares no port (a host-network pod's declared port is a host port, which keeps a new agent off the node while the old one terminates): manifests/cni-usernet.yaml",
	},
	{
		name:  "standalone limited to one L2 segment",
		wrong: regexp.MustCompile(`(?i)standalone[^.;]*(?:one|a single|the same) (?:L2 segment|link)\b[^.;]*(?:needs|only|must)|standalone needs the nodes on one`),
		truth: "standalone routes directly to a node on a subnet of its own and through VXLAN to the others (--encapsulation=auto, pkg/agent/noderoutes)",
	},
	{
		name:   "busy polling opt-in",
		wrong:  regexp.MustCompile(`(?i)busy[- ]poll\w*[^.;]*\b(?:opt-in|opt in|off by default|off unless)`),
		unless: regexp.MustCompile(`(?i)socket redirect`),
		truth:  "busy polling is on by default, governed (busyPoll absent: auto, pkg/api/netconf); \"0s\" or the annotation turns it off",
	},
	{
		name:  "helm upgrade with --reuse-values alone",
		wrong: regexp.MustCompile(`helm upgrade[^.;]*[^-]--reuse-values`),
		truth: "--reset-then-reuse-values keeps the user's values and takes the new chart's defaults for the keys it adds (docs/install.md); --reuse-values alone leaves those keys empty",
	},
}

// factPages are the pages that restate facts: the README, SECURITY.md,
// docs/*.md (not the dated archive, whose files are the records of
// their day) and the chart's README.
func factPages(t *testing.T) []string {
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

var sentenceEnd = regexp.MustCompile(`[.;!?](?:\s+|$)|\n\s*\n|\n\s*[-*] |\|`)

// sentences splits a page's prose (fences and inline code dropped, lines
// joined within a paragraph) into sentences, each with its line.
func sentences(text string) (out []string, lines []int) {
	ls := proseLines(text)
	for i := 0; i < len(ls); {
		j := i + 1
		if strings.TrimSpace(ls[i]) != "" && !strings.HasPrefix(ls[i], "|") {
			for j < len(ls) && strings.TrimSpace(ls[j]) != "" && !strings.HasPrefix(ls[j], "|") && !listItem.MatchString(ls[j]) {
				j++
			}
		}
		para := strings.Join(ls[i:j], " ")
		para = linkText.ReplaceAllString(para, "$1")
		for _, s := range sentenceEnd.Split(para, -1) {
			if strings.TrimSpace(s) != "" {
				out = append(out, s)
				lines = append(lines, i+1)
			}
		}
		i = j
	}
	return out, lines
}

// factFindings lists what text (the page name) restates differently from
// the facts' homes, or claims against the code. wants holds each fact's
// values.
func factFindings(name, text string, wants [][]string) []string {
	var out []string
	ss, lines := sentences(text)
	for k, s := range ss {
		for i, f := range facts {
			if f.sentence != nil && !f.sentence.MatchString(s) || f.other != nil && f.other.MatchString(s) {
				continue
			}
			for _, m := range f.page.FindAllStringSubmatch(s, -1) {
				var got []string
				for _, g := range m[1:] {
					if g != "" {
						got = append(got, g)
					}
				}
				// A pattern with alternatives gives its numbers in
				// different groups: compare in order of appearance.
				want := wants[i]
				for j, g := range got {
					if j < len(want) && !sameNumber(g, want[j]) {
						out = append(out, name+":"+itoa(lines[k])+": "+f.name+": says "+g+", "+f.home+" says "+want[j]+": link the home instead of restating it, or give its value")
					}
				}
			}
		}
		for _, c := range claims {
			if c.wrong.MatchString(s) && (c.unless == nil || !c.unless.MatchString(s)) {
				out = append(out, name+":"+itoa(lines[k])+": "+c.name+": "+quote(strings.TrimSpace(s))+"; the code: "+c.truth)
			}
		}
	}
	return out
}

// sameNumber: a page may round (14.62 → 14.6), not change.
func sameNumber(page, home string) bool {
	return page == home || holds([]string{home}, page)
}

func factWants(t *testing.T) [][]string {
	var wants [][]string
	for _, f := range facts {
		wants = append(wants, f.want(t))
	}
	return wants
}

// Each fact a page restates is the value of its one home: an idle
// stack's RSS, pod to pod across nodes, nginx beside runsc as
// BENCHMARKS.md gives them; the policy debounce, the metrics and health
// ports as the code sets them; and no page claims what the code denies.
func TestFactsAgree(t *testing.T) {
	wants := factWants(t)
	for _, p := range factPages(t) {
		text := readRepo(t, p)
		for _, e := range factFindings(p, text, wants) {
			t.Error(e)
		}
	}
}

// The checker finds each planted contradiction and leaves the true
// statements.
func TestFactsCatchContradictions(t *testing.T) {
	wants := factWants(t)
	rss, xrr, xredis, nginx, deb, quiet, port := wants[0][0], wants[1][0], wants[2], wants[3], wants[4][0], wants[5][0], wants[6][0]
	for _, s := range []string{
		"An idle stack holds 14.2 MiB RSS.",
		"idle pods: RSS 17.9 MiB per stack.",
		"Pod to pod across nodes, TCP_RR 999 µs.",
		"Pod to pod across two nodes: redis 0.91× / 0.28× of the kernel's.",
		"nginx 10 MiB 1.99× against runsc's 1.23×.",
		"the agent debounces policy changes for 17 ms.",
		"after each change (77 ms of quiet) the agent compiles",
		"Every agent serves metrics on the node's port 9999.",
		"The DaemonSet declares the metrics port.",
		"Standalone needs the nodes on one L2 segment.",
		"Busy polling is opt-in.",
		"helm upgrade cni-usernet charts/cni-usernet --reuse-values --set image.tag=v2",
	} {
		if len(factFindings("x.md", s, wants)) == 0 {
			t.Errorf("no finding in %q", s)
		}
	}
	for _, s := range []string{
		"An idle stack holds " + rss + " MiB RSS.",
		"Pod to pod across nodes: TCP_RR " + xrr + " µs, redis " + xredis[0] + "× / " + xredis[1] + "×.",
		"nginx 10 MiB " + nginx[0] + "× against runsc's " + nginx[1] + "×.",
		"the agent debounces policy changes, at most " + deb + " ms.",
		"after each change (" + quiet + " ms of quiet) the agent compiles",
		"Every agent serves metrics on the node's port " + port + ".",
		"The metrics port is not declared as a container port.",
		"Standalone routes through VXLAN across subnets.",
		"Busy polling is on by default.",
		"helm upgrade cni-usernet charts/cni-usernet --reset-then-reuse-values",
		"4.22 MiB PSS per pod over 100 idle pods.",
	} {
		if f := factFindings("x.md", s, wants); len(f) != 0 {
			t.Errorf("false finding in %q: %v", s, f)
		}
	}
}

// Every gVisor patch the build applies (hack/gvisor/patches) is listed in
// NOTICE, which the licence asks to name our modifications, and has its
// section in docs/gvisor-patches.md; neither names a patch the build
// does not apply.
func TestGVisorPatchesListed(t *testing.T) {
	applied, err := filepath.Glob(filepath.Join(repo, "hack/gvisor/patches/*.patch"))
	if err != nil || len(applied) == 0 {
		t.Fatalf("no patches under hack/gvisor/patches (%v)", err)
	}
	have := map[string]bool{}
	for _, p := range applied {
		have[filepath.Base(p)] = true
	}
	named := regexp.MustCompile(`\b\d{4}-[a-z0-9-]+\.patch\b`)
	for _, page := range []string{"NOTICE", "docs/gvisor-patches.md"} {
		text := readRepo(t, page)
		for p := range have {
			if !strings.Contains(text, p) {
				t.Errorf("%s does not name %s, which hack/gvisor/patch.sh applies", page, p)
			}
		}
		for _, p := range named.FindAllString(text, -1) {
			if !have[p] {
				t.Errorf("%s names %s, which hack/gvisor/patches does not have", page, p)
			}
		}
	}
}
