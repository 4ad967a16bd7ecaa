package docs

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func readJSONish(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, path))
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var m map[string]any
	if err := json.Unmarshal(j, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// valueKeys are values.yaml's keys as the chart's README documents them:
// dotted paths down to the values whose schema has no properties of its
// own (a Kubernetes type such as resources, or a scalar), with their
// defaults. Every key must be in values.schema.json and every property
// there in values.yaml.
func valueKeys(t *testing.T) map[string]any {
	t.Helper()
	values := readJSONish(t, chart+"/values.yaml")
	schema := readJSONish(t, chart+"/values.schema.json")
	keys := map[string]any{}
	var walk func(prefix string, v map[string]any, s map[string]any)
	walk = func(prefix string, v map[string]any, s map[string]any) {
		props, _ := s["properties"].(map[string]any)
		for k, x := range v {
			p, ok := props[k].(map[string]any)
			if !ok {
				t.Errorf("values.yaml has %s%s, values.schema.json does not (additionalProperties: false refuses it)", prefix, k)
				continue
			}
			if _, nested := p["properties"]; nested {
				if m, ok := x.(map[string]any); ok {
					walk(prefix+k+".", m, p)
					continue
				}
			}
			keys[prefix+k] = x
		}
		for k := range props {
			if _, ok := v[k]; !ok && !(prefix == "" && k == "global") {
				t.Errorf("values.schema.json has %s%s, values.yaml does not: give it a default there", prefix, k)
			}
		}
	}
	walk("", values, schema)
	return keys
}

// The chart's README has a row for every key of values.yaml, with its
// default as values.yaml has it, and no row for a key that is not there.
func TestChartReadmeValues(t *testing.T) {
	keys := valueKeys(t)
	b, err := os.ReadFile(filepath.Join(repo, chart, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `([^`]+)` \\|")
	rows := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		key := m[1]
		// Cells split at | not escaped as \|.
		cells := strings.Split(strings.ReplaceAll(line, `\|`, "\x00"), "|")
		if len(cells) != 6 {
			t.Errorf("README row %q: %d cells, want key | type | default | description", key, len(cells)-2)
			continue
		}
		if rows[key] {
			t.Errorf("README: two rows for %s", key)
		}
		rows[key] = true
		def, ok := keys[key]
		if !ok {
			t.Errorf("README has a row for %s, which values.yaml does not have", key)
			continue
		}
		cell := strings.TrimSpace(cells[3])
		var got any
		if !strings.HasPrefix(cell, "`") || !strings.HasSuffix(cell, "`") || json.Unmarshal([]byte(strings.Trim(cell, "`")), &got) != nil {
			t.Errorf("README row %s: default %s is not `JSON`", key, cell)
			continue
		}
		if !reflect.DeepEqual(got, def) {
			want, _ := json.Marshal(def)
			t.Errorf("README row %s: default %s, values.yaml has `%s`", key, cell, want)
		}
	}
	var missing []string
	for k := range keys {
		if !rows[k] {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	for _, k := range missing {
		t.Errorf("values.yaml has %s, the chart's README has no row for it", k)
	}
}

// values.schema.json takes every valid value and refuses, at helm
// template (so at install and upgrade too), each bad one, naming the key
// and, for a choice, what it accepts.
func TestChartSchema(t *testing.T) {
	var good []string
	for _, m := range []string{"standalone", "chain"} {
		good = append(good, "mode="+m)
	}
	for _, g := range []string{"auto", "hardware", "software", "off"} {
		good = append(good, "gso="+g)
	}
	for _, p := range []string{"Always", "IfNotPresent", "Never"} {
		good = append(good, "image.pullPolicy="+p)
	}
	for _, b := range []string{"networkPolicy.enabled", "portMap", "bandwidth", "metrics.enabled", "metrics.serviceMonitor.enabled",
		"clusterNetworkPolicy.enabled", "serviceAccount.create", "rbac.create", "livenessProbe.enabled"} {
		good = append(good, b+"=true", b+"=false")
	}
	good = append(good, "metrics.port=1", "metrics.port=65535", "mtu=0", "mtu=576", "mtu=9000", "metrics.address=192.0.2.1", "metrics.address=2001:db8::1",
		"resources.limits.cpu=2,resources.limits.memory=1Gi,resources.requests.cpu=0.5", "terminationGracePeriodSeconds=0",
		"metrics.serviceMonitor.interval=1m30s", "tolerations[0].operator=Equal,tolerations[0].key=k,tolerations[0].value=v,tolerations[0].effect=NoSchedule",
		"nodeRoutes.enabled=true", "nodeRoutes.enabled=auto", "nodeRoutes.encapsulation=never", "nodeRoutes.vxlanVNI=16777215",
		"podSubnets={10.244.0.0/16,fd00::/56}", "stack.busyPoll=200us", "stack.busyPoll=auto", "stack.busyPoll=0s", "stack.cgroup=pod", "stack.threads=4",
		"stack.socketRedirect=both", "extraArgs={--reconcile-interval=1m}", "extraEnv[0].name=GODEBUG,extraEnv[0].value=x",
		"serviceAccount.name=net-agent", "updateStrategy.type=OnDelete", "updateStrategy.rollingUpdate.maxUnavailable=25%")
	for _, set := range good {
		if out, err := helmTemplate(t, "cni-usernet", chart, "--set", set); err != nil {
			t.Errorf("--set %s: refused: %v\n%s", set, err, out)
		}
	}
	for set, want := range map[string]string{
		"mode=bogus":                                    "'standalone', 'chain'",
		"mode=Standalone":                               "'standalone', 'chain'",
		"gso=fast":                                      "'auto', 'hardware', 'software', 'off'",
		"image.pullPolicy=Sometimes":                    "'Always', 'IfNotPresent', 'Never'",
		"metrics.port=0":                                "/metrics/port",
		"metrics.port=65536":                            "/metrics/port",
		"metrics.port=http":                             "/metrics/port",
		"mtu=575":                                       "/mtu",
		"mtu=65536":                                     "/mtu",
		"networkPolicy.enabled=yes":                     "/networkPolicy/enabled",
		"portMap=1":                                     "/portMap",
		"metrics.enabled=on":                            "/metrics/enabled",
		"metrics.address=node1":                         "/metrics/address",
		"resources.requests.cpu=lots":                   "/resources/requests/cpu",
		"resources.request.cpu=1":                       "request",
		"tolerations[0].operator=Maybe":                 "/tolerations/0/operator",
		"image.digest=latest":                           "/image/digest",
		"mdoe=chain":                                    "mdoe",
		"metrics.serviceMonitor.interval=often":         "/metrics/serviceMonitor/interval",
		"terminationGracePeriodSeconds=-1":              "/terminationGracePeriodSeconds",
		"imagePullSecrets[0].secret=regcred":            "/imagePullSecrets/0",
		"affinity.nodeAffinitty.x=y":                    "nodeAffinitty",
		"podAnnotations.a=1":                            "/podAnnotations/a",
		"metrics.serviceMonitor.labels.release=123":     "/metrics/serviceMonitor/labels/release",
		"extraArgs={-v}":                                "/extraArgs/0",
		"extraArgs[0]=reconcile":                        "/extraArgs/0",
		"extraEnv[0].value=x":                           "name",
		"extraEnv[0].name=A,extraEnv[0].valueForm=x":    "valueForm",
		"nodeRoutes.encapsulation=ipip":                 "'auto', 'vxlan', 'never'",
		"nodeRoutes.enabled=maybe":                      "/nodeRoutes/enabled",
		"nodeRoutes.vxlanPort=0":                        "/nodeRoutes/vxlanPort",
		"nodeRoutes.vxlanVNI=16777216":                  "/nodeRoutes/vxlanVNI",
		"podSubnets={10.244.0.0}":                       "/podSubnets/0",
		"stack.cgroup=kubepods":                         "/stack/cgroup",
		"stack.busyPoll=1s":                             "/stack/busyPoll",
		"stack.threads=-1":                              "/stack/threads",
		"stack.socketRedirect=yes":                      "/stack/socketRedirect",
		"stack.threds=2":                                "threds",
		"serviceAccount.create=yes":                     "/serviceAccount/create",
		"serviceAccount.name=Net_Agent":                 "/serviceAccount/name",
		"rbac.create=1":                                 "/rbac/create",
		"clusterNetworkPolicy.enabled=on":               "/clusterNetworkPolicy/enabled",
		"updateStrategy.type=Recreate":                  "'RollingUpdate', 'OnDelete'",
		"updateStrategy.rollingUpdate.maxUnavailable=0": "/updateStrategy/rollingUpdate/maxUnavailable",
		"livenessProbe.port=70000":                      "/livenessProbe/port",
		"livenessProbe.periodSeconds=0":                 "/livenessProbe/periodSeconds",
	} {
		out, err := helmTemplate(t, "cni-usernet", chart, "--set", set)
		if err == nil || !strings.Contains(out, "schema") || !strings.Contains(out, want) {
			t.Errorf("--set %s: want a schema failure naming %q, got %v\n%s", set, want, err, out)
		}
	}
}

// render renders the chart as release name with values set.
func render(t *testing.T, name string, set ...string) map[string]map[string]any {
	t.Helper()
	args := []string{name, chart, "--namespace", "net"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helmTemplate(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return objects(t, out)
}

func get(o any, path ...string) any {
	for _, k := range path {
		m, _ := o.(map[string]any)
		o = m[k]
	}
	return o
}

// Object names follow the release (release name, nameOverride,
// fullnameOverride) and every reference between the objects follows them;
// every object carries Kubernetes' recommended labels.
func TestChartNames(t *testing.T) {
	for _, c := range []struct {
		release, set, name, app string
	}{
		{"cni-usernet", "", "cni-usernet", "cni-usernet"},
		{"prod-cni-usernet", "", "prod-cni-usernet", "cni-usernet"},
		{"net", "", "net-cni-usernet", "cni-usernet"},
		{"net", "nameOverride=usernet", "net-usernet", "usernet"},
		{"net", "fullnameOverride=cni", "cni", "cni-usernet"},
	} {
		set := []string{"metrics.serviceMonitor.enabled=true"}
		if c.set != "" {
			set = append(set, c.set)
		}
		objs := render(t, c.release, set...)
		meta := readJSONish(t, chart+"/Chart.yaml")
		var kinds []string
		for k, o := range objs {
			kinds = append(kinds, k[:strings.Index(k, "/")])
			wantName := c.name
			if k[:strings.Index(k, "/")] == "Service" {
				wantName += "-metrics"
			}
			if n := get(o, "metadata", "name"); n != wantName {
				t.Errorf("%s %s: %s named %v, want %s", c.release, c.set, k, n, wantName)
			}
			labels, _ := get(o, "metadata", "labels").(map[string]any)
			for l, v := range map[string]string{
				"app.kubernetes.io/name": c.app, "app.kubernetes.io/instance": c.release, "app.kubernetes.io/version": meta["appVersion"].(string),
				"app.kubernetes.io/component": "agent", "app.kubernetes.io/part-of": "cni-usernet",
				"app.kubernetes.io/managed-by": "Helm", "helm.sh/chart": "cni-usernet-" + meta["version"].(string),
			} {
				if labels[l] != v {
					t.Errorf("%s %s: %s label %s=%v, want %s", c.release, c.set, k, l, labels[l], v)
				}
			}
		}
		sort.Strings(kinds)
		if want := []string{"ClusterRole", "ClusterRoleBinding", "DaemonSet", "Service", "ServiceAccount", "ServiceMonitor"}; !slices.Equal(kinds, want) {
			t.Fatalf("%s %s: rendered %v, want %v", c.release, c.set, kinds, want)
		}
		ds := objs["DaemonSet/net/"+c.name]
		pod, _ := get(ds, "spec", "template", "metadata", "labels").(map[string]any)
		selects := func(what string, sel any) {
			m, _ := sel.(map[string]any)
			if len(m) == 0 {
				t.Errorf("%s %s: %s selects nothing", c.release, c.set, what)
			}
			for k, v := range m {
				if pod[k] != v {
					t.Errorf("%s %s: %s selects %s=%v, the agent's pods have %v", c.release, c.set, what, k, v, pod[k])
				}
			}
		}
		selects("the DaemonSet", get(ds, "spec", "selector", "matchLabels"))
		selects("the metrics Service", get(objs["Service/net/"+c.name+"-metrics"], "spec", "selector"))
		svcLabels, _ := get(objs["Service/net/"+c.name+"-metrics"], "metadata", "labels").(map[string]any)
		for k, v := range get(objs["ServiceMonitor/net/"+c.name], "spec", "selector", "matchLabels").(map[string]any) {
			if svcLabels[k] != v {
				t.Errorf("%s %s: the ServiceMonitor selects %s=%v, the Service has %v", c.release, c.set, k, v, svcLabels[k])
			}
		}
		if sa := get(ds, "spec", "template", "spec", "serviceAccountName"); sa != c.name {
			t.Errorf("%s %s: the DaemonSet runs as %v, want %s", c.release, c.set, sa, c.name)
		}
		crb := objs["ClusterRoleBinding//"+c.name]
		if r := get(crb, "roleRef", "name"); r != c.name {
			t.Errorf("%s %s: the binding refers to ClusterRole %v", c.release, c.set, r)
		}
		if s := get(crb, "subjects").([]any)[0]; get(s, "name") != c.name || get(s, "namespace") != "net" {
			t.Errorf("%s %s: the binding's subject is %v", c.release, c.set, s)
		}
		for _, r := range get(objs["ClusterRole//"+c.name], "rules").([]any) {
			if slices.Contains(get(r, "resources").([]any), any("daemonsets")) {
				if n := get(r, "resourceNames").([]any); len(n) != 1 || n[0] != c.name {
					t.Errorf("%s %s: the agent may get DaemonSets %v, its own is %s", c.release, c.set, n, c.name)
				}
			}
		}
		args := fmt.Sprint(get(ds, "spec", "template", "spec", "containers").([]any)[0].(map[string]any)["args"])
		if wantArg := "--daemonset=" + c.name; c.name != "cni-usernet" && !strings.Contains(args, wantArg) {
			t.Errorf("%s %s: agent args %s, want %s", c.release, c.set, args, wantArg)
		}
	}
}

// The ClusterRole grants what the agent and the plugin call in the mode
// and with the features the values turn on, nothing else (docs/kube.md;
// pkg/api/kube's calls: pods get, events create, nodes get and list in
// standalone mode, the NetworkPolicy reflectors' list and watch, the
// ClusterNetworkPolicies' and the patch of their status condition, the
// agent's own DaemonSet get).
func TestChartRBAC(t *testing.T) {
	always := []string{"/pods:get", "/events:create", "apps/daemonsets:get"}
	standalone := []string{"/nodes:get", "/nodes:list"}
	var policy []string
	for _, r := range []string{"networking.k8s.io/networkpolicies", "/pods", "/namespaces", "/services", "discovery.k8s.io/endpointslices"} {
		policy = append(policy, r+":list", r+":watch")
	}
	cnp := []string{"policy.networking.k8s.io/clusternetworkpolicies:get", "policy.networking.k8s.io/clusternetworkpolicies:list", "policy.networking.k8s.io/clusternetworkpolicies:watch",
		"policy.networking.k8s.io/clusternetworkpolicies/status:patch"}
	for _, mode := range []string{"standalone", "chain"} {
		for _, pol := range []bool{true, false} {
			for _, cluster := range []bool{true, false} {
				want := slices.Clone(always)
				if mode == "standalone" {
					want = append(want, standalone...)
				}
				if pol {
					want = append(want, policy...)
				}
				// ClusterNetworkPolicy is compiled with NetworkPolicy:
				// without it, neither the rule nor the flag's true.
				if pol && cluster {
					want = append(want, cnp...)
				}
				sort.Strings(want)
				set := []string{"mode=" + mode, fmt.Sprintf("networkPolicy.enabled=%t", pol), fmt.Sprintf("clusterNetworkPolicy.enabled=%t", cluster)}
				objs := render(t, "cni-usernet", set...)
				var got []string
				for _, r := range get(objs["ClusterRole//cni-usernet"], "rules").([]any) {
					for _, g := range get(r, "apiGroups").([]any) {
						for _, res := range get(r, "resources").([]any) {
							for _, v := range get(r, "verbs").([]any) {
								got = append(got, fmt.Sprintf("%s/%s:%s", g, res, v))
							}
						}
					}
				}
				sort.Strings(got)
				if !slices.Equal(got, want) {
					t.Errorf("%v: grants\n  %v\nwant\n  %v", set, got, want)
				}
				args := fmt.Sprint(get(objs["DaemonSet/net/cni-usernet"], "spec", "template", "spec", "containers").([]any)[0].(map[string]any)["args"])
				if flag := fmt.Sprintf("--cluster-network-policy=%t", pol && cluster); !strings.Contains(args, flag) {
					t.Errorf("%v: agent args %s, want %s", set, args, flag)
				}
			}
		}
	}
}

// NOTES.txt says what was installed (mode, GSO default, policy), how to
// check it and how to capture. helm template does not render NOTES.txt:
// a copy of the chart renders it as a ConfigMap.
func TestChartNotes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cni-usernet")
	if err := os.CopyFS(dir, os.DirFS(filepath.Join(repo, chart))); err != nil {
		t.Fatal(err)
	}
	notes, err := os.ReadFile(filepath.Join(dir, "templates/NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, "templates/NOTES.txt"))
	if err := os.WriteFile(filepath.Join(dir, "templates/_notes.tpl"), []byte(`{{- define "test.notes" -}}`+string(notes)+`{{- end }}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "templates/notes.yaml"), []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n{{ include \"test.notes\" . | indent 4 }}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for set, want := range map[string][]string{
		"mode=standalone": {"mode           standalone", "default GSO    auto", "NetworkPolicy  enforced", "http://<node>:9437/metrics",
			"kubectl -n net rollout status ds/cni-usernet", "exec $AGENT -- /cni-usernet status", "docs/capture.md", "/cni-usernet capture"},
		"mode=chain,gso=software,networkPolicy.enabled=false,metrics.enabled=false,fullnameOverride=un": {"mode           chain",
			"default GSO    software", "NetworkPolicy  off", "metrics        off", "rollout status ds/un"},
	} {
		out, err := helmTemplate(t, "cni-usernet", dir, "--namespace", "net", "--set", set, "--show-only", "templates/notes.yaml")
		if err != nil {
			t.Fatalf("--set %s: %v\n%s", set, err, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("--set %s: NOTES.txt does not say %q:\n%s", set, w, out)
			}
		}
	}
	// A ServiceMonitor asked for where the cluster serves no API for it:
	// the notes say it was left out.
	const missing = "serves no monitoring.coreos.com/v1"
	for _, api := range []bool{false, true} {
		args := []string{"template", "cni-usernet", dir, "--namespace", "net", "--set", "metrics.serviceMonitor.enabled=true", "--show-only", "templates/notes.yaml"}
		if api {
			args = append(args, "--api-versions", "monitoring.coreos.com/v1")
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		if strings.Contains(out, missing) == api {
			t.Errorf("ServiceMonitor API served %v: NOTES.txt says %q: %v\n%s", api, missing, !api, out)
		}
	}
}

// podLabels and podAnnotations add to the agent's pods; a podLabel cannot
// take the selector's label away (the DaemonSet would select no pod), a
// podAnnotation can change a prometheus.io one.
func TestChartPodMetadata(t *testing.T) {
	ds := render(t, "cni-usernet", `podLabels.app\.kubernetes\.io/name=other,podLabels.team=net`,
		`podAnnotations.prometheus\.io/path=/m,podAnnotations.example\.com/a=b`)["DaemonSet/net/cni-usernet"]
	labels := get(ds, "spec", "template", "metadata", "labels").(map[string]any)
	ann := get(ds, "spec", "template", "metadata", "annotations").(map[string]any)
	if labels["app.kubernetes.io/name"] != "cni-usernet" || labels["team"] != "net" {
		t.Errorf("pod labels %v: want the chart's name label and team=net", labels)
	}
	if ann["prometheus.io/path"] != "/m" || ann["example.com/a"] != "b" || ann["prometheus.io/scrape"] != "true" {
		t.Errorf("pod annotations %v: want podAnnotations over the prometheus.io ones", ann)
	}
}
