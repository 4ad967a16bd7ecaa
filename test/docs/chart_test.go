package docs

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const (
	chart    = "charts/cni-usernet"
	manifest = "manifests/cni-usernet.yaml"
)

// helmBinary is $HELM, else bin/helm (`make helm`). Without either the
// chart tests skip, unless HELM names a file that is not there: make test
// sets it, so CI never skips them.
func helmBinary(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		if _, err := os.Stat(h); err != nil {
			t.Fatalf("HELM=%s: %v (make helm builds bin/helm)", h, err)
		}
		return h
	}
	h, err := filepath.Abs(filepath.Join(repo, "bin/helm"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(h); err != nil {
		t.Skip("no helm: `make helm` builds bin/helm from hack/helm (make test does)")
	}
	return h
}

// helm runs the helm binary in the repository's root.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Dir = repo
	// A helm of its own: no user's repositories, plugins or cache.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// templateDefaults render what a cluster with the Prometheus Operator
// gets (the ServiceMonitor needs its API, monitoring.coreos.com/v1),
// without `helm test`'s pod (TestChartTestPod checks it; a caller's
// --skip-tests=false keeps it).
var templateDefaults = []string{"--skip-tests", "--api-versions", "monitoring.coreos.com/v1"}

// helmTemplate runs `helm template` with templateDefaults, then args.
func helmTemplate(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return helm(t, append(append([]string{"template"}, templateDefaults...), args...)...)
}

// objects parses a multi-document YAML stream into its objects, keyed by
// kind/namespace/name, each as the JSON the API server would get.
func objects(t *testing.T, stream string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(stream, -1) {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatalf("parsing YAML: %v\n%s", err, doc)
		}
		var o map[string]any
		if err := json.Unmarshal(j, &o); err != nil {
			t.Fatal(err)
		}
		if o == nil {
			continue // comments only
		}
		meta, _ := o["metadata"].(map[string]any)
		ns, _ := meta["namespace"].(string)
		key := fmt.Sprintf("%v/%s/%v", o["kind"], ns, meta["name"])
		if _, dup := out[key]; dup {
			t.Fatalf("%s twice in one stream", key)
		}
		out[key] = o
	}
	return out
}

// diff lists the paths where a and b differ.
func diff(path string, a, b any) []string {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok {
			break
		}
		keys := map[string]bool{}
		for k := range a {
			keys[k] = true
		}
		for k := range b {
			keys[k] = true
		}
		var out []string
		for k := range keys {
			out = append(out, diff(path+"."+k, a[k], b[k])...)
		}
		sort.Strings(out)
		return out
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			break
		}
		var out []string
		for i := range a {
			out = append(out, diff(fmt.Sprintf("%s[%d]", path, i), a[i], b[i])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return []string{fmt.Sprintf("%s: chart %s, manifest %s", path, ja, jb)}
}

// releaseLabels name the Helm release and the chart's version: the chart
// puts them on every object (TestChartLabels), the one-file manifest,
// which is no release, does not.
var releaseLabels = []string{"app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart"}

// withoutReleaseLabels drops releaseLabels from an object's labels and from
// its pod template's.
func withoutReleaseLabels(o map[string]any) {
	for _, path := range [][]string{{"metadata", "labels"}, {"spec", "template", "metadata", "labels"}} {
		m := o
		for _, k := range path {
			m, _ = m[k].(map[string]any)
		}
		for _, l := range releaseLabels {
			delete(m, l)
		}
	}
}

// compare fails unless the two streams hold the same objects, but for the
// release's labels.
func compare(t *testing.T, chartOut string, exp map[string]map[string]any) {
	t.Helper()
	got := objects(t, chartOut)
	for _, o := range got {
		withoutReleaseLabels(o)
	}
	for k, o := range exp {
		g, ok := got[k]
		if !ok {
			t.Errorf("the chart renders no %s (the manifest has it): add it to %s/templates", k, chart)
			continue
		}
		for _, d := range diff(k, g, o) {
			t.Errorf("%s", d)
		}
	}
	for k := range got {
		if _, ok := exp[k]; !ok {
			t.Errorf("the chart renders %s, which the manifest does not have", k)
		}
	}
}

func readManifest(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, manifest))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// With its default values the chart renders exactly the objects of the
// one-file manifest, and with mode=chain those of the README's chained
// install (the manifest with --mode=chain) less the rule on nodes, which
// only a standalone agent uses (TestChartRBAC): a change to one without the
// other fails here. The release's labels aside (releaseLabels).
func TestChartMatchesManifest(t *testing.T) {
	t.Run("Defaults", func(t *testing.T) {
		out, err := helmTemplate(t, "cni-usernet", chart, "--namespace", "kube-system")
		if err != nil {
			t.Fatalf("helm template: %v\n%s", err, out)
		}
		compare(t, out, objects(t, readManifest(t)))
	})
	t.Run("Chain", func(t *testing.T) {
		out, err := helmTemplate(t, "cni-usernet", chart, "--namespace", "kube-system", "--set", "mode=chain")
		if err != nil {
			t.Fatalf("helm template --set mode=chain: %v\n%s", err, out)
		}
		exp := objects(t, strings.ReplaceAll(readManifest(t), "--mode=standalone", "--mode=chain"))
		role := exp["ClusterRole//cni-usernet"]
		rules, _ := role["rules"].([]any)
		var kept []any
		for _, r := range rules {
			if res, _ := r.(map[string]any)["resources"].([]any); slices.Contains(res, any("nodes")) {
				continue
			}
			kept = append(kept, r)
		}
		if len(kept) != len(rules)-1 {
			t.Fatalf("the manifest's ClusterRole has %d rules on nodes, want 1", len(rules)-len(kept))
		}
		role["rules"] = kept
		compare(t, out, exp)
	})
}

// helm lint --strict finds nothing, with the defaults and with every
// value changed.
func TestChartLint(t *testing.T) {
	for _, set := range []string{"", "mode=chain,mtu=1450,gso=software,networkPolicy.enabled=false,metrics.port=9500,metrics.address=10.0.0.1,metrics.serviceMonitor.enabled=true,image.repository=registry.example/cni-usernet,image.tag=v1,image.pullPolicy=Always,fullnameOverride=usernet,priorityClassName=,imagePullSecrets[0].name=regcred,podAnnotations.a=b,podLabels.c=d",
		"nodeRoutes.encapsulation=vxlan,nodeRoutes.vxlanPort=8472,podSubnets={10.244.0.0/24},stack.cgroup=node,stack.busyPoll=0s,stack.threads=2,extraArgs={--reconcile-interval=1m},extraEnv[0].name=A,extraEnv[0].value=b,serviceAccount.create=false,serviceAccount.name=agent,rbac.create=false,clusterNetworkPolicy.enabled=false,updateStrategy.type=OnDelete,livenessProbe.enabled=false,nodeSelector=null"} {
		args := []string{"lint", "--strict", chart}
		if set != "" {
			args = append(args, "--set", set)
		}
		if out, err := helm(t, args...); err != nil {
			t.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// agentArgs renders the chart with values set and returns the agent's
// arguments and its DaemonSet.
func agentArgs(t *testing.T, set string) ([]string, map[string]any) {
	t.Helper()
	out, err := helmTemplate(t, "cni-usernet", chart, "--namespace", "kube-system", "--set", set)
	if err != nil {
		t.Fatalf("helm template --set %s: %v\n%s", set, err, out)
	}
	var ds map[string]any
	for k, o := range objects(t, out) {
		if strings.HasPrefix(k, "DaemonSet/") {
			if ds != nil {
				t.Fatalf("--set %s: two DaemonSets rendered", set)
			}
			ds = o
		}
	}
	if ds == nil {
		t.Fatalf("--set %s: no DaemonSet rendered", set)
	}
	b, _ := json.Marshal(ds)
	var d struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Args  []string `json:"args"`
						Image string   `json:"image"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	c := d.Spec.Template.Spec.Containers[0]
	return append(c.Args, "image="+c.Image), ds
}

// Each value reaches the agent as the flag docs/configuration.md names.
func TestChartValues(t *testing.T) {
	for set, want := range map[string][]string{
		"mode=chain":                                      {"--mode=chain"},
		"mtu=1450":                                        {"--mtu=1450"},
		"gso=software":                                    {"--gso=software"},
		"networkPolicy.enabled=false":                     {"--network-policy=false"},
		"metrics.port=9500":                               {"--metrics-address=:9500"},
		"metrics.enabled=false":                           {"--metrics-address="},
		"metrics.address=127.0.0.1":                       {"--metrics-address=127.0.0.1:9437"},
		"metrics.address=fd00::1":                         {"--metrics-address=[fd00::1]:9437"},
		"portMap=false,bandwidth=false":                   {"--port-map=false", "--bandwidth=false"},
		"image.repository=r/c,image.tag=v1":               {"image=r/c:v1"},
		"image.repository=r/c":                            {"image=r/c:v0.2.0"}, // the chart's appVersion
		"image.digest=sha256:" + strings.Repeat("ab", 32): {"image=ghcr.io/cni-usernet/cni-usernet@sha256:" + strings.Repeat("ab", 32)},
		"fullnameOverride=usernet":                        {"--daemonset=usernet"},
	} {
		args, _ := agentArgs(t, set)
		for _, w := range want {
			if !slices.Contains(args, w) {
				t.Errorf("--set %s: agent args %q, want %q among them", set, args, w)
			}
		}
	}
	// At the default name the agent's own default is right: not passed.
	if args, _ := agentArgs(t, "mode=standalone"); slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--daemonset") }) {
		t.Errorf("default name: agent args %q pass --daemonset", args)
	}
}
